"""``convert(src, out_dir)``: a bilm-tf training folder or a TF-Hub module into a model directory.

Read, then check, then write: every tensor is read (block checksums of the index, CRC-32C of each
tensor), mapped and checked against the architecture before anything is written, so a bad source
leaves OUT_DIR as it was (not even created). Then each file goes through :mod:`elmo_fast.durable`
(a temporary name beside it, renamed when whole); should a write fail or the run be interrupted,
the files this run put in OUT_DIR are removed again, and with them those of an earlier conversion
that ``overwrite`` was replacing: no directory is left holding half of one model and half of another.

OUT_DIR receives what ``elmo-fast embed``, allennlp and bilm-tf read, and what ``elmo-fast
finetune`` continues from:

* ``options.json``: ready for inference (``n_characters`` 262, as bilm-tf's README says to set
  after training), the training options kept beside the architecture;
* ``weights.hdf5``: exactly the datasets of bilm-tf's ``dump_weights`` (names, TensorFlow shapes,
  float32, ``char_embed`` [261, D] without the padding row);
* ``softmax.hdf5`` (``softmax/W`` [V, P], ``softmax/b`` [V]) when the checkpoint has a softmax
  (bilm-tf runs; the published models and TF-Hub have none), and ``vocab.txt`` when a vocabulary
  is given or lies beside the checkpoint (checked against the softmax's rows);
* ``hub_scalar_mix.json`` for a TF-Hub module: its trained ``elmo`` mix (``aggregation/weights``
  and ``aggregation/scaling``), to pass to ``HubElmo(..., scalar_mix_parameters=...)``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..durable import check_creatable, durable_hdf5, durable_open, write_json
from ..errors import ModelFileError, Param
from ..formats.bilm_tf import SOFTMAX_B, SOFTMAX_W
from ..formats.tf_checkpoint import TensorBundle
from ..formats.vocab import Vocabulary
from .sources import Source, find_source
from .variables import Converted, convert_bundle

#: every file convert may write, in the order it writes them (options.json last: a directory with
#: options.json is a model directory)
OUTPUT_FILES = ("weights.hdf5", "softmax.hdf5", "vocab.txt", "hub_scalar_mix.json", "options.json")


@dataclass
class Conversion:
    """What was converted, from where, and what was written."""

    source: Source
    converted: Converted
    written: list[str] = field(default_factory=list)
    vocab_path: str | None = None


def _options_content(converted: Converted, source: Source) -> dict[str, Any]:
    content = copy.deepcopy(source.options) if source.options else {}
    for section, values in converted.options.to_dict().items():
        if not isinstance(content.get(section), dict):
            content[section] = {}
        content[section].update(values)
    return content


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):  # (os.path: a name too long is said below)
        raise ModelFileError(f"{out_dir}: is a file; give the folder to write options.json and weights.hdf5 in")
    if not overwrite:
        for name in OUTPUT_FILES:
            if os.path.lexists(out_dir / name):
                raise ModelFileError(
                    f"{out_dir / name} already exists; pass ", Param("overwrite", True), " to replace it"
                )
    check_creatable(out_dir, "model directory")  # made after the checkpoint is read: nothing is made before


def _load_vocab(path: str, softmax_rows: int | None) -> Vocabulary:
    vocab = Vocabulary.load(path)
    if softmax_rows is not None and len(vocab) != softmax_rows:
        raise ModelFileError(
            f"{path}: {len(vocab)} tokens, but the checkpoint's softmax has {softmax_rows} rows: the "
            f"vocabulary of another run"
        )
    return vocab


def convert(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    step: int | None = None,
    cell_clip: float | None = None,
    proj_clip: float | None = None,
    activation: str | None = None,
    vocab: str | os.PathLike | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> Conversion:
    """Convert the checkpoint in ``src`` into ``out_dir`` (see the module's docstring).

    step: a bilm-tf run's checkpoint other than the latest. cell_clip, proj_clip, activation:
    settings the tensors cannot tell; default: the training options beside the checkpoint, else
    3, 3 and relu (the published models'). vocab: the run's vocabulary file (default: a vocab.txt
    beside the checkpoint). overwrite: replace the files of an earlier conversion in ``out_dir``.
    """
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, overwrite)
    source = find_source(src, step)
    bundle = TensorBundle(source.prefix)
    converted = convert_bundle(bundle, source.options, source.options_path, cell_clip, proj_clip, activation)
    softmax_rows = converted.softmax[0].shape[0] if converted.softmax is not None else None
    vocab_path = os.fspath(vocab) if vocab is not None else source.vocab_path
    tokens = _load_vocab(vocab_path, softmax_rows) if vocab_path is not None else None
    conversion = Conversion(source, converted, vocab_path=vocab_path)

    # everything is read and checked: now, and only now, OUT_DIR
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with durable_hdf5(out_dir / "weights.hdf5") as h5:
            for name, value in converted.datasets.items():
                h5.create_dataset(name, data=value)
        conversion.written.append("weights.hdf5")
        if converted.softmax is not None:
            with durable_hdf5(out_dir / "softmax.hdf5") as h5:
                h5.create_dataset(SOFTMAX_W, data=converted.softmax[0])
                h5.create_dataset(SOFTMAX_B, data=converted.softmax[1])
            conversion.written.append("softmax.hdf5")
        if tokens is not None:
            with durable_open(out_dir / "vocab.txt", "w") as f:
                f.write("\n".join(tokens.tokens) + "\n")
            conversion.written.append("vocab.txt")
        if converted.scalar_mix is not None:
            weights, gamma = converted.scalar_mix
            write_json(
                out_dir / "hub_scalar_mix.json",
                {
                    "scalar_mix_parameters": weights,
                    "gamma": gamma,
                    "source": f"{source.prefix}: aggregation/weights, aggregation/scaling",
                },
                indent=2,
            )
            conversion.written.append("hub_scalar_mix.json")
        write_json(out_dir / "options.json", _options_content(converted, source), indent=2)
        conversion.written.append("options.json")
        for name in OUTPUT_FILES:  # an earlier conversion's softmax or vocabulary is not this model's
            if name not in conversion.written:
                (out_dir / name).unlink(missing_ok=True)
    except BaseException:
        # a half-converted directory is worse than none: once one file is replaced, the earlier
        # model's others go with the new ones (before that, an earlier model stays whole)
        for name in OUTPUT_FILES if conversion.written else ():
            (out_dir / name).unlink(missing_ok=True)
        if created:
            try:
                out_dir.rmdir()
            except OSError:
                pass
        raise
    if log is not None:
        describe(conversion, out_dir, log)
    return conversion


def describe(conversion: Conversion, out_dir: Path, log: Callable[[str], None]) -> None:
    """What was read, with which settings from where, and what was written: a few lines."""
    s, c = conversion.source, conversion.converted
    o = c.options
    what = s.kind
    if s.step is not None:
        others = [str(n) for n in s.steps if n != s.step]
        what += f", step {s.step}" + (" (the latest)" if s.latest else " (--step)")
        if others:
            what += f"; also here: step {', '.join(others)}"
    log(f"read {s.prefix} ({what})")
    log(
        f"  architecture: char CNN of {len(o.filters)} widths ({o.n_filters} filters, char dim {o.char_dim}), "
        f"{o.n_highway} highway, projection {o.projection_dim}, {o.n_layers} LSTM layer(s) of {o.cell_dim} cells; "
        f"n_characters 262 (inference)"
    )
    for key in ("cell_clip", "proj_clip", "activation"):
        value = getattr(o, key) if key != "activation" else o.activation
        log(f"  {key} {value if value is not None else 'none'}: {c.sources.get(key)}")
    if "char_embed" in c.sources:
        log(f"  char_embed: {c.sources['char_embed']}")
    if c.softmax is not None and "vocab.txt" not in conversion.written:
        log(
            f"  no vocabulary given: softmax.hdf5 holds {c.softmax[0].shape[0]} rows; give --vocab FILE (the run's "
            f"vocab.txt) to continue training with `elmo-fast finetune`"
        )
    if c.ignored:
        slots = sum(n.endswith("/Adagrad") for n in c.ignored)
        states = sum("bilm/Variable" in n for n in c.ignored)
        parts = [n for n in c.ignored if not n.endswith("/Adagrad") and "bilm/Variable" not in n]
        parts += [f"{slots} Adagrad accumulators"] * bool(slots) + [
            f"{states} saved LSTM states (bilm/Variable*)"
        ] * bool(states)
        log(
            f"  left out (training and run-time state): {', '.join(parts[:-1])}{' and ' if len(parts) > 1 else ''}{parts[-1]}"
        )
    log(f"wrote {', '.join(str(out_dir / n) for n in conversion.written)}")
