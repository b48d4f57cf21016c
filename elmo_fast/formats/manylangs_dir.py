"""ELMoForManyLangs model directories (HIT-SCIR's ``elmoformanylangs``): files into plain tensors.

A model directory, as ``elmoformanylangs.Embedder(model_dir)`` reads it::

    config.json          training options; only ``config_path`` is read: the architecture's file
    <config_path>        {"encoder": {name "elmo", projection_dim, dim, n_layers, cell_clip, proj_clip},
                          "token_embedder": {name "cnn", activation, filters, n_highway, word_dim,
                                             char_dim, max_characters_per_token}, ...}
    char.dic, word.dic   "token<TAB>id" lines (char.dic when char_dim > 0, word.dic when word_dim > 0)
    token_embedder.pkl   torch.save'd state dict of its ConvTokenEmbedder (legacy or zip format)
    encoder.pkl          torch.save'd state dict of its ElmobiLm (allennlp's projected LSTM cells)

``config_path`` is looked for as ELMoForManyLangs looks for it: relative to the model directory,
then by its base name in the model directory, then among the configs ``elmoformanylangs`` ships
(released models hold absolute paths of their authors' machines).

The state dicts are already in PyTorch layout (``T`` = total filters, ``Dw`` = word_dim, ``P`` =
projection_dim, ``C`` = encoder dim)::

    word_emb_layer.embedding.weight          [Vw, Dw]   (word_dim > 0)
    char_emb_layer.embedding.weight          [Vc, char_dim]
    convolutions.{i}.weight, .bias           [n_i, char_dim, w_i], [n_i]
    highways._layers.{k}.weight, .bias       [2T, T], [2T]: [transform | gate], g * x + (1 - g) * relu(t)
    projection.weight, .bias                 [P, Dw + T], [P]: over [word embedding ; highway output]
    {forward,backward}_layer_{l}.input_linearity.weight   [4C, P]  gates i, f, g, o
                                 .state_linearity.weight  [4C, P], .bias [4C] (no forget-gate shift)
                                 .state_projection.weight [P, C]

:func:`load_manylangs` reads and checks all of it (a mismatch names the file, the key, and the
expected and found shapes) and returns :class:`ManyLangsWeights`. Its tables get a zero row 0,
as bilm-tf's ``char_embed`` does on load: row ``id + 1`` holds the file's id ``id``, and 0 means
"no token", which is how the biLM core tells padding from tokens.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..durable import save_torch, write_json, write_text
from ..errors import ModelFileError
from ..textio import text_lines
from .options_check import Architecture, OptionsReader
from .options_check import short as _short
from .weights_base import LstmWeights, WeightsBase

CONFIG_FILE = "config.json"
CHAR_DIC = "char.dic"
WORD_DIC = "word.dic"
TOKEN_EMBEDDER_PKL = "token_embedder.pkl"
ENCODER_PKL = "encoder.pkl"

#: what every char.dic must hold (ELMoForManyLangs' own training adds them); word.dic needs <oov> and <pad>
CHAR_SPECIALS = ("<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>")
WORD_SPECIALS = ("<oov>", "<pad>")
#: the token ELMoForManyLangs reads from a dictionary line left with one field once stripped: its
#: training wrote the ideographic space U+3000 (a character of Chinese and Japanese text) as
#: "\u3000\t<id>", which ``strip()`` turns into "<id>"
STRIPPED_TOKEN = "\u3000"


@dataclass(frozen=True)
class ManyLangsConfig(Architecture):
    """The architecture, from the nested config (``config_path``). Attribute names follow
    :class:`~elmo_fast.formats.bilm_tf.ElmoOptions` where they mean the same thing."""

    filters: tuple[tuple[int, int], ...]  # (width, number of filters) per convolution; () when char_dim = 0
    char_dim: int  # 0: no character CNN
    word_dim: int  # 0: no word embedding
    n_highway: int
    max_characters_per_token: int  # a token's character slots, its two marks included
    projection_dim: int
    cell_dim: int  # the encoder's "dim"
    n_layers: int
    cell_clip: float | None
    proj_clip: float | None
    activation: str = "relu"

    @classmethod
    def from_dict(cls, config: Any, source: str = "config") -> ManyLangsConfig:
        read = OptionsReader(config, source)
        read.sections({"encoder": None, "token_embedder": None})
        get, integer = read.get, read.integer
        names = {"token_embedder": ("cnn", "ConvTokenEmbedder"), "encoder": ("elmo", "ElmobiLm")}
        for section, (name, module) in names.items():
            got = get(section, "name")
            if isinstance(got, str) and got.lower() == "lstm":
                # its LstmTokenEmbedder concatenates [B, T, Dw] word vectors with [B * T, 2 char_dim]
                # char vectors, and its LstmbiLm encoder gives one layer, not ELMo's layers: neither is
                # a model ELMoForManyLangs' Embedder can give ELMo vectors with
                raise ModelFileError(
                    f"{source}: '{section}.name' is 'lstm', which ELMoForManyLangs itself cannot run "
                    f"to give ELMo vectors; only '{name}' ({module}) models are supported"
                )
            if not isinstance(got, str) or got.lower() != name:
                raise ModelFileError(f"{source}: '{section}.name' must be '{name}' ({module}), got {_short(got)}")
        char_dim = integer("token_embedder", "char_dim", 0)
        word_dim = integer("token_embedder", "word_dim", 0)
        if char_dim == 0 and word_dim == 0:
            raise ModelFileError(
                f"{source}: 'token_embedder.char_dim' and 'token_embedder.word_dim' are both 0: "
                "the model has no token input"
            )
        max_chars = integer("token_embedder", "max_characters_per_token", 1)
        if max_chars < 7:  # "<bos>" + its two marks, which ELMoForManyLangs asserts fit
            raise ModelFileError(
                f"{source}: 'token_embedder.max_characters_per_token' must be >= 7 (the '<bos>' "
                f"token and its two marks), got {max_chars}"
            )
        filters: tuple[tuple[int, int], ...] = ()
        n_highway = 0
        activation = "relu"
        if char_dim:
            raw = get("token_embedder", "filters")

            def pair(p: Any) -> bool:
                return isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p)

            if not isinstance(raw, list) or not raw or not all(pair(p) for p in raw):
                raise ModelFileError(
                    f"{source}: 'token_embedder.filters' must be a non-empty list of [width, number] "
                    f"integer pairs, got {_short(raw)}"
                )
            filters = tuple((w, n) for w, n in raw)
            if any(w < 1 or w > max_chars or n < 1 for w, n in filters):
                raise ModelFileError(
                    f"{source}: 'token_embedder.filters' must hold widths in 1..{max_chars} "
                    f"(max_characters_per_token) and counts >= 1, got {_short(raw)}"
                )
            n_highway = integer("token_embedder", "n_highway", 0)
            activation = get("token_embedder", "activation")
            if activation not in ("relu", "tanh"):
                raise ModelFileError(
                    f"{source}: 'token_embedder.activation' must be 'relu' or 'tanh', got {_short(activation)}"
                )
        return cls(
            filters=filters,
            char_dim=char_dim,
            word_dim=word_dim,
            n_highway=n_highway,
            max_characters_per_token=max_chars,
            projection_dim=integer("encoder", "projection_dim", 1),
            cell_dim=integer("encoder", "dim", 1),
            n_layers=integer("encoder", "n_layers", 1),
            cell_clip=read.clip("encoder", "cell_clip"),
            proj_clip=read.clip("encoder", "proj_clip"),
            activation=activation,
        )

    def to_dict(self) -> dict[str, Any]:
        """The nested config's content, laid out as the configs ELMoForManyLangs ships (with the
        ``dropout`` and ``classifier`` its code reads at construction)."""
        return {
            "encoder": {
                "name": "elmo",
                "projection_dim": self.projection_dim,
                "cell_clip": self.cell_clip or 0,
                "proj_clip": self.proj_clip or 0,
                "dim": self.cell_dim,
                "n_layers": self.n_layers,
            },
            "token_embedder": {
                "name": "cnn",
                "activation": self.activation,
                "filters": [list(f) for f in self.filters],
                "n_highway": self.n_highway,
                "word_dim": self.word_dim,
                "char_dim": self.char_dim,
                "max_characters_per_token": self.max_characters_per_token,
            },
            "classifier": {"name": "sampled_softmax", "n_samples": 8192},
            "dropout": 0.1,
        }


@dataclass
class ManyLangsWeights(WeightsBase):
    """Every parameter and both dictionaries of an ELMoForManyLangs model, in PyTorch layout.

    Tables carry a zero row 0 (0 = no token): row ``id + 1`` is the file's id ``id``; the
    dictionaries keep the files' ids. ``char_embedding`` is None when char_dim = 0 (and the
    convolutions and highways empty), ``word_embedding`` None when word_dim = 0.
    """

    options: ManyLangsConfig
    char_vocab: dict[str, int]  # char.dic: character (or mark) -> file id; {} when char_dim = 0
    word_vocab: dict[str, int]  # word.dic: word -> file id; {} when word_dim = 0
    word_embedding: Tensor | None  # [Vw + 1, word_dim]
    char_embedding: Tensor | None  # [Vc + 1, char_dim]
    conv_weights: list[Tensor]  # [n_i, char_dim, w_i]
    conv_biases: list[Tensor]  # [n_i]
    highway_weights: list[Tensor]  # [2T, T]: [W_transform; W_gate]
    highway_biases: list[Tensor]  # [2T]
    proj_weight: Tensor  # [P, word_dim + T]
    proj_bias: Tensor  # [P]
    lstm: list[tuple[LstmWeights, LstmWeights]] = field(default_factory=list)  # per layer: (fwd, bwd)


# ---------------------------------------------------------------------------------------------
# Reading


def shipped_configs_dir() -> Path | None:
    """The ``configs`` folder of an installed ``elmoformanylangs`` (without importing it: its
    import pulls in old-torch code), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("elmoformanylangs")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "configs"
        if candidate.is_dir():
            return candidate
    return None


