"""bilm-tf's and TF-Hub's variable names -> the datasets of bilm-tf's ``weights.hdf5``, and the
architecture that the tensors' shapes tell.

A bilm-tf training checkpoint (``bilm/training.py``: ``LanguageModel`` in scope ``lm``, saved by
``tf.train.Saver(tf.global_variables())``)::

    lm/char_embed                                          [261, D]
    lm/CNN/W_cnn_i, lm/CNN/b_cnn_i                         [1, w_i, D, n_i], [n_i]
    lm/CNN_high_k/{W_carry, b_carry, W_transform, b_transform}
    lm/CNN_proj/{W_proj, b_proj}                           [F, P], [P]
    lm/RNN_d/rnn/multi_rnn_cell/cell_l/lstm_cell/{kernel, bias, projection/kernel}
                                                           [2P, 4C], [4C], [C, P]
    lm/softmax/{W, b}                                      [V, P], [V]
    <each of the above>/Adagrad, global_step, train_perplexity   (training state: ignored)

``dump_weights`` renames them as this module does (``rnn/multi_rnn_cell/cell_l/lstm_cell/kernel``
-> ``RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0``, ``bias`` -> ``B``, ``projection/kernel`` -> ``W_P_0``)
and leaves the softmax out. One-layer runs (``lm/RNN_d/rnn/lstm_cell/...``, no MultiRNNCell) are
written as ``Cell0``, the name allennlp and elmo-fast read; TensorFlow < 1.2's names
(``.../LSTMCell/W_0``) are read as they are.

A TF-Hub ``elmo`` module holds bilm-tf's inference graph (``bilm/model.py``, scope ``bilm``;
``char_embed`` [262, D] with its zero padding row first), under the names TF-Hub logs as
``module/bilm/...`` once loaded::

    bilm/char_embed, bilm/CNN/..., bilm/CNN_high_k/..., bilm/CNN_proj/...
    bilm/RNN_d/RNN/MultiRNNCell/Cell{l}/rnn/lstm_cell/{kernel, bias, projection/kernel}
    aggregation/weights [L + 1], aggregation/scaling []    (the "elmo" output's scalar mix)
    bilm/Variable, bilm/Variable_1, ...                    (saved LSTM states: ignored)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelFileError
from ..formats.bilm_tf import FILE_CHAR_ROWS, ElmoOptions, expected_datasets, lstm_dataset
from ..formats.tf_checkpoint import TensorBundle

_LSTM_NAMES = {"kernel": "W_0", "bias": "B", "projection/kernel": "W_P_0", "W_0": "W_0", "B": "B", "W_P_0": "W_P_0"}
_LSTM = [
    # TensorFlow >= 1.2 (bilm-tf's training graph)
    re.compile(r"^RNN_(?P<d>\d+)/rnn/multi_rnn_cell/cell_(?P<l>\d+)/lstm_cell/(?P<w>kernel|bias|projection/kernel)$"),
    re.compile(r"^RNN_(?P<d>\d+)/rnn/lstm_cell/(?P<w>kernel|bias|projection/kernel)$"),  # one layer
    # bilm-tf's inference graph (TF-Hub), and TensorFlow < 1.2's names
    re.compile(r"^RNN_(?P<d>\d+)/RNN/MultiRNNCell/Cell(?P<l>\d+)/rnn/lstm_cell/(?P<w>kernel|bias|projection/kernel)$"),
    re.compile(r"^RNN_(?P<d>\d+)/RNN/MultiRNNCell/Cell(?P<l>\d+)/LSTMCell/(?P<w>W_0|B|W_P_0)$"),
]
_PLAIN = [
    re.compile(p)
    for p in (
        r"^char_embed$",
        r"^CNN/[Wb]_cnn_\d+$",
        r"^CNN_high_\d+/(W_carry|b_carry|W_transform|b_transform)$",
        r"^CNN_proj/(W_proj|b_proj)$",
    )
]
#: training state a bilm-tf checkpoint holds beside the weights
_TRAINING_STATE = {"global_step", "train_perplexity"}
_HUB_STATE = re.compile(r"^bilm/Variable(_\d+)?$")


@dataclass
class Converted:
    """What a checkpoint holds, in bilm-tf's layout."""

    options: ElmoOptions
    datasets: dict[str, np.ndarray]  # weights.hdf5, float32, TensorFlow shapes
    softmax: tuple[np.ndarray, np.ndarray] | None = None  # softmax/W [V, P], softmax/b [V]
    scalar_mix: tuple[list[float], float] | None = None  # TF-Hub's aggregation weights and scaling
    sources: dict[str, str] = field(default_factory=dict)  # setting -> where its value came from
    ignored: list[str] = field(default_factory=list)  # training state left out


