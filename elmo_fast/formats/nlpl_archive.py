"""The NLPL vector repository's ELMo archives (vectors.nlpl.eu/repository), read as simple_elmo reads them.

An archive is a folder, or a ``.zip`` holding the same files at its top level:

* ``options.json``  bilm-tf's options (:class:`~elmo_fast.formats.bilm_tf.ElmoOptions`);
* ``model.hdf5``    bilm-tf's weights. A folder without it: the first ``*.hdf5`` that
  ``os.listdir`` lists (simple_elmo's choice, so the same file on the same machine),
  ``softmax.hdf5`` aside;
* ``vocab.txt`` or ``vocab.txt.gz`` (optional): one token per line, most frequent first. A folder
  prefers ``vocab.txt.gz``; in a zip only ``vocab.txt`` is read (simple_elmo 0.9.2 reads no other);
* ``meta.json`` (optional): the repository's description of the model (corpus, algorithm, ...);
  read when present and parseable, never required (simple_elmo ignores it);
* ``softmax.hdf5`` (optional, elmo-fast's layout: ``softmax/W`` [V, P], ``softmax/b`` [V]): the
  language model's softmax over the vocabulary, which ``get_elmo_substitutes`` needs;
* ``checkpoint`` (optional, a folder only): TensorFlow's list of a bilm-tf training run's
  checkpoints (``model.ckpt-N.*`` beside it), which simple_elmo's ``full=True`` reads instead of
  the HDF5 files. Noted here, read by :mod:`elmo_fast.convert`.

The vocabulary's lines are given as simple_elmo reads them (:meth:`NlplArchive.vocab_lines`): a
folder's file line by line (universal newlines), a zip's ``vocab.txt`` split on ``"\\n"``, so a
final newline there gives one empty line more, as it does in simple_elmo.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ..durable import durable_open, scratch_dir
from ..errors import ModelFileError
from .bilm_tf import ElmoOptions, ElmoWeights, load_softmax, load_weights

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "model.hdf5"
VOCAB_FILE, VOCAB_GZ_FILE = "vocab.txt", "vocab.txt.gz"
META_FILE = "meta.json"
SOFTMAX_FILE = "softmax.hdf5"
CHECKPOINT_FILE = "checkpoint"


@dataclass
class NlplArchive:
    """An NLPL archive's files, found and checked; the weights are read by :meth:`load_weights`.

    path: the folder or the zip. weights, vocab, softmax: a path in a folder, a member name in a
    zip (None: absent). checkpoint: the path of TensorFlow's ``checkpoint`` file in a folder (None:
    absent). meta: meta.json's content (None: absent or unreadable, with a warning).
    """

    path: str
    is_zip: bool
    options: ElmoOptions
    raw_options: dict[str, Any]
    weights: str | None
    vocab: str | None
    softmax: str | None
    checkpoint: str | None = None
    meta: dict[str, Any] | None = field(default=None)

    def describe(self, name: str | None) -> str:
        """How a file of the archive is named in messages: ``archive.zip:member`` or its path."""
        return f"{self.path}:{name}" if self.is_zip else str(name)

    def vocab_lines(self) -> Iterator[str]:
        """The vocabulary's lines, unstripped, as simple_elmo iterates them (none without a vocabulary)."""
        if self.vocab is None:
            return
        where = self.describe(self.vocab)
        try:
            if self.is_zip:
                with zipfile.ZipFile(self.path) as zf:
                    text = zf.read(self.vocab).decode("utf-8")
                yield from text.split("\n")
                return
            opener = gzip.open if self.vocab.endswith(".gz") else open
            with opener(self.vocab, "rt", encoding="utf-8") as f:  # type: ignore[operator]
                yield from f
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{where}: vocabulary file is not UTF-8 text ({e.reason} at byte {e.start})") from None
        except (OSError, EOFError, zipfile.BadZipFile) as e:
            raise ModelFileError(f"{where}: cannot read the vocabulary file: {e}") from None

    def load_weights(self) -> ElmoWeights:
        """The weights, checked against the options (a zip's member is read through a temporary
        copy, removed at once: HDF5 reads files, not zip members)."""
        if self.weights is None:
            raise ModelFileError(f"{self.path}: no HDF5 model file ({WEIGHTS_FILE} or another *.hdf5) in the folder")
        if not self.is_zip:
            return load_weights(self.weights, self.options)
        with _extracted(self.path, self.weights) as path:
            try:
                return load_weights(path, self.options)
            except ModelFileError as e:  # name the member, not the temporary copy
                raise ModelFileError(str(e).replace(path, self.describe(self.weights))) from None

    def load_softmax(self, vocab_size: int) -> tuple[Tensor, Tensor]:
        """The softmax ``W`` [V, P] and ``b`` [V], checked against the vocabulary's size."""
        if self.softmax is None:
            raise ModelFileError(f"{self.path}: no {SOFTMAX_FILE} (the language model's softmax/W and softmax/b)")
        if not self.is_zip:
            return load_softmax(self.softmax, vocab_size, self.options.projection_dim)
        with _extracted(self.path, self.softmax) as path:
            try:
                return load_softmax(path, vocab_size, self.options.projection_dim)
            except ModelFileError as e:
                raise ModelFileError(str(e).replace(path, self.describe(self.softmax))) from None