def _read_json(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: {what} not found") from None
    except (OSError, ValueError, RecursionError) as e:
        raise ModelFileError(f"{path}: cannot read {what} as JSON: {' '.join(str(e).split())}") from None


def find_config(model_dir: str | os.PathLike) -> Path:
    """The nested config ``config.json``'s ``config_path`` names, found as ELMoForManyLangs finds it."""
    d = Path(model_dir)
    outer = _read_json(d / CONFIG_FILE, "ELMoForManyLangs config")
    if not isinstance(outer, dict) or "config_path" not in outer:
        raise ModelFileError(
            f"{d / CONFIG_FILE}: missing key 'config_path' (the path of the model's architecture "
            "config, e.g. cnn_50_100_512_4096_sample.json)"
        )
    config_path = outer["config_path"]
    if not isinstance(config_path, str) or not config_path:
        raise ModelFileError(f"{d / CONFIG_FILE}: 'config_path' must be a file name, got {_short(config_path)}")
    # Windows paths of the authors' machines too: the base name is what is looked for
    base = re.split(r"[\\/]", config_path)[-1]
    candidates = [d / config_path, d / base]
    shipped = shipped_configs_dir()
    if shipped is not None:
        candidates.append(shipped / base)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    where = ", ".join(str(c) for c in candidates)
    hint = (
        "" if shipped is not None else " (nor is elmoformanylangs installed, whose shipped configs are looked in last)"
    )
    raise ModelFileError(
        f"{d / CONFIG_FILE}: its config_path {config_path!r} is not found: tried {where}{hint}; "
        f"put the config file in {d}"
    )


def load_config(model_dir: str | os.PathLike) -> tuple[ManyLangsConfig, Path]:
    """The architecture, and the path of the file it came from."""
    path = find_config(model_dir)
    return ManyLangsConfig.from_dict(_read_json(path, "model config"), source=str(path)), path


def read_dictionary(path: str | os.PathLike) -> dict[str, int]:
    """A ``char.dic`` / ``word.dic``: token -> id, read as ELMoForManyLangs reads it.

    Lines are split as its ``codecs.open`` reader splits them (every Unicode line boundary), each
    is ``strip()``ped and split on tabs; a line left with one field is the id of U+3000 (see
    :data:`STRIPPED_TOKEN`); a later line for the same token wins. A blank line is skipped (it
    would stop ELMoForManyLangs); ids must be integers >= 0.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ModelFileError(f"{path}: dictionary not found") from None
    except UnicodeDecodeError as e:
        raise ModelFileError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read dictionary: {e}") from None
    if text.startswith("\ufeff"):
        raise ModelFileError(
            f"{path}: starts with a byte-order mark, which ELMoForManyLangs would read as part of the first token"
        )
    vocab: dict[str, int] = {}
    for number, line in enumerate(text_lines(text), 1):  # lines end at "\n" or "\r\n" only
        parts = line.strip().split("\t")
        if parts == [""]:
            continue
        if len(parts) == 1:
            parts.insert(0, STRIPPED_TOKEN)
        if len(parts) != 2:
            raise ModelFileError(f"{path}: line {number}: expected 'token<TAB>id', got {_short(line)}")
        token, raw = parts
        try:
            index = int(raw)
        except ValueError:
            raise ModelFileError(f"{path}: line {number}: the id {_short(raw)} is not an integer") from None
        if index < 0:
            raise ModelFileError(f"{path}: line {number}: negative id {index}")
        vocab[token] = index
    if not vocab:
        raise ModelFileError(f"{path}: the dictionary is empty")
    return vocab


def read_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """A ``torch.save``'d state dict (zip or legacy format, storages of any device) as CPU tensors.

    Read with ``weights_only=True``: tensors and containers only, so a file cannot run code."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: {'is a directory, expected a file' if path.is_dir() else 'file not found'}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (
        pickle.UnpicklingError,
        RuntimeError,
        EOFError,
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        IndexError,
        zipfile.BadZipFile,
        ModuleNotFoundError,
        UnicodeDecodeError,
    ) as e:
        first = " ".join(str(e).split())[:300]
        raise ModelFileError(
            f"{path}: cannot read as a PyTorch state dict (truncated or corrupt?): {type(e).__name__}: {first}"
        ) from None
    if not isinstance(obj, Mapping):
        raise ModelFileError(f"{path}: holds a {type(obj).__name__}, expected a state dict (name -> tensor)")
    out: dict[str, Tensor] = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise ModelFileError(f"{path}: entry {_short(key)} is of type {type(value).__name__}, expected a tensor")
        out[key] = value
    return out


