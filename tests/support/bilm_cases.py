"""Shared cases of the biLM's tests: bilm-tf's outputs of the tiny fixture model, random sentences."""
import h5py
import numpy as np


def expected_top_layers(bilm_tf_tiny):
    """lm_embeddings_K.hdf5 dataset i: (2, T, 16) [forward, backward] -> (T, 32)."""
    out = []
    for k in range(3):
        with h5py.File(bilm_tf_tiny / f"lm_embeddings_{k}.hdf5", "r") as f:
            out.append([np.concatenate([f[str(i)][0], f[str(i)][1]], axis=-1) for i in range(10)])
    return out


def _sentences(rng, n, lo=1, hi=9):
    vocab = "the a cat sat on mat dog ran quickly home , . ! über 東京".split()
    return [[vocab[j] for j in rng.integers(0, len(vocab), rng.integers(lo, hi))] for _ in range(n)]
