"""Random-weight NLPL archives of every kind the simple_elmo tests cover, the texts they are run on,
and the cases recorded from simple_elmo 0.9.2 (tests/fixtures/recorders/record_simple_elmo.py) into
tests/fixtures/simple_elmo_0.9.2.npz.

Everything here is deterministic: the tests rebuild the archives the fixture was recorded on, and
check their weights' digests against the ones recorded with it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import cli_process
import numpy as np
from repo_paths import FIXTURES

from elmo_fast.durable import durable_open, durable_path, write_bytes, write_json, write_text
from elmo_fast.formats.bilm_tf import write_softmax
from elmo_fast.formats.random_models import random_model, random_words

FIXTURE = FIXTURES / "simple_elmo_0.9.2.npz"
SPECIALS = ["</S>", "<S>", "<UNK>"]  # bilm-tf's vocabulary order: ids 0 and 1 are the sentence ends
#: Latin letters, a few with diacritics (2 UTF-8 bytes), and Cyrillic
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ.,!?'-áéöüßабвгдежз"
WORDS = random_words(300, CHARS, seed=7, max_len=8)
LONG_TOKEN = "Donaudampfschifffahrtsgesellschaftskapitänsmützenabzeichen"  # 60 bytes: cut to 48
LM_OPTIONS = {
    "n_tokens_vocab": len(SPECIALS) + len(WORDS),
    "bidirectional": True,
    "dropout": 0.1,
    "batch_size": 128,
    "unroll_steps": 20,
    "n_epochs": 10,
    "n_negative_samples_batch": 8192,
}

# archive kind -> how it is written
KINDS = {
    # a folder as the NLPL repository ships it: vocab.txt, meta.json, model.hdf5
    "folder": dict(seed=11),
    # vocab.txt.gz, the weights under another name (simple_elmo takes the first *.hdf5), clips that bite
    "gz": dict(seed=12, exercise_clips=True, vocab_gz=True, weights_name="elmo_2019.hdf5"),
    # the folder "folder" zipped
    "zip": dict(seed=11, zip=True),
    # no vocabulary file at all
    "novocab": dict(seed=13, vocab=False),
    # a vocabulary without the specials among its first words (limit=5 then caches none of them)
    "late_specials": dict(seed=14, specials_last=True),
    # a full model: softmax.hdf5 and the training options simple_elmo's language model reads
    "full": dict(seed=15, softmax=True),
    # a bilm-tf training folder (TensorFlow checkpoints, no HDF5): tests/fixtures/tf_checkpoints' run, its
    # checkpoint file naming the checkpoints by their base names (simple_elmo finds no other)
    "tf_run": dict(seed=0, tf_run=True),
}
TF_RUN = FIXTURES / "tf_checkpoints"


def vocab_tokens(kind: str) -> list[str]:
    spec = KINDS[kind]
    return WORDS + SPECIALS if spec.get("specials_last") else SPECIALS + WORDS


def write_archive(kind: str, directory: str | os.PathLike, seed: int | None = None) -> Path:
    """Write archive ``kind`` into ``directory`` (a folder; "zip": ``directory/model.zip``); returns
    the path to load. seed: other weights than the recorded ones (the kind's seed by default)."""
    spec = KINDS[kind]
    seed = spec["seed"] if seed is None else seed
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if spec.get("tf_run"):  # its weights are the fixture's, whatever the seed
        for src in sorted((TF_RUN / "bilm_tf_run").iterdir()):
            if src.name != "checkpoint":
                write_bytes(d / src.name, src.read_bytes())
        write_text(
            d / "checkpoint",
            'model_checkpoint_path: "model.ckpt-3"\nall_model_checkpoint_paths: '
            '"model.ckpt-2"\nall_model_checkpoint_paths: "model.ckpt-3"\n',
        )
        write_bytes(d / "vocab.txt", (TF_RUN / "vocab.txt").read_bytes())
        return d
    options_path, weights_path = random_model("tiny", d, seed=seed, exercise_clips=spec.get("exercise_clips", False))
    os.replace(weights_path, d / spec.get("weights_name", "model.hdf5"))
    if spec.get("softmax"):
        options = json.loads(options_path.read_text())
        write_json(options_path, {**options, **LM_OPTIONS})
        rng = np.random.default_rng(seed)
        P = options["lstm"]["projection_dim"]
        V = LM_OPTIONS["n_tokens_vocab"]
        import torch

        weight = (rng.standard_normal((V, P)) * 2 / np.sqrt(P)).astype(np.float32)
        bias = (rng.standard_normal(V) * 0.5).astype(np.float32)
        write_softmax(d / "softmax.hdf5", torch.from_numpy(weight), torch.from_numpy(bias))
    if spec.get("vocab", True):
        text = "\n".join(vocab_tokens(kind)) + "\n"
        if spec.get("vocab_gz"):
            with durable_open(d / "vocab.txt.gz", "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
                gz.write(text.encode("utf-8"))
        else:
            write_text(d / "vocab.txt", text)
    write_json(
        d / "meta.json",
        {"id": 0, "algorithm": {"name": "ELMo"}, "corpus": [{"description": "random weights"}], "dimensions": 32},
    )
    if spec.get("zip"):
        members = sorted(p for p in d.iterdir() if p.is_file())
        with durable_path(d / "model.zip") as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in members:
                zf.write(p, p.name)
        for p in members:
            p.unlink()
        return d / "model.zip"
    return d


def weights_digest(path: str | os.PathLike) -> str:
    """sha256 of an archive's weights (and softmax) datasets, names and values, independent of
    HDF5's byte layout."""
    import h5py

    from elmo_fast.formats.nlpl_archive import open_nlpl

    archive = open_nlpl(path)
    h = hashlib.sha256()
    if archive.weights is None:  # a TensorFlow training folder: its checkpoints' bytes
        for p in sorted(Path(path).glob("model.ckpt-*")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        return h.hexdigest()
    names = [archive.weights] + ([archive.softmax] if archive.softmax else [])
    for name in names:
        if archive.is_zip:
            with zipfile.ZipFile(archive.path) as zf:
                data = zf.read(name)
            f = h5py.File(io.BytesIO(data), "r")
        else:
            f = h5py.File(name, "r")
        with f:
            datasets: list[str] = []
            f.visititems(lambda n, o: datasets.append(n) if isinstance(o, h5py.Dataset) else None)
            for n in sorted(datasets):
                h.update(n.encode())
                h.update(np.ascontiguousarray(f[n][...], dtype=np.float32).tobytes())
    return h.hexdigest()


def _texts() -> dict[str, list]:
    rng = np.random.default_rng(3)

    def words(n: int) -> list[str]:
        return [WORDS[i] for i in rng.integers(0, len(WORDS), n)]

    mixed = [
        words(7),
        words(1),
        ["Zürich", "и", "Москва", LONG_TOKEN, "?"] + words(2),
        words(12),
        words(3),
        [],
        words(1),
        ["<UNK>", "out-of-vocabulary"] + words(3),
        words(9),
    ]
    return {
        "mixed": mixed,  # 9 texts: lengths 7, 1, 7, 12, 3, 0, 1, 5, 9
        "specials": [words(2) + ["<S>"] + words(2), ["</S>"], words(4) + [WORDS[4]], words(6), [WORDS[4], "<S>"]],
        "ones": [words(1) for _ in range(5)],
        "empty_batch": [[], [], words(3), words(1), []],
        "strings": ["a quick test", "xyz", "Zürich ok"],  # strings: simple_elmo takes their characters as tokens
        "raw": [" ".join(words(n)) for n in (5, 2, 8, 1, 4, 6, 3, 7, 2, 5)] + ["<UNK> " + " ".join(words(2)), ""],
        # over the tf_run vocabulary (</S> <S> <UNK> the , . of and to a in ELMo), and a word outside it
        "tf_raw": [
            "the ELMo of a",
            "to and",
            "ELMo",
            "in the , of the .",
            "a",
            "of and ELMo to in",
            "unknown the",
            "ELMo , ELMo",
        ],
    }


TEXTS = _texts()

#: what was recorded from simple_elmo: per case the archive, load()'s arguments and the calls, in
#: order, on one loaded model (results keyed "case/i" in the fixture)
CASES: dict[str, dict] = {
    "avg_b4_warm": dict(
        kind="folder",
        load=dict(max_batch_size=4),
        calls=[
            ("get_elmo_vectors", dict(texts="mixed")),
            ("get_elmo_vectors", dict(texts="mixed")),  # a second call: from zero states again
            ("get_elmo_vectors", dict(texts="mixed", warmup=False)),
            ("get_elmo_vectors", dict(texts="mixed", layers="top")),
            ("get_elmo_vectors", dict(texts="mixed", layers="all")),
            ("get_elmo_vector_average", dict(texts="mixed")),
            ("get_elmo_vector_average", dict(texts="mixed", warmup=False, layers="top")),
            ("get_elmo_vector_average", dict(texts="mixed", layers="all")),
        ],
    ),
    "one_batch": dict(
        kind="folder",
        load=dict(),
        calls=[
            ("get_elmo_vectors", dict(texts="mixed", layers="all")),
            ("get_elmo_vectors", dict(texts="ones")),
            ("get_elmo_vector_average", dict(texts="mixed")),
        ],
    ),
    "gz_b3": dict(
        kind="gz",
        load=dict(max_batch_size=3),
        calls=[
            ("get_elmo_vectors", dict(texts="mixed", layers="all")),
            ("get_elmo_vectors", dict(texts="specials", layers="all")),
            ("get_elmo_vector_average", dict(texts="specials", warmup=False)),
        ],
    ),
    "zip_b2": dict(
        kind="zip",
        load=dict(max_batch_size=2, limit=10),
        calls=[
            ("get_elmo_vectors", dict(texts="mixed")),
            ("get_elmo_vectors", dict(texts="ones", layers="top", warmup=False)),
        ],
    ),
    "novocab_b5": dict(
        kind="novocab",
        load=dict(max_batch_size=5),
        calls=[
            ("get_elmo_vectors", dict(texts="specials", layers="all")),
            ("get_elmo_vectors", dict(texts="strings", layers="all")),
        ],
    ),
    "late_specials_limit5": dict(
        kind="late_specials",
        load=dict(max_batch_size=4, limit=5),
        calls=[
            ("get_elmo_vectors", dict(texts="specials", layers="all")),
        ],
    ),
    "empty_batch_b2": dict(
        kind="folder",
        load=dict(max_batch_size=2),
        calls=[
            ("get_elmo_vectors", dict(texts="empty_batch", layers="all")),
            ("get_elmo_vector_average", dict(texts="empty_batch")),
            ("get_elmo_vector_average", dict(texts="empty_batch", layers="all", warmup=False)),
        ],
    ),
    "substitutes_b3": dict(
        kind="full",
        load=dict(max_batch_size=3, full=True),
        calls=[
            ("get_elmo_substitutes", dict(data="raw")),
            ("get_elmo_substitutes", dict(data="raw", topn=5, nodelimiters=False)),
        ],
    ),
    "substitutes_b12": dict(
        kind="full",
        load=dict(max_batch_size=12, full=True),
        calls=[
            ("get_elmo_substitutes", dict(data="raw", topn=2)),
        ],
    ),
    "substitutes_b13": dict(
        kind="full",
        load=dict(max_batch_size=13, full=True),
        calls=[
            ("get_elmo_substitutes", dict(data="raw")),  # fewer sentences than rows: simple_elmo's SystemError
        ],
    ),
    "checkpoint_b2": dict(
        kind="tf_run",
        load=dict(max_batch_size=2, full=True),
        calls=[
            ("get_elmo_substitutes", dict(data="tf_raw")),
            ("get_elmo_substitutes", dict(data="tf_raw", topn=4, nodelimiters=False)),
        ],
    ),
}


def call_arguments(kwargs: dict) -> dict:
    """A recorded call's arguments with the texts' names replaced by the texts."""
    out = dict(kwargs)
    for key in ("texts", "data"):
        if key in out:
            out[key] = TEXTS[out[key]]
    return out


# ---------------------------------------------------------------------------------------------
# the peer: simple_elmo on TensorFlow, in its side environment (tests/fixtures/recorders/simple_elmo_peer.py)

PEER_SCRIPT = FIXTURES / "recorders" / "simple_elmo_peer.py"
PEER_PYTHON = Path(os.environ.get("SIMPLE_ELMO_PYTHON", "/work/simple_elmo_env/bin/python"))


def write_archives(directory: str | os.PathLike, kinds, seed: int | None = None) -> dict[str, Path]:
    return {kind: write_archive(kind, Path(directory) / kind, seed) for kind in sorted(set(kinds))}


def run_peer(
    case_names,
    directory: str | os.PathLike,
    python: str | os.PathLike = PEER_PYTHON,
    timeout: float = 1800,
    seed: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Path]]:
    """Write the archives of these cases into ``directory``, run them through simple_elmo in the
    side environment; returns the results ("case/i" -> array) and the archives by kind."""

    import sys

    directory = Path(directory)
    archives = write_archives(directory, [CASES[c]["kind"] for c in case_names], seed)
    plan = {
        "cases": {
            c: {
                "path": str(archives[CASES[c]["kind"]]),
                "load": CASES[c]["load"],
                "checkpoint": CASES[c]["kind"] == "full",
                "calls": [[m, call_arguments(kw)] for m, kw in CASES[c]["calls"]],
            }
            for c in case_names
        }
    }
    write_json(directory / "plan.json", plan)
    out = directory / "peer.npz"
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    done = cli_process.run(
        [os.fspath(python), os.fspath(PEER_SCRIPT), "record", os.fspath(directory / "plan.json"), os.fspath(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"simple_elmo peer failed (exit {done.returncode}); its stderr is above")
    with np.load(out) as f:
        return {k: f[k] for k in f.files}, archives
