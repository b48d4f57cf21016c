"""The export's module against the reference, in PyTorch (no ONNX): the scan over time is the twin of
lstm_layer_ref, and the whole module is ElmoBiLm's reference forward without the boundaries."""

import numpy as np
import pytest
import torch
from onnx_graphs import random_batch

from elmo_fast import batch_to_ids
from elmo_fast.bilm import reference
from elmo_fast.bilm.model import ElmoBiLm
from elmo_fast.export.stateless_bilm import StatelessBiLm, lstm_layer_scan


@pytest.mark.parametrize(
    "lengths, clips, reverse",
    [
        ([1], (None, None), False),  # one row, one step
        ([1], (0.5, 0.3), True),
        ([5, 1, 0, 3], (0.5, 0.3), False),  # a row of length 0 keeps its initial state
        ([5, 1, 0, 3], (0.5, 0.3), True),
        ([7, 7, 2], (None, None), True),
        ([13, 4, 9, 1, 13], (3.0, 3.0), False),
    ],
)
def test_lstm_layer_scan_is_the_twin_of_lstm_layer_ref(lengths, clips, reverse):
    g = torch.Generator().manual_seed(len(lengths) * 31 + int(reverse))
    B, T, P, C = len(lengths), max(lengths), 3, 5
    # gates and states large enough that the clips bite
    xg = torch.randn(B, T, 4 * C, generator=g) * 2
    w_hh, w_proj = torch.randn(4 * C, P, generator=g), torch.randn(P, C, generator=g)
    h0, c0 = torch.randn(B, P, generator=g), torch.randn(B, C, generator=g)
    lengths = torch.tensor(lengths)
    args = (xg, lengths, w_hh, w_proj, h0, c0, *clips)
    want = reference.lstm_layer_ref(*args, reverse=reverse)
    got = lstm_layer_scan(*args, reverse=reverse)
    for w, x in zip(want, got):
        assert w.shape == x.shape
        assert (w - x).abs().max().item() <= 1e-6


@pytest.mark.slow
def test_the_module_is_the_reference_forward_without_boundaries(random_models):
    options, weights = random_models("tiny", exercise_clips=True)
    bilm = ElmoBiLm(options, weights, backend="reference").eval()
    module = StatelessBiLm(bilm.weights()).eval()
    rng = np.random.default_rng(3)
    for lengths in ([1], [6, 0, 1, 3]):
        ids = batch_to_ids(random_batch(rng, lengths))
        with torch.no_grad():
            layers, mask = module(ids)
            want_layers, want_mask = bilm.embed(ids)
        assert mask.dtype == torch.int64 and torch.equal(mask.bool(), want_mask)
        assert layers.shape == want_layers.shape == (len(lengths), 3, max(lengths), 32)
        assert (layers - want_layers).abs().max().item() <= 1e-6