def expected_token_embedder(o: ManyLangsConfig, word_rows: int | None, char_rows: int | None) -> dict[str, tuple]:
    """token_embedder.pkl's keys -> (shape, why); rows of the tables as found (checked elsewhere)."""
    T, P = o.n_filters, o.projection_dim
    out: dict[str, tuple] = {}
    if o.word_dim:
        out["word_emb_layer.embedding.weight"] = ((word_rows, o.word_dim), "word.dic rows x token_embedder.word_dim")
    if o.char_dim:
        out["char_emb_layer.embedding.weight"] = ((char_rows, o.char_dim), "char.dic rows x token_embedder.char_dim")
        for i, (w, n) in enumerate(o.filters):
            why = f"token_embedder.filters[{i}] = [{w}, {n}], char_dim {o.char_dim}"
            out[f"convolutions.{i}.weight"] = ((n, o.char_dim, w), why)
            out[f"convolutions.{i}.bias"] = ((n,), why)
        for k in range(o.n_highway):
            why = f"highway layer {k} of token_embedder.n_highway = {o.n_highway}, total filters {T}"
            out[f"highways._layers.{k}.weight"] = ((2 * T, T), why)
            out[f"highways._layers.{k}.bias"] = ((2 * T,), why)
    out["projection.weight"] = (
        (P, o.word_dim + T),
        f"encoder.projection_dim {P} x (word_dim {o.word_dim} + total filters {T})",
    )
    out["projection.bias"] = ((P,), f"encoder.projection_dim {P}")
    return out