def _dataset_name(body: str) -> str | None:
    """bilm-tf's dataset name for a variable name under its root (``lm/`` or ``bilm/``)."""
    if any(p.match(body) for p in _PLAIN):
        return body
    for pattern in _LSTM:
        m = pattern.match(body)
        if m:
            layer = int(m.groupdict().get("l") or 0)
            return lstm_dataset(int(m.group("d")), layer, _LSTM_NAMES[m.group("w")])
    return None


def _root(bundle: TensorBundle) -> str:
    for root in ("lm/", "bilm/", "module/bilm/"):
        if root + "char_embed" in bundle:
            return root
    names = list(bundle.entries)
    if "lm/embedding" in bundle:
        raise ModelFileError(
            f"{bundle.index_path}: a word-input biLM (lm/embedding, no lm/char_embed); ELMo's "
            f"converters need a character-input one (bilm-tf's options with 'char_cnn')"
        )
    shown = ", ".join(repr(n) for n in names[:4]) + (f", ... ({len(names)} tensors)" if len(names) > 4 else "")
    raise ModelFileError(
        f"{bundle.index_path}: holds no ELMo biLM: expected 'lm/char_embed' (a bilm-tf training "
        f"checkpoint) or 'bilm/char_embed' (a TF-Hub elmo module), found {shown or 'no tensors'}"
    )


def map_names(bundle: TensorBundle) -> tuple[str, dict[str, str], dict[str, str], list[str]]:
    """(root, dataset -> variable, extra -> variable (softmax, aggregation), ignored variables);
    unknown variables are an error naming them."""
    root = _root(bundle)
    outer = root[: -len("bilm/")] if root.endswith("bilm/") else ""  # "module/" or ""
    datasets: dict[str, str] = {}
    extra: dict[str, str] = {}
    ignored: list[str] = []
    unknown: list[str] = []
    for name in bundle.entries:
        base = name[: -len("/Adagrad")] if name.endswith("/Adagrad") else name
        if name in _TRAINING_STATE or _HUB_STATE.match(name[len(outer) :]):
            ignored.append(name)
            continue
        if base.startswith(root):
            body = base[len(root) :]
            target = _dataset_name(body)
            if target is None and root == "lm/" and body in ("softmax/W", "softmax/b"):
                target = body
            if target is not None:
                if base != name:
                    ignored.append(name)  # an Adagrad accumulator
                elif target.startswith("softmax/"):
                    extra[target] = name
                elif target in datasets:
                    raise ModelFileError(
                        f"{bundle.index_path}: '{datasets[target]}' and '{name}' are both {target}; expected one"
                    )
                else:
                    datasets[target] = name
                continue
        if root != "lm/" and name in (outer + "aggregation/weights", outer + "aggregation/scaling"):
            extra[name[len(outer) :]] = name
            continue
        unknown.append(name)
    if unknown:
        expected = (
            ("bilm-tf's lm/char_embed, lm/CNN*/..., lm/RNN_*/..., lm/softmax/*, their Adagrad slots and global_step")
            if root == "lm/"
            else f"TF-Hub elmo's {root}char_embed, {root}CNN*/..., {root}RNN_*/... and {outer}aggregation/*"
        )
        shown = ", ".join(repr(n) for n in unknown[:4]) + (", ..." if len(unknown) > 4 else "")
        raise ModelFileError(
            f"{bundle.index_path}: {len(unknown)} variable(s) of no ELMo biLM: {shown}; expected only {expected}"
        )
    return root, datasets, extra, ignored


def _count(prefix: str, names: dict[str, str], pattern: str) -> int:
    """How many consecutive indices 0, 1, ... have a dataset ``pattern.format(i)``; a gap is an error."""
    found = sorted(int(m.group(1)) for k in names if (m := re.match("^" + pattern.format(r"(\d+)") + "$", k)))
    if found != list(range(len(found))):
        raise ModelFileError(f"{prefix}: {pattern.format('i')} has indices {found}; expected 0, 1, ... without gaps")
    return len(found)


