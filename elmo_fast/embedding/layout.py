"""The output's layout, allennlp's: one float32 dataset per sentence, named by its key (its line number,
or with sentence keys its text, where '/' nests groups as h5py's ``create_dataset`` does), and
``sentence_to_index``, one JSON string mapping each sentence to its key. A FASTA input's datasets are
named by record id, as seqvec and bio_embeddings name them, and may hold per-protein vectors
(:func:`per_protein`): instead of the residues', or beside them as the attribute ``per_protein``."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from ..errors import InputError, Param


def per_protein(vectors: np.ndarray, mode: str | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """What a record's dataset holds, and its attributes: its vectors (``mode`` None), their mean over the
    residues instead (``"only"``: seqvec's ``--protein``; the mean of ``--sum``'s is bio_embeddings'
    ``reduce_per_protein``), or both, the mean as the attribute ``per_protein`` (``"also"``)."""
    if mode is None:
        return vectors, {}
    reduced = np.asarray(vectors, dtype=np.float32).mean(axis=-2)  # residues: the second-to-last axis
    return (reduced, {}) if mode == "only" else (vectors, {"per_protein": reduced})


def write_float32(group, key: str, data: np.ndarray, attrs: dict[str, np.ndarray] | None = None) -> None:
    """``group[key] = data`` as a float32 dataset (the layout h5py's ``create_dataset`` makes), through
    h5py's low-level API: 2.3x faster per dataset, which shows with one small dataset per sentence."""
    import h5py

    data = np.ascontiguousarray(data, dtype=np.float32)
    name = key.encode("utf-8")
    try:
        if b"/" in name.lstrip(b"/"):  # as create_dataset: a sentence key "a / b" is dataset " b" in group "a "
            parent, name = name.rsplit(b"/", 1)
            group = group.require_group(parent)
        dataset = h5py.h5d.create(group.id, name, h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(data.shape))
    except (ValueError, TypeError) as e:  # only sentence keys can be such names: line indices always fit
        raise InputError(
            f"the sentence {key!r} cannot be a dataset name in HDF5 ({e}): with ",
            Param("use_sentence_keys"),
            " '/' nests groups, so '.', a trailing '/', or a sentence that is "
            "another's group path cannot be stored; do not pass ",
            Param("use_sentence_keys"),
            " for this input",
        ) from None
    if data.size:
        dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
    if attrs:
        manager = h5py.AttributeManager(h5py.Dataset(dataset))
        for name, value in attrs.items():
            manager[name] = np.asarray(value, dtype=np.float32)


def copy_float32(source, name: str, group, key: str) -> None:
    """``group[key] = source[name]``, a dataset written by :func:`write_float32`, copied by HDF5 itself
    (H5Ocopy: no decoding into numpy and back, 4x faster than reading and writing it), with the
    names :func:`write_float32` gives."""
    import h5py

    target = key.encode("utf-8")
    try:
        if b"/" in target.lstrip(b"/"):
            parent, target = target.rsplit(b"/", 1)
            group = group.require_group(parent)
        h5py.h5o.copy(source.id, name.encode("utf-8"), group.id, target)
    except (ValueError, TypeError, KeyError, RuntimeError) as e:  # H5Ocopy reports bad names as RuntimeError
        raise InputError(
            f"the sentence {key!r} cannot be a dataset name in HDF5 ({e}): with ",
            Param("use_sentence_keys"),
            " '/' nests groups, so '.', a trailing '/', or a sentence that is "
            "another's group path cannot be stored; do not pass ",
            Param("use_sentence_keys"),
            " for this input",
        ) from None


def sentence_map(pairs: Iterable[tuple[str, str]]) -> str:
    # allennlp's dict: a repeated sentence keeps its first position and takes its last key
    return json.dumps(dict(pairs))


def write_sentence_map(fout, pairs: Iterable[tuple[str, str]]) -> None:
    """``sentence_to_index`` in ``fout``, from (sentence, key) pairs in input order."""
    import h5py

    ds = fout.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
    ds[0] = sentence_map(pairs)