def expected_encoder(o: ManyLangsConfig) -> dict[str, tuple]:
    """encoder.pkl's keys -> (shape, why)."""
    P, C = o.projection_dim, o.cell_dim
    out: dict[str, tuple] = {}
    for layer in range(o.n_layers):
        of = f"layer {layer} of encoder.n_layers = {o.n_layers}"
        for direction in ("forward", "backward"):
            p = f"{direction}_layer_{layer}."
            out[p + "input_linearity.weight"] = ((4 * C, P), f"4 * encoder.dim {C} x projection_dim {P}, {of}")
            out[p + "state_linearity.weight"] = ((4 * C, P), f"4 * encoder.dim {C} x projection_dim {P}, {of}")
            out[p + "state_linearity.bias"] = ((4 * C,), f"4 * encoder.dim {C}, {of}")
            out[p + "state_projection.weight"] = ((P, C), f"projection_dim {P} x encoder.dim {C}, {of}")
    return out


def _checked(path: Path, state: dict[str, Tensor], expected: dict[str, tuple]) -> dict[str, Tensor]:
    """The expected tensors, fp32: every key present with its shape and finite float values, no other key
    (ELMoForManyLangs loads strictly)."""
    out: dict[str, Tensor] = {}
    for key, (shape, why) in expected.items():
        if key not in state:
            raise ModelFileError(f"{path}: missing '{key}' (expected shape {shape}, from {why})")
        t = state[key]
        if tuple(t.shape) != tuple(shape):
            raise ModelFileError(f"{path}: '{key}' has shape {tuple(t.shape)}, expected {tuple(shape)} (from {why})")
        if not t.is_floating_point():
            raise ModelFileError(f"{path}: '{key}' has dtype {t.dtype}, expected a float type")
        t32 = t.detach().to(torch.float32).contiguous()
        if not bool(torch.isfinite(t32).all()):
            beyond = bool(torch.isfinite(t).all())  # finite in float64, not in float32
            raise ModelFileError(
                f"{path}: '{key}' holds " + ("values too large for float32" if beyond else "NaN or Inf values")
            )
        out[key] = t32
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ModelFileError(
            f"{path}: holds '{extra[0]}'{f' and {len(extra) - 1} more' if len(extra) > 1 else ''}, "
            "which the config does not describe (another architecture's file?)"
        )
    return out