class _Shapes:
    """The bundle's biLM tensors by dataset name (``names``: dataset -> the bundle's variable) and
    their shapes, with the two errors every part's checks give."""

    def __init__(self, bundle: TensorBundle) -> None:
        self.where = bundle.index_path
        self.root, self.names, self.extra, self.ignored = map_names(bundle)
        self.shape = {k: bundle.entries[v].shape for k, v in self.names.items()}

    def need(self, dataset: str, why: str) -> tuple[int, ...]:
        if dataset not in self.shape:
            raise ModelFileError(f"{self.where}: no {self.root}{_variable_hint(dataset)} ({why})")
        return self.shape[dataset]

    def fail(self, dataset: str, expected: tuple, why: str) -> ModelFileError:
        return ModelFileError(
            f"{self.where}: '{self.names[dataset]}' has shape {self.shape[dataset]}, expected {expected} ({why})"
        )

    def count(self, pattern: str) -> int:
        return _count(self.where, self.names, pattern)


def convert_bundle(
    bundle: TensorBundle,
    source_options: dict[str, Any] | None,
    options_origin: str | None,
    cell_clip: float | None,
    proj_clip: float | None,
    activation: str | None,
    default_clip: float = 3.0,
    log: Callable[[str], None] | None = None,
) -> Converted:
    """Read every biLM tensor of ``bundle`` and check it; the architecture comes from the shapes,
    cross-checked with ``source_options`` (bilm-tf's training options, when given), and the clips
    and activation (which shapes cannot tell) from the flags, else the options, else
    ``default_clip`` and relu (the published models' values)."""
    s = _Shapes(bundle)
    char_rows, char_dim, filters, n_highway = _char_cnn_shape(s)
    P = s.need(
        "CNN_proj/W_proj",
        f"the projection after the char CNN; a model with {sum(n for _, n in filters)} "
        f"filters == the LSTM's projection dim has none, and neither allennlp nor elmo-fast "
        f"reads such a model",
    )[-1]
    C, n_layers = _lstm_shape(s, P)
    sources: dict[str, str] = {}
    options = _options(
        s,
        source_options,
        options_origin,
        sources,
        cell_clip,
        proj_clip,
        activation,
        default_clip,
        {"use_skip_connections": True, "projection_dim": P, "dim": C, "n_layers": n_layers},
        {
            "filters": filters,
            "n_highway": n_highway,
            "embedding": {"dim": char_dim},
            "n_characters": 262,
            "max_characters_per_token": 50,
        },
    )
    datasets = _datasets(bundle, s, options, char_rows, sources)
    return Converted(
        options=options,
        datasets=datasets,
        softmax=_softmax(bundle, s, P, source_options, options_origin),
        scalar_mix=_scalar_mix(bundle, s, n_layers),
        sources=sources,
        ignored=s.ignored,
    )


def _char_cnn_shape(s: _Shapes) -> tuple[int, int, list[tuple[int, int]], int]:
    """The character embedding's rows and dim, the convolutions' (width, filters), the highway layers."""
    char_rows, char_dim = (s.need("char_embed", "the character embedding") + (0, 0))[:2]
    if len(s.shape["char_embed"]) != 2 or char_rows not in (FILE_CHAR_ROWS, FILE_CHAR_ROWS + 1):
        raise s.fail("char_embed", ("261 or 262", "D"), "261 characters, plus the padding row in inference graphs")
    n_filters = s.count("CNN/W_cnn_{}")
    if n_filters == 0:
        raise ModelFileError(f"{s.where}: no {s.root}CNN/W_cnn_0 (the character convolutions)")
    filters = []
    for i in range(n_filters):
        w = s.shape[f"CNN/W_cnn_{i}"]
        if len(w) != 4 or w[0] != 1 or w[2] != char_dim:
            raise s.fail(f"CNN/W_cnn_{i}", (1, "width", char_dim, "filters"), f"char embedding dim {char_dim}")
        filters.append((w[1], w[3]))
    return char_rows, char_dim, filters, s.count("CNN_high_{}/W_carry")


