"""ELMo model files: ``options.json`` and the bilm-tf ``weights.hdf5`` layout.

:func:`load_options` and :func:`load_weights` read them exactly as allennlp does and convert every
tensor to PyTorch's layout once, at load time; every dataset is checked against the options
first, and a mismatch raises :class:`~elmo_fast.errors.ModelFileError` naming the file, the
dataset, and the expected and found shapes. Datasets of other names are ignored, as in allennlp,
except those of a layer or convolution beyond the options (the options of another model).

The bilm-tf layout (TensorFlow shapes, ``F`` = total filters, ``P`` = projection dim, ``C`` =
LSTM cell dim, ``In`` = layer input dim = ``P``)::

    char_embed                                   [261, char_dim]
    CNN/W_cnn_{i}, CNN/b_cnn_{i}                 [1, width_i, char_dim, num_i], [num_i]
    CNN_high_{k}/W_transform, W_carry            [F, F] each (x @ W)
    CNN_high_{k}/b_transform, b_carry            [F] each
    CNN_proj/W_proj, CNN_proj/b_proj             [F, P], [P]
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0    [In + P, 4C]  gates i, j, f, o
                                              B      [4C]          (TF adds 1 to f at run time)
                                              W_P_0  [C, P]
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..durable import durable_hdf5, write_json
from ..errors import ModelConfigurationError, ModelFileError, Param
from .options_check import Architecture, OptionsReader
from .options_check import short as _short
from .weights_base import LstmWeights, WeightsBase

#: Rows of ``char_embed`` in a bilm-tf file: 256 bytes + 5 marks; a zero row 0 is added on load.
FILE_CHAR_ROWS = 261


@dataclass(frozen=True)
class ElmoOptions(Architecture):
    """The architecture, as read from ``options.json``."""

    filters: tuple[tuple[int, int], ...]  # (width, number of filters) per convolution
    char_dim: int
    n_highway: int
    projection_dim: int
    cell_dim: int
    n_layers: int
    cell_clip: float | None
    proj_clip: float | None
    activation: str = "relu"
    n_characters: int = 262
    max_characters_per_token: int = 50

    @classmethod
    def from_dict(cls, options: dict[str, Any], source: str = "options") -> ElmoOptions:
        read = OptionsReader(options, source)
        read.sections({"lstm": "dim, n_layers, projection_dim", "char_cnn": "filters, n_highway, embedding"})
        cnn_embedding = read.get("char_cnn", "embedding")
        if not isinstance(cnn_embedding, dict) or "dim" not in cnn_embedding:
            raise ModelFileError(f"{source}: missing key 'char_cnn.embedding.dim'")
        char_dim = read.check_integer("char_cnn.embedding.dim", cnn_embedding["dim"])
        raw_filters = read.get("char_cnn", "filters")
        if not isinstance(raw_filters, (list, tuple)) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in raw_filters
        ):
            raise ModelFileError(
                f"{source}: 'char_cnn.filters' must be a list of [width, number] pairs, got {_short(raw_filters)}"
            )
        filters = tuple(
            (read.check_integer(f"char_cnn.filters[{i}][0]", w), read.check_integer(f"char_cnn.filters[{i}][1]", n))
            for i, (w, n) in enumerate(raw_filters)
        )
        activation = read.get("char_cnn", "activation", "relu")
        if activation not in ("relu", "tanh"):
            raise ModelConfigurationError(
                f"{source}: 'char_cnn.activation' must be 'relu' or 'tanh', got {_short(activation)}"
            )
        if not read.get("lstm", "use_skip_connections", False):
            raise ModelConfigurationError(
                f"{source}: only biLMs with 'lstm.use_skip_connections': true are supported (as in allennlp)"
            )
        number = read.integer
        opts = cls(
            filters=filters,
            char_dim=char_dim,
            n_highway=number("char_cnn", "n_highway"),
            projection_dim=number("lstm", "projection_dim"),
            cell_dim=number("lstm", "dim"),
            n_layers=number("lstm", "n_layers"),
            cell_clip=read.clip("lstm", "cell_clip"),
            proj_clip=read.clip("lstm", "proj_clip"),
            activation=activation,
            n_characters=number("char_cnn", "n_characters", default=262),
            max_characters_per_token=number("char_cnn", "max_characters_per_token", default=50),
        )
        if opts.max_characters_per_token != 50:
            raise ModelFileError(
                f"{source}: 'char_cnn.max_characters_per_token' must be 50, got {_short(opts.max_characters_per_token)}"
            )
        if opts.n_characters not in (261, 262):
            raise ModelFileError(
                f"{source}: 'char_cnn.n_characters' must be 261 or 262, got {_short(opts.n_characters)}"
            )
        if any(w < 1 or w > 50 or n < 1 for w, n in filters) or not filters:
            raise ModelFileError(
                f"{source}: 'char_cnn.filters' must hold widths in 1..50 and counts >= 1, got {_short(list(filters))}"
            )
        for name in ("char_dim", "projection_dim", "cell_dim", "n_layers"):
            if getattr(opts, name) < 1:
                raise ModelFileError(f"{source}: '{name}' must be >= 1, got {_short(getattr(opts, name))}")
        if opts.n_highway < 0:
            raise ModelFileError(f"{source}: 'char_cnn.n_highway' must be >= 0, got {_short(opts.n_highway)}")
        return opts

    def to_dict(self) -> dict[str, Any]:
        """The ``options.json`` content (bilm-tf's keys)."""
        return {
            "lstm": {
                "use_skip_connections": True,
                "projection_dim": self.projection_dim,
                "cell_clip": self.cell_clip,
                "proj_clip": self.proj_clip,
                "dim": self.cell_dim,
                "n_layers": self.n_layers,
            },
            "char_cnn": {
                "activation": self.activation,
                "filters": [list(f) for f in self.filters],
                "n_highway": self.n_highway,
                "embedding": {"dim": self.char_dim},
                "n_characters": self.n_characters,
                "max_characters_per_token": self.max_characters_per_token,
            },
        }


def _one_line(error: BaseException) -> str:
    # HDF5's messages span lines (with a timestamp); the CLI prints one line per error
    return " ".join(str(error).split())


def load_options(path: str | os.PathLike) -> ElmoOptions:
    """Read and check a bilm-tf ``options.json``: the architecture, or a one-line
    :class:`~elmo_fast.errors.ModelFileError` naming the file and what is wrong."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory, expected an options.json file")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: options file not found") from None
    # ValueError covers bad JSON, bad UTF-8 and ints past Python's digit limit; RecursionError, nesting
    # too deep for the decoder
    except (OSError, ValueError, RecursionError) as e:
        raise ModelFileError(f"{path}: cannot read options file as JSON: {_one_line(e)}") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{path}: options file must hold a JSON object")
    return ElmoOptions.from_dict(raw, source=path)


@dataclass
class ElmoWeights(WeightsBase):
    """Every parameter of the biLM, in PyTorch layout (as allennlp's modules hold them)."""

    options: ElmoOptions
    char_embedding: Tensor  # [262, char_dim], row 0 zero (the id of "no token")
    conv_weights: list[Tensor]  # [num_i, char_dim, width_i]
    conv_biases: list[Tensor]  # [num_i]
    highway_weights: list[Tensor]  # [2F, F]: [W_transform; -W_carry]
    highway_biases: list[Tensor]  # [2F]: [b_transform; -b_carry]
    proj_weight: Tensor  # [P, F]
    proj_bias: Tensor  # [P]
    lstm: list[tuple[LstmWeights, LstmWeights]] = field(default_factory=list)  # per layer: (fwd, bwd)


def lstm_dataset(direction: int, layer: int, name: str) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/{name}"


def iter_expected_datasets(options: ElmoOptions) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """Every dataset a weights file must hold, in file order: (name, TensorFlow shape, why that shape).

    A generator, so that a loader checking the file as it goes stops at the first missing dataset:
    options claiming 10**12 layers cost one lookup, not 10**12 entries.
    """
    o = options
    F, P, C = o.n_filters, o.projection_dim, o.cell_dim
    yield "char_embed", (FILE_CHAR_ROWS, o.char_dim), "261 characters x char_cnn.embedding.dim"
    for i, (width, num) in enumerate(o.filters):
        yield f"CNN/W_cnn_{i}", (1, width, o.char_dim, num), f"char_cnn.filters[{i}] = [{width}, {num}]"
        yield f"CNN/b_cnn_{i}", (num,), f"char_cnn.filters[{i}] = [{width}, {num}]"
    for k in range(o.n_highway):
        layer = f"highway layer {k} of char_cnn.n_highway = {o.n_highway}, total filters {F}"
        for name in ("W_transform", "W_carry"):
            yield f"CNN_high_{k}/{name}", (F, F), layer
        for name in ("b_transform", "b_carry"):
            yield f"CNN_high_{k}/{name}", (F,), layer
    yield "CNN_proj/W_proj", (F, P), f"total filters {F} x lstm.projection_dim {P}"
    yield "CNN_proj/b_proj", (P,), f"lstm.projection_dim {P}"
    for d in range(2):
        for layer in range(o.n_layers):
            of = f"layer {layer} of lstm.n_layers = {o.n_layers}"
            yield (
                lstm_dataset(d, layer, "W_0"),
                (P + P, 4 * C),
                f"(input {P} + projection {P}) x 4 * lstm.dim {C}, {of}",
            )
            yield lstm_dataset(d, layer, "B"), (4 * C,), f"4 * lstm.dim {C}, {of}"
            yield lstm_dataset(d, layer, "W_P_0"), (C, P), f"lstm.dim {C} x lstm.projection_dim {P}, {of}"


def expected_datasets(options: ElmoOptions) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every dataset a weights file must hold: name -> (TensorFlow shape, why that shape)."""
    return {name: (shape, why) for name, shape, why in iter_expected_datasets(options)}


def _beyond_options(options: ElmoOptions) -> list[tuple[str, str]]:
    """Paths that exist only in a file of a bigger architecture than ``options``, with the option they exceed.

    Without this check, options saying 1 highway (or LSTM layer) for a file of 2 would load and
    silently drop a layer; datasets of other names are ignored, as allennlp ignores them.
    """
    o = options
    n = len(o.filters)
    out = [
        (f"CNN/W_cnn_{n}", f"char_cnn.filters lists {n} convolutions"),
        (f"CNN/b_cnn_{n}", f"char_cnn.filters lists {n} convolutions"),
        (f"CNN_high_{o.n_highway}", f"char_cnn.n_highway = {o.n_highway}"),
        ("RNN_2", "a biLM has 2 directions, RNN_0 and RNN_1"),
    ]
    out += [(f"RNN_{d}/RNN/MultiRNNCell/Cell{o.n_layers}", f"lstm.n_layers = {o.n_layers}") for d in range(2)]
    return out


# What h5py raises on a corrupt file, depending on where the damage is (ModelFileError, a ValueError
# too, is never raised inside these guarded blocks).
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError)


def _read_checked(weight_file: str, options: ElmoOptions) -> dict[str, np.ndarray]:
    import h5py

    if not os.path.exists(weight_file):
        raise ModelFileError(f"{weight_file}: weights file not found")
    if os.path.isdir(weight_file):
        raise ModelFileError(f"{weight_file}: is a directory, expected an HDF5 weights file")
    arrays: dict[str, np.ndarray] = {}
    try:
        fin = h5py.File(weight_file, "r")
    except _H5_ERRORS as e:
        raise ModelFileError(
            f"{weight_file}: not a readable HDF5 file (truncated or corrupt?): {_one_line(e)}"
        ) from None

    def corrupt(name: str, e: BaseException) -> ModelFileError:
        return ModelFileError(f"{weight_file}: dataset '{name}' cannot be read (truncated or corrupt?): {_one_line(e)}")

    with fin:
        for name, shape, why in iter_expected_datasets(options):
            try:
                ds = fin.get(name)
                is_group = isinstance(ds, h5py.Group)
                found_shape = ds.shape if isinstance(ds, h5py.Dataset) else None
                dtype = ds.dtype if isinstance(ds, h5py.Dataset) else None
            except _H5_ERRORS as e:
                raise corrupt(name, e) from None
            if is_group:
                raise ModelFileError(
                    f"{weight_file}: '{name}' is a group, expected a dataset of shape {shape} (from {why})"
                )
            if not isinstance(ds, h5py.Dataset):
                raise ModelFileError(f"{weight_file}: dataset '{name}' is missing (expected shape {shape}, from {why})")
            if found_shape is None:  # HDF5's null dataspace: a dataset without even a scalar
                raise ModelFileError(
                    f"{weight_file}: dataset '{name}' has no shape (an empty HDF5 dataspace), "
                    f"expected {shape} (from {why})"
                )
            if tuple(found_shape) != shape:
                raise ModelFileError(
                    f"{weight_file}: dataset '{name}' has shape {tuple(found_shape)}, expected {shape} (from {why})"
                )
            if dtype.kind != "f":
                raise ModelFileError(f"{weight_file}: dataset '{name}' has dtype {dtype}, expected a float type")
            try:
                # a dataset created but never written (a dump that died half-way) reads as the fill value, 0
                unwritten = ds.size > 0 and ds.id.get_storage_size() == 0
                raw = ds[...]
            except _H5_ERRORS as e:
                raise corrupt(name, e) from None
            if unwritten:
                raise ModelFileError(
                    f"{weight_file}: dataset '{name}' of shape {shape} holds no stored values "
                    f"(created but never written?)"
                )
            if not np.isfinite(raw).all():
                raise ModelFileError(f"{weight_file}: dataset '{name}' holds NaN or Inf values")
            with np.errstate(over="ignore"):
                arr = np.asarray(raw, dtype=np.float32)
            if not np.isfinite(arr).all():
                raise ModelFileError(
                    f"{weight_file}: dataset '{name}' holds values too large for float32 "
                    f"(|x| > {float(np.finfo(np.float32).max):.4g}, dtype {dtype})"
                )
            arrays[name] = arr
        for path, limit in _beyond_options(options):
            try:
                present = path in fin
            except _H5_ERRORS as e:
                raise corrupt(path, e) from None
            if present:
                raise ModelFileError(
                    f"{weight_file}: holds '{path}', beyond the options ({limit}): "
                    f"the options file and the weights file are of different models"
                )
    return arrays


def _tf_lstm_to_torch(w0: np.ndarray, b: np.ndarray, wp: np.ndarray, input_size: int, cell: int) -> LstmWeights:
    # TF: [x, h] @ W_0, gates i, j(new memory), f, o; torch: W @ x, gates i, f, g, o.
    w = w0.T  # [4C, In + P]
    order = np.concatenate(
        [np.arange(0, cell), np.arange(2 * cell, 3 * cell), np.arange(cell, 2 * cell), np.arange(3 * cell, 4 * cell)]
    )
    w = w[order]
    bias = b.copy()
    bias[2 * cell : 3 * cell] += 1.0  # TF's LSTMCell adds forget_bias=1 at run time
    bias = bias[order]
    return LstmWeights(
        w_ih=torch.from_numpy(np.ascontiguousarray(w[:, :input_size])),
        w_hh=torch.from_numpy(np.ascontiguousarray(w[:, input_size:])),
        bias=torch.from_numpy(np.ascontiguousarray(bias)),
        w_proj=torch.from_numpy(np.ascontiguousarray(wp.T)),
    )


def load_weights(weight_file: str | os.PathLike, options: ElmoOptions) -> ElmoWeights:
    """Read and check a bilm-tf weights file; tensors come back fp32, on CPU, in torch layout."""
    weight_file = os.fspath(weight_file)
    return weights_from_datasets(_read_checked(weight_file, options), options)


def zero_weights(options: ElmoOptions) -> ElmoWeights:
    """Zeros of the shapes ``options`` give, in torch layout: a model's skeleton, to load a state
    dict into (an allennlp biLM's, say)."""
    return weights_from_datasets(
        {name: np.zeros(shape, dtype=np.float32) for name, (shape, _) in expected_datasets(options).items()}, options
    )


def weights_from_datasets(a: dict[str, np.ndarray], options: ElmoOptions) -> ElmoWeights:
    """bilm-tf's datasets (checked: :func:`expected_datasets`), keyed by name -> tensors in torch layout."""
    o = options

    def t(x: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    char_embedding = torch.zeros(FILE_CHAR_ROWS + 1, o.char_dim)
    char_embedding[1:] = t(a["char_embed"])
    conv_weights = [t(a[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0)) for i in range(len(o.filters))]
    conv_biases = [t(a[f"CNN/b_cnn_{i}"]) for i in range(len(o.filters))]
    highway_weights, highway_biases = [], []
    for k in range(o.n_highway):
        g = f"CNN_high_{k}/"
        highway_weights.append(t(np.concatenate([a[g + "W_transform"].T, -a[g + "W_carry"].T], axis=0)))
        highway_biases.append(t(np.concatenate([a[g + "b_transform"], -a[g + "b_carry"]])))
    lstm = []
    for layer in range(o.n_layers):
        lstm.append(
            tuple(
                _tf_lstm_to_torch(
                    a[lstm_dataset(d, layer, "W_0")],
                    a[lstm_dataset(d, layer, "B")],
                    a[lstm_dataset(d, layer, "W_P_0")],
                    o.projection_dim,
                    o.cell_dim,
                )
                for d in range(2)
            )
        )
    return ElmoWeights(
        options=o,
        char_embedding=char_embedding,
        conv_weights=conv_weights,
        conv_biases=conv_biases,
        highway_weights=highway_weights,
        highway_biases=highway_biases,
        proj_weight=t(a["CNN_proj/W_proj"].T),
        proj_bias=t(a["CNN_proj/b_proj"]),
        lstm=lstm,
    )


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _head(path: str | os.PathLike, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:  # missing or unreadable: the loaders say which, with their own messages
        return b""


def _holds_json(path: str | os.PathLike) -> bool:
    if _head(path, 1024).lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        if os.path.getsize(path) > 1 << 20:  # options files are a few hundred bytes
            return False
        with open(path, encoding="utf-8") as f:
            json.load(f)
        return True
    except (OSError, ValueError, RecursionError):
        return False


def check_not_swapped(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> None:
    """Refuse options and weights given the wrong way round (or one given for both), by content,
    naming both files, before either is parsed (which would only say that a file is not JSON)."""
    o, w = os.fspath(options_file), os.fspath(weight_file)
    options_is_hdf5 = _head(o, len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    weights_is_json = _holds_json(w)
    if options_is_hdf5 and weights_is_json:
        raise ModelFileError(
            "the model files look swapped: ",
            Param("options_file"),
            f" {o} is an HDF5 file (weights) and ",
            Param("weight_file"),
            f" {w} is JSON (options); pass them the other way round",
        )
    if options_is_hdf5:
        also = f"; {w} is HDF5 too: one file given for both?" if _head(w, 8) == HDF5_SIGNATURE else ""
        raise ModelFileError(
            f"{o}: ", Param("options_file"), f" is an HDF5 file (weights?), expected the JSON options{also}"
        )
    if weights_is_json:
        also = f"; {o} is JSON too: one file given for both?" if _holds_json(o) else ""
        raise ModelFileError(f"{w}: ", Param("weight_file"), f" holds JSON (options?), expected the HDF5 weights{also}")


def load_model_files(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> ElmoWeights:
    check_not_swapped(options_file, weight_file)
    return load_weights(weight_file, load_options(options_file))


# ---------------------------------------------------------------------------------------------
# Writing: the inverse of load_weights, for models trained or fine-tuned here. What it writes is
# what bilm-tf's dump_weights writes (its dataset names, TensorFlow shapes and gate order, the
# forget bias without TF's run-time +1, the highway carry gate with its own sign, char_embed
# without the padding row), so allennlp, bilm-tf and elmo-fast all load it.


def _inverse_gate_order(cell: int) -> np.ndarray:
    # torch i, f, g, o <-> TF i, j(=g), f, o: swapping the middle blocks is its own inverse
    return np.concatenate(
        [np.arange(0, cell), np.arange(2 * cell, 3 * cell), np.arange(cell, 2 * cell), np.arange(3 * cell, 4 * cell)]
    )


def to_datasets(weights: ElmoWeights) -> dict[str, np.ndarray]:
    """Every dataset of the bilm-tf layout, float32 in TensorFlow shapes, from torch-layout tensors."""
    o = weights.options

    def a(t: Tensor) -> np.ndarray:
        return t.detach().to(device="cpu", dtype=torch.float32).numpy()

    F, C = o.n_filters, o.cell_dim
    out: dict[str, np.ndarray] = {"char_embed": a(weights.char_embedding)[1:]}
    for i, (w, b) in enumerate(zip(weights.conv_weights, weights.conv_biases)):
        out[f"CNN/W_cnn_{i}"] = a(w).transpose(2, 1, 0)[None]
        out[f"CNN/b_cnn_{i}"] = a(b)
    for k, (w, b) in enumerate(zip(weights.highway_weights, weights.highway_biases)):
        w, b = a(w), a(b)
        out[f"CNN_high_{k}/W_transform"] = w[:F].T
        out[f"CNN_high_{k}/W_carry"] = -w[F:].T
        out[f"CNN_high_{k}/b_transform"] = b[:F]
        out[f"CNN_high_{k}/b_carry"] = -b[F:]
    out["CNN_proj/W_proj"] = a(weights.proj_weight).T
    out["CNN_proj/b_proj"] = a(weights.proj_bias)
    order = _inverse_gate_order(C)
    for layer, pair in enumerate(weights.lstm):
        for d, lw in enumerate(pair):
            w = np.concatenate([a(lw.w_ih), a(lw.w_hh)], axis=1)[order]  # [4C, In + P], TF gate order
            bias = a(lw.bias)[order].copy()
            bias[2 * C : 3 * C] -= 1.0  # TF's LSTMCell adds forget_bias=1 at run time
            out[lstm_dataset(d, layer, "W_0")] = w.T
            out[lstm_dataset(d, layer, "B")] = bias
            out[lstm_dataset(d, layer, "W_P_0")] = a(lw.w_proj).T
    out = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
    expected = expected_datasets(o)
    bad = [k for k in expected if k not in out or out[k].shape != expected[k][0]]
    if bad or len(out) != len(expected):
        raise ModelFileError(f"weights do not fit their options: {bad[:3]}")
    return out


def write_datasets(path: str | os.PathLike, datasets: dict[str, np.ndarray]) -> None:
    """An HDF5 file of these datasets, written durably (:mod:`elmo_fast.durable`)."""
    with durable_hdf5(path) as f:
        for name, value in datasets.items():
            f.create_dataset(name, data=value)


def write_options(path: str | os.PathLike, options: ElmoOptions, extra: dict[str, Any] | None = None) -> None:
    """``options.json`` (bilm-tf's keys; ``extra`` adds top-level keys such as training settings)."""
    content = options.to_dict()
    for key, value in (extra or {}).items():
        content.setdefault(key, value)
    write_json(path, content, indent=2)


def save_model_files(
    options_path: str | os.PathLike,
    weights_path: str | os.PathLike,
    weights: ElmoWeights,
    extra_options: dict[str, Any] | None = None,
) -> None:
    """Write ``weights`` as ``options.json`` + ``weights.hdf5`` in the bilm-tf layout (each durably)."""
    write_datasets(weights_path, to_datasets(weights))
    write_options(options_path, weights.options, extra_options)


#: where the softmax of a biLM trained here lives (bilm-tf keeps it in its checkpoints only, under
#: these variable names, and shares it between the two directions)
SOFTMAX_W, SOFTMAX_B = "softmax/W", "softmax/b"


def write_softmax(path: str | os.PathLike, weight: Tensor, bias: Tensor, dtype: np.dtype = np.float32) -> None:
    """``softmax.hdf5``: ``softmax/W`` [V, P] and ``softmax/b`` [V] (logits = h W^T + b)."""
    write_datasets(
        path,
        {
            SOFTMAX_W: weight.detach().cpu().float().numpy().astype(dtype),
            SOFTMAX_B: bias.detach().cpu().float().numpy().astype(dtype),
        },
    )


def load_softmax(path: str | os.PathLike, vocab_size: int, projection_dim: int) -> tuple[Tensor, Tensor]:
    """Read and check ``softmax.hdf5`` against the vocabulary size and the model's projection dim."""
    import h5py

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: softmax file not found")
    try:
        with h5py.File(path, "r") as f:
            found = {}
            for name, shape in ((SOFTMAX_W, (vocab_size, projection_dim)), (SOFTMAX_B, (vocab_size,))):
                ds = f.get(name)
                if not isinstance(ds, h5py.Dataset):
                    raise ModelFileError(f"{path}: dataset '{name}' is missing (expected shape {shape})")
                if tuple(ds.shape) != shape:
                    why = "vocabulary size x projection dim" if name == SOFTMAX_W else "vocabulary size"
                    raise ModelFileError(
                        f"{path}: dataset '{name}' has shape {tuple(ds.shape)}, expected {shape} ({why})"
                    )
                if ds.dtype.kind != "f":
                    raise ModelFileError(f"{path}: dataset '{name}' has dtype {ds.dtype}, expected a float type")
                arr = np.asarray(ds[...], dtype=np.float32)
                if not np.isfinite(arr).all():
                    raise ModelFileError(f"{path}: dataset '{name}' holds NaN or Inf values")
                found[name] = torch.from_numpy(arr)
    except ModelFileError:
        raise
    except _H5_ERRORS as e:
        raise ModelFileError(f"{path}: not a readable HDF5 file (truncated or corrupt?): {_one_line(e)}") from None
    return found[SOFTMAX_W], found[SOFTMAX_B]