def _with_zero_row(table: Tensor) -> Tensor:
    return torch.cat([table.new_zeros(1, table.shape[1]), table])


def _check_vocab(path: Path, vocab: dict[str, int], specials: tuple[str, ...], rows: int, table: str) -> None:
    missing = [s for s in specials if s not in vocab]
    if missing:
        raise ModelFileError(
            f"{path}: missing the entry {missing[0]!r} (a {path.name} must hold {', '.join(specials)})"
        )
    token, top = max(vocab.items(), key=lambda item: item[1])
    if top >= rows:
        raise ModelFileError(f"{path}: {token!r} has id {top}, but {table} has {rows} rows")


def load_manylangs(model_dir: str | os.PathLike) -> ManyLangsWeights:
    """Read and check an ELMoForManyLangs model directory; tensors come back fp32, on CPU."""
    d = Path(model_dir)
    if not d.is_dir():
        raise ModelFileError(f"{d}: {'not a directory' if d.exists() else 'model directory not found'}")
    o, _ = load_config(d)
    for name in (
        (TOKEN_EMBEDDER_PKL, ENCODER_PKL) + ((CHAR_DIC,) if o.char_dim else ()) + ((WORD_DIC,) if o.word_dim else ())
    ):
        if not (d / name).is_file():
            raise ModelFileError(
                f"{d}: missing {name} (an ELMoForManyLangs model directory holds config.json, "
                f"{CHAR_DIC + ', ' if o.char_dim else ''}{WORD_DIC + ', ' if o.word_dim else ''}"
                f"{TOKEN_EMBEDDER_PKL} and {ENCODER_PKL})"
            )
    char_vocab = read_dictionary(d / CHAR_DIC) if o.char_dim else {}
    word_vocab = read_dictionary(d / WORD_DIC) if o.word_dim else {}
    emb_path, enc_path = d / TOKEN_EMBEDDER_PKL, d / ENCODER_PKL
    raw = read_state_dict(emb_path)

    def rows(key: str) -> int | None:
        t = raw.get(key)
        return t.shape[0] if t is not None and t.dim() == 2 else None

    word_rows, char_rows = rows("word_emb_layer.embedding.weight"), rows("char_emb_layer.embedding.weight")
    emb = _checked(emb_path, raw, expected_token_embedder(o, word_rows, char_rows))
    if o.char_dim:
        _check_vocab(d / CHAR_DIC, char_vocab, CHAR_SPECIALS, char_rows, f"{emb_path.name}'s char_emb_layer")
    if o.word_dim:
        _check_vocab(d / WORD_DIC, word_vocab, WORD_SPECIALS, word_rows, f"{emb_path.name}'s word_emb_layer")
    enc = _checked(enc_path, read_state_dict(enc_path), expected_encoder(o))
    lstm = []
    for layer in range(o.n_layers):
        pair = []
        for direction in ("forward", "backward"):
            p = f"{direction}_layer_{layer}."
            pair.append(
                LstmWeights(
                    w_ih=enc[p + "input_linearity.weight"],
                    w_hh=enc[p + "state_linearity.weight"],
                    bias=enc[p + "state_linearity.bias"],
                    w_proj=enc[p + "state_projection.weight"],
                )
            )
        lstm.append(tuple(pair))
    return ManyLangsWeights(
        options=o,
        char_vocab=char_vocab,
        word_vocab=word_vocab,
        word_embedding=_with_zero_row(emb["word_emb_layer.embedding.weight"]) if o.word_dim else None,
        char_embedding=_with_zero_row(emb["char_emb_layer.embedding.weight"]) if o.char_dim else None,
        conv_weights=[emb[f"convolutions.{i}.weight"] for i in range(len(o.filters))],
        conv_biases=[emb[f"convolutions.{i}.bias"] for i in range(len(o.filters))],
        highway_weights=[emb[f"highways._layers.{k}.weight"] for k in range(o.n_highway)],
        highway_biases=[emb[f"highways._layers.{k}.bias"] for k in range(o.n_highway)],
        proj_weight=emb["projection.weight"],
        proj_bias=emb["projection.bias"],
        lstm=lstm,
    )


