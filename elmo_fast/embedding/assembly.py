"""The end of a resumable run: the output assembled from the work directory's shards, in input order,
each dataset copied once by HDF5 itself (H5Ocopy: no decoding into numpy and back), so that it is the
file a plain run writes, plus the run's record. Needs room for the output twice until the shards go."""

from __future__ import annotations

import json
import os

from .. import durable
from .layout import copy_float32, write_sentence_map
from .work_area import RUN_RECORD, covering_shards


def assemble(work: str, manifest: dict, total: int, patience: float, path: str) -> None:
    """Write ``path`` (whole, through :mod:`elmo_fast.durable`) from the shards of ``work`` that cover
    the input's ``total`` sentences (waiting up to ``patience`` seconds for shards to show)."""
    import h5py

    with durable.reading_back(path):
        shards = covering_shards(work, total, patience)
    use_keys = manifest["use_sentence_keys"]
    keep = not use_keys and not manifest["forget_sentences"] and not manifest.get("fasta")
    pairs: list[tuple[str, str]] = []
    with durable.durable_hdf5(path) as fout:
        for shard in shards:
            with durable.reading_back(path), h5py.File(os.path.join(work, shard["name"]), "r") as f:
                texts = f["text"].asstr()[...]
                ids = f["keys"].asstr()[...] if "keys" in f else None  # FASTA records' ids
                vectors = f["v"]
                for j, (index, text) in enumerate(zip(f["lines"][...], texts)):
                    key = ids[j] if ids is not None else text if use_keys else str(int(index))
                    copy_float32(vectors, str(j), fout, key)
                    if keep:
                        pairs.append((text, key))
        if keep:
            write_sentence_map(fout, pairs)
        record = {k: v for k, v in manifest.items() if k not in ("complete", "assembled")}
        # keys sorted: a resumed run (its manifest read back) and an uninterrupted one record the same text
        fout.attrs[RUN_RECORD] = json.dumps(
            {**record, "shards": [[s["n"], s["digest"]] for s in shards]}, sort_keys=True
        )
