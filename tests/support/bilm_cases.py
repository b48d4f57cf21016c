"""Shared cases of the biLM's tests: bilm-tf's outputs of the tiny fixture model, random sentences, the mini
biLM of the gradchecks (a fixture) and its weights rebuilt from a flat list, and a whole biLM's forward
on the fast ops under autograd (`bilm_fast_train`)."""

import h5py
import numpy as np
import pytest
import torch

from elmo_fast import ElmoWeights, load_options, load_weights
from elmo_fast.bilm import ops, reference
from elmo_fast.formats.bilm_tf import ElmoOptions, LstmWeights
from elmo_fast.formats.random_models import random_weights, write_model


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


def sentences(rng, n, lo=1, hi=12):
    vocab = "the a cat sat on mat dog ran quickly home , . ! über 東京 antidisestablishmentarianism".split()
    return [[vocab[j] for j in rng.integers(0, len(vocab), rng.integers(lo, hi))] for _ in range(n)]


# Small enough for a full float64 gradcheck; clips low enough that cells and projections hit them.
MINI = ElmoOptions(
    filters=((1, 2), (2, 3), (3, 2)),
    char_dim=3,
    n_highway=1,
    projection_dim=3,
    cell_dim=4,
    n_layers=2,
    cell_clip=0.6,
    proj_clip=0.5,
)


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> ElmoWeights:
    options, weights = write_model(tmp_path_factory.mktemp("mini"), MINI, random_weights(MINI, seed=1))
    return load_weights(weights, load_options(options)).to(dtype=torch.float64)


def rebuild(options: ElmoOptions, tensors) -> ElmoWeights:
    """The inverse of ElmoWeights.tensors()."""
    it = iter(tensors)

    def take(n):
        return [next(it) for _ in range(n)]

    K = len(options.filters)
    char_embedding, conv_w, conv_b = next(it), take(K), take(K)
    hw, hb = take(options.n_highway), take(options.n_highway)
    proj_w, proj_b = next(it), next(it)
    lstm = [tuple(LstmWeights(*take(4)) for _ in range(2)) for _ in range(options.n_layers)]
    return ElmoWeights(options, char_embedding, conv_w, conv_b, hw, hb, proj_w, proj_b, lstm)


MINI_WORDS = [["ab", "über", "x"], ["<S>"], []]


def bilm_fast_train(char_ids, weights):
    """bilm_ref's computation on the fast ops under autograd: char_cnn and highway (their backward
    kernels), then ops.bilstm_train (no dropout), over every position."""
    o = weights.options
    ids, mask = reference.add_sentence_boundaries(char_ids)
    B, T2, W = ids.shape
    tokens = ops.highway(
        ops.char_cnn(
            ids.reshape(B * T2, W), weights.char_embedding, weights.conv_weights, weights.conv_biases, o.activation
        ),
        weights.highway_weights,
        weights.highway_biases,
        weights.proj_weight,
        weights.proj_bias,
    )
    tokens = tokens.view(B, T2, -1) * mask.unsqueeze(-1).to(tokens.dtype)
    outputs, h, c = ops.bilstm_train(
        tokens, mask.sum(dim=1), reference.flat_lstm_weights(weights.lstm), o.cell_clip, o.proj_clip
    )
    return [torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], mask, h, c