def _lstm_shape(s: _Shapes, P: int) -> tuple[int, int]:
    """The LSTM's cell dim and layers: two directions of as many layers, each with its projection."""
    kernel0 = lstm_dataset(0, 0, "W_0")
    C4 = s.need(kernel0, "the forward LSTM's first layer")[-1]
    if C4 % 4:
        raise s.fail(kernel0, (2 * P, "4 x cell dim"), "4 gates")
    n_layers = s.count("RNN_0/RNN/MultiRNNCell/Cell{}/LSTMCell/W_0")
    backward_layers = s.count("RNN_1/RNN/MultiRNNCell/Cell{}/LSTMCell/W_0")
    if backward_layers != n_layers:
        raise ModelFileError(
            f"{s.where}: the forward LSTM (RNN_0) has {n_layers} layer(s), the backward one (RNN_1) "
            f"{backward_layers}; expected a bidirectional biLM (bilm-tf's 'bidirectional': true)"
        )
    if any(re.match(r"^RNN_([2-9]|\d\d+)/", k) for k in s.names):
        raise ModelFileError(f"{s.where}: LSTM directions beyond RNN_0 and RNN_1; expected a biLM")
    if lstm_dataset(0, 0, "W_P_0") not in s.shape:
        raise ModelFileError(
            f"{s.where}: no {s.root}{_variable_hint(lstm_dataset(0, 0, 'W_P_0'))} (the LSTM's "
            f"projection; a model with lstm.dim == projection_dim has none, and neither allennlp nor "
            f"elmo-fast reads such a model)"
        )
    return C4 // 4, n_layers


def _options(
    s: _Shapes,
    source_options: dict[str, Any] | None,
    options_origin: str | None,
    sources: dict[str, str],
    cell_clip: float | None,
    proj_clip: float | None,
    activation: str | None,
    default_clip: float,
    lstm: dict[str, Any],
    char_cnn: dict[str, Any],
) -> ElmoOptions:
    """The options: the shapes' architecture, and the clips and activation from the flags, else the
    source options, else the published models' values (``sources`` records which), checked."""

    def setting(key: str, flag_value, section_key: tuple[str, str], default, flag: str):
        from_options = (source_options or {}).get(section_key[0], {})
        from_options = from_options.get(section_key[1], KeyError) if isinstance(from_options, dict) else KeyError
        if flag_value is not None:
            sources[key] = (
                flag
                if from_options is KeyError or from_options == flag_value
                else f"{flag}, over {from_options!r} in {options_origin}"
            )
            return flag_value
        if from_options is not KeyError:
            sources[key] = options_origin
            return from_options
        sources[key] = f"default: the published models' value ({flag} sets it)"
        return default

    clips = [
        setting(k, v, ("lstm", k), default_clip, f"--{k.replace('_', '-')}")
        for k, v in (("cell_clip", cell_clip), ("proj_clip", proj_clip))
    ]
    act = setting("activation", activation, ("char_cnn", "activation"), "relu", "--activation")
    if source_options is not None and not source_options.get("lstm", {}).get("use_skip_connections", False):
        raise ModelFileError(
            f"{options_origin}: 'lstm.use_skip_connections' is not true; only biLMs with skip "
            f"connections are supported (as in allennlp)"
        )
    try:
        options = ElmoOptions.from_dict(
            {
                "lstm": {**lstm, "cell_clip": clips[0], "proj_clip": clips[1]},
                "char_cnn": {"activation": act, **char_cnn},
            },
            source="the converted options",
        )
    except ModelFileError as e:
        raise ModelFileError(f"{e} (from the flags or {options_origin or 'the defaults'})") from None
    if source_options is not None:
        _check_against_options(options, source_options, options_origin, s.where)
    return options


def _datasets(
    bundle: TensorBundle, s: _Shapes, options: ElmoOptions, char_rows: int, sources: dict[str, str]
) -> dict[str, np.ndarray]:
    """Every dataset the options call for, of the shape they call for, and none beyond, as float32."""
    expected = expected_datasets(options)
    for k, (want, why) in expected.items():
        if k not in s.names:
            raise ModelFileError(f"{s.where}: no {s.root}{_variable_hint(k)} (expected shape {want}, from {why})")
        if k != "char_embed" and s.shape[k] != want:
            raise s.fail(k, want, why)
    beyond = sorted(set(s.names) - set(expected))
    if beyond:
        raise ModelFileError(
            f"{s.where}: '{s.names[beyond[0]]}' is beyond the architecture the other tensors tell "
            f"({len(options.filters)} filters, {options.n_highway} highway, {options.n_layers} LSTM "
            f"layers)"
        )
    datasets = {k: _float32(bundle, s.names[k]) for k in expected}
    if char_rows == FILE_CHAR_ROWS + 1:
        datasets["char_embed"] = np.ascontiguousarray(
            datasets["char_embed"][1:]
        )  # the padding row: bilm-tf adds it on load
        sources["char_embed"] = f"{s.names['char_embed']} [262, {options.char_dim}], its padding row 0 dropped"
    return datasets


