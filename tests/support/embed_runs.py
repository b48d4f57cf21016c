"""Helpers of the corpus-embedding tests: random input files, outputs compared dataset by dataset, a kill
simulated in-process (an exception nothing cleans up after) at the n-th call of a step."""

import random

import h5py
import numpy as np
import torch
from tolerances import assert_close

from elmo_fast.embedding import writers

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFG.,;!?-'0123456789éßøü東京ЖΩ"


def random_sentences(rng: random.Random, n: int, lengths=(1, 1, 2, 3, 5, 7, 13, 29, 41)) -> list[str]:
    """Sentences of awkward lengths (one-token ones included), tokens of 1..12 characters and, now
    and then, over 50 (allennlp truncates those to 50 characters: fine)."""
    out = []
    for _ in range(n):
        tokens = []
        for _ in range(rng.choice(lengths)):
            width = rng.choice((1, 2, 3, 4, 6, 9, 12, 57)) if rng.random() > 0.02 else 120
            tokens.append("".join(rng.choice(_ALPHABET) for _ in range(width)))
        out.append(" ".join(tokens))
    return out


def write_lines(path, lines, newline="\n"):
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))
    return path


def contents(path) -> tuple[dict[str, np.ndarray], str | None]:
    """Every dataset of an output file by key, and the raw sentence_to_index string (None if absent)."""
    with h5py.File(path, "r") as f:
        mapping = f["sentence_to_index"].asstr()[0] if "sentence_to_index" in f else None
        data = {}
        f.visititems(
            lambda name, obj: (
                data.__setitem__(name, obj[...])
                if isinstance(obj, h5py.Dataset) and name != "sentence_to_index"
                else None
            )
        )
    return data, mapping


def assert_same_output(path, expected_path, what=""):
    """Same keys, same sentence_to_index string, every dataset within fp32 TOL."""
    got, got_map = contents(path)
    want, want_map = contents(expected_path)
    assert sorted(got) == sorted(want), what
    assert got_map == want_map, what
    for key in want:
        assert got[key].dtype == np.float32
        assert_close(torch.from_numpy(got[key]), torch.from_numpy(want[key]), torch.float32, f"{what} key {key!r}")


class Killed(BaseException):
    """Stands for SIGKILL in-process: nothing is cleaned up (abort is disabled alongside)."""


def _no_cleanup(monkeypatch):
    monkeypatch.setattr(writers.ShardWriter, "abort", lambda self: None)


def _kill_at(monkeypatch, target, name, when):
    real = getattr(target, name)
    count = [0]

    def dying(*args, **kwargs):
        count[0] += 1
        if count[0] == when:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, dying)
    _no_cleanup(monkeypatch)