# ---------------------------------------------------------------------------------------------
# Writing: the inverse of load_manylangs, in ELMoForManyLangs' own layout (for tests, and for
# models made or changed here).


def state_dicts(weights: ManyLangsWeights) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """token_embedder.pkl's and encoder.pkl's state dicts (tables without the zero row)."""
    o = weights.options

    def c(t: Tensor) -> Tensor:
        return t.detach().to(device="cpu", dtype=torch.float32).contiguous().clone()

    emb: dict[str, Tensor] = {}
    if weights.word_embedding is not None:
        emb["word_emb_layer.embedding.weight"] = c(weights.word_embedding[1:])
    if weights.char_embedding is not None:
        emb["char_emb_layer.embedding.weight"] = c(weights.char_embedding[1:])
        for i, (w, b) in enumerate(zip(weights.conv_weights, weights.conv_biases)):
            emb[f"convolutions.{i}.weight"], emb[f"convolutions.{i}.bias"] = c(w), c(b)
        for k, (w, b) in enumerate(zip(weights.highway_weights, weights.highway_biases)):
            emb[f"highways._layers.{k}.weight"], emb[f"highways._layers.{k}.bias"] = c(w), c(b)
    emb["projection.weight"], emb["projection.bias"] = c(weights.proj_weight), c(weights.proj_bias)
    enc: dict[str, Tensor] = {}
    for layer, pair in enumerate(weights.lstm):
        for direction, w in zip(("forward", "backward"), pair):
            p = f"{direction}_layer_{layer}."
            enc[p + "input_linearity.weight"] = c(w.w_ih)
            enc[p + "state_linearity.weight"] = c(w.w_hh)
            enc[p + "state_linearity.bias"] = c(w.bias)
            enc[p + "state_projection.weight"] = c(w.w_proj)
    for name, got, want in (
        (
            "token_embedder",
            emb,
            expected_token_embedder(
                o,
                None if weights.word_embedding is None else weights.word_embedding.shape[0] - 1,
                None if weights.char_embedding is None else weights.char_embedding.shape[0] - 1,
            ),
        ),
        ("encoder", enc, expected_encoder(o)),
    ):
        bad = [k for k in want if k not in got or tuple(got[k].shape) != tuple(want[k][0])]
        if bad or len(got) != len(want):
            raise ModelFileError(f"weights do not fit their config: {name} {bad[:3]}")
    return emb, enc


def write_dictionary(path: str | os.PathLike, vocab: Mapping[str, int]) -> None:
    """``token<TAB>id`` lines, as ELMoForManyLangs' training writes them."""
    write_text(path, "".join(f"{token}\t{index}\n" for token, index in vocab.items()), newline="\n")


def save_manylangs(
    directory: str | os.PathLike,
    weights: ManyLangsWeights,
    legacy_format: bool = False,
    config_name: str = "config.model.json",
    config_path: str | None = None,
) -> Path:
    """Write ``weights`` as an ELMoForManyLangs model directory: config.json (pointing to
    ``config_path``, default ``config_name``), the config, the dictionaries and the two state dicts
    (``legacy_format``: torch's pre-1.6 pickle format, which the released models use)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    emb, enc = state_dicts(weights)
    write_json(d / config_name, weights.options.to_dict(), indent=1)
    write_json(d / CONFIG_FILE, {"config_path": config_path or config_name, "model": str(d)}, indent=None)
    if weights.char_embedding is not None:
        write_dictionary(d / CHAR_DIC, weights.char_vocab)
    if weights.word_embedding is not None:
        write_dictionary(d / WORD_DIC, weights.word_vocab)
    for name, state in ((TOKEN_EMBEDDER_PKL, emb), (ENCODER_PKL, enc)):
        save_torch(state, d / name, _use_new_zipfile_serialization=not legacy_format)
    return d