def _softmax(
    bundle: TensorBundle, s: _Shapes, P: int, source_options: dict[str, Any] | None, options_origin: str | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """The training softmax's weight and bias, when the bundle holds them."""
    extra, where, root = s.extra, s.where, s.root
    if not (extra.get("softmax/W") or extra.get("softmax/b")):
        return None
    for k in ("softmax/W", "softmax/b"):
        if k not in extra:
            raise ModelFileError(
                f"{where}: holds {root}{'softmax/W' if k == 'softmax/b' else 'softmax/b'} but no {root}{k}"
            )
    w_shape, b_shape = bundle.entries[extra["softmax/W"]].shape, bundle.entries[extra["softmax/b"]].shape
    if len(w_shape) != 2 or w_shape[1] != P or b_shape != (w_shape[0],):
        raise ModelFileError(
            f"{where}: softmax shapes {w_shape} and {b_shape}, expected [V, {P}] and [V] "
            f"(V the vocabulary size, {P} the projection dim)"
        )
    vocab_size = (source_options or {}).get("n_tokens_vocab")
    if vocab_size is not None and vocab_size != w_shape[0]:
        raise ModelFileError(
            f"{where}: the softmax has {w_shape[0]} rows, but {options_origin} says n_tokens_vocab "
            f"{vocab_size}: the options of another run"
        )
    return _float32(bundle, extra["softmax/W"]), _float32(bundle, extra["softmax/b"])


def _scalar_mix(bundle: TensorBundle, s: _Shapes, n_layers: int) -> tuple[list[float], float] | None:
    """TF-Hub's learned layer mix (aggregation/weights and /scaling), when the bundle holds it."""
    extra, where = s.extra, s.where
    if "aggregation/weights" not in extra and "aggregation/scaling" not in extra:
        return None
    if not set(extra) >= {"aggregation/weights", "aggregation/scaling"}:
        raise ModelFileError(f"{where}: holds one of aggregation/weights and aggregation/scaling without the other")
    w = _float32(bundle, extra["aggregation/weights"]).reshape(-1)
    scale = _float32(bundle, extra["aggregation/scaling"]).reshape(-1)
    if w.size != n_layers + 1 or scale.size != 1:
        raise ModelFileError(
            f"{where}: aggregation/weights has {w.size} values and aggregation/scaling "
            f"{scale.size}; expected {n_layers + 1} (the token layer and {n_layers} LSTM "
            f"layers) and 1"
        )
    return [float(x) for x in w], float(scale[0])


def _variable_hint(dataset: str) -> str:
    """A dataset's name as a training checkpoint spells its variable, for messages."""
    m = re.match(r"^RNN_(\d)/RNN/MultiRNNCell/Cell(\d+)/LSTMCell/(\w+)$", dataset)
    if m:
        w = {"W_0": "kernel", "B": "bias", "W_P_0": "projection/kernel"}[m.group(3)]
        return f"RNN_{m.group(1)}/.../cell_{m.group(2)}/lstm_cell/{w}"
    return dataset


def _float32(bundle: TensorBundle, name: str) -> np.ndarray:
    raw = bundle.read(name)
    if raw.dtype.kind != "f":
        raise ModelFileError(f"{bundle.index_path}: '{name}' has dtype {raw.dtype}, expected a float type")
    if not np.isfinite(raw).all():
        raise ModelFileError(f"{bundle.index_path}: '{name}' holds NaN or Inf values (a diverged run?)")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(raw, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ModelFileError(f"{bundle.index_path}: '{name}' holds values too large for float32")
    return out


def _check_against_options(options: ElmoOptions, source: dict[str, Any], origin: str | None, where: str) -> None:
    """The training options must describe the checkpoint's tensors (else they are another model's)."""
    told = {
        "char_cnn.filters": [list(f) for f in options.filters],
        "char_cnn.embedding.dim": options.char_dim,
        "char_cnn.n_highway": options.n_highway,
        "lstm.projection_dim": options.projection_dim,
        "lstm.dim": options.cell_dim,
        "lstm.n_layers": options.n_layers,
    }
    for key, value in told.items():
        node: Any = source
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            continue
        if node != value and not (
            key == "char_cnn.filters" and isinstance(node, list) and [list(x) for x in node] == value
        ):
            raise ModelFileError(
                f"{origin}: '{key}' is {node!r}, but the checkpoint {where} holds {value!r}: the "
                f"options of another model"
            )
    if not source.get("bidirectional", True):
        raise ModelFileError(f"{origin}: 'bidirectional' is false; expected a biLM")