@contextmanager
def _extracted(archive: str, member: str) -> Iterator[str]:
    """A zip member copied to a private temporary folder for the length of a ``with`` block."""
    with scratch_dir("elmo_fast_nlpl_") as tmp:
        path = os.path.join(tmp, os.path.basename(member))
        try:
            # a scratch copy read back at once, never an output: no fsync
            with zipfile.ZipFile(archive) as zf, zf.open(member) as src, durable_open(path, "wb", sync=False) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, zipfile.BadZipFile, EOFError) as e:
            raise ModelFileError(f"{archive}:{member}: cannot extract it from the zip: {e}") from None
        yield path


def _parse_options(text: bytes | str, where: str) -> tuple[ElmoOptions, dict[str, Any]]:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ModelFileError(f"{where}: cannot read options file as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{where}: options file must hold a JSON object")
    return ElmoOptions.from_dict(raw, source=where), raw


def _parse_meta(text: bytes | str, where: str) -> dict[str, Any] | None:
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        warnings.warn(f"{where}: not read (not JSON: {e}); the model loads without it", RuntimeWarning, stacklevel=3)
        return None
    return meta if isinstance(meta, dict) else {"content": meta}


def is_nlpl_zip(path: str | os.PathLike) -> bool:
    """Whether simple_elmo would read ``path`` as a zip archive: a file whose name ends in ``.zip``."""
    return os.path.isfile(path) and os.fspath(path).endswith(".zip")


def open_nlpl(path: str | os.PathLike) -> NlplArchive:
    """Find and check an NLPL archive's files (folder or ``.zip``); the weights are not read yet.

    Raises :class:`ModelFileError` naming the archive and the missing or unreadable file.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: model not found (expected a folder or a .zip archive from the NLPL repository)")
    if is_nlpl_zip(path):
        return _open_zip(path)
    if not os.path.isdir(path):
        raise ModelFileError(f"{path}: neither a folder nor a .zip archive (an NLPL model is one or the other)")
    return _open_folder(path)


def _open_folder(path: str) -> NlplArchive:
    options_path = os.path.join(path, OPTIONS_FILE)
    try:
        with open(options_path, "rb") as f:
            options, raw = _parse_options(f.read(), options_path)
    except FileNotFoundError:
        raise ModelFileError(
            f"{path}: missing {OPTIONS_FILE} (an NLPL model holds {OPTIONS_FILE} and {WEIGHTS_FILE})"
        ) from None
    except OSError as e:
        raise ModelFileError(f"{options_path}: cannot read the options file: {e}") from None
    weights: str | None = os.path.join(path, WEIGHTS_FILE)
    if not os.path.exists(weights):
        # simple_elmo takes the first *.hdf5 in os.listdir's order
        found = [name for name in os.listdir(path) if name.endswith(".hdf5") and name != SOFTMAX_FILE]
        weights = os.path.join(path, found[0]) if found else None
    checkpoint = os.path.join(path, CHECKPOINT_FILE)
    vocab = None
    for name in (VOCAB_GZ_FILE, VOCAB_FILE):
        if os.path.isfile(os.path.join(path, name)):
            vocab = os.path.join(path, name)
            break
    softmax = os.path.join(path, SOFTMAX_FILE)
    meta = None
    meta_path = os.path.join(path, META_FILE)
    if os.path.isfile(meta_path):
        try:
            with open(meta_path, "rb") as f:
                meta = _parse_meta(f.read(), meta_path)
        except OSError as e:
            warnings.warn(f"{meta_path}: not read ({e}); the model loads without it", RuntimeWarning, stacklevel=3)
    return NlplArchive(
        path=path,
        is_zip=False,
        options=options,
        raw_options=raw,
        weights=weights,
        vocab=vocab,
        softmax=softmax if os.path.isfile(softmax) else None,
        checkpoint=checkpoint if os.path.isfile(checkpoint) else None,
        meta=meta,
    )


def _open_zip(path: str) -> NlplArchive:
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            for name in (OPTIONS_FILE, WEIGHTS_FILE):
                if name not in names:
                    nested = sorted(n for n in names if n.endswith("/" + name))
                    hint = f" (it holds {nested[0]}: NLPL archives keep their files at the top level)" if nested else ""
                    raise ModelFileError(f"{path}: the zip archive holds no {name} at its top level{hint}")
            options, raw = _parse_options(zf.read(OPTIONS_FILE), f"{path}:{OPTIONS_FILE}")
            meta = _parse_meta(zf.read(META_FILE), f"{path}:{META_FILE}") if META_FILE in names else None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ModelFileError(f"{path}: not a readable zip archive: {e}") from None
    return NlplArchive(
        path=path,
        is_zip=True,
        options=options,
        raw_options=raw,
        weights=WEIGHTS_FILE,
        vocab=VOCAB_FILE if VOCAB_FILE in names else None,
        softmax=SOFTMAX_FILE if SOFTMAX_FILE in names else None,
        meta=meta,
    )
