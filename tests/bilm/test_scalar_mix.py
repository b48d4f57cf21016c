"""ScalarMix: allennlp's equations, written out by hand on fresh random data."""

import pytest
import torch

from elmo_fast.bilm.reference import scalar_mix_ref
from elmo_fast.bilm.scalar_mix import ScalarMix
from elmo_fast.errors import ElmoFastError


def _by_hand(layers, w, gamma, mask=None):
    """The mix element by element, in float64, with layer norm when a mask is given."""
    s = [float(v) for v in torch.softmax(torch.tensor(w, dtype=torch.float64), 0)]
    out = torch.zeros_like(layers[0], dtype=torch.float64)
    for k, x in enumerate(layers):
        x = x.double()
        if mask is not None:
            keep = mask.bool()
            values = x[keep]  # [n_unmasked, D]: every unmasked element of the batch, all features
            mean = values.mean()
            var = ((values - mean) ** 2).mean()
            x = (x - mean) / torch.sqrt(var + 1e-13)
        out += s[k] * x
    return gamma * out


@pytest.mark.parametrize("shape", [(1, 1, 3), (3, 7, 5), (2, 4, 6, 8)])
def test_mix_without_layer_norm(shape):
    layers = [torch.randn(shape) * (k + 1) for k in range(3)]
    w = torch.randn(3).tolist()
    mix = ScalarMix(3, initial_scalar_parameters=w)
    with torch.no_grad():
        mix.gamma.fill_(0.7)
    torch.testing.assert_close(mix(layers).double(), _by_hand(layers, w, 0.7), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("lengths", [[1], [5, 1, 3], [7, 7]])
def test_layer_norm_uses_only_unmasked_elements(lengths):
    B, T, D = len(lengths), max(lengths), 6
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    layers = [torch.randn(B, T, D) * 3 + 2 for _ in range(3)]
    # values in padded slots must not change the normalised unmasked values
    poisoned = [torch.where(mask[..., None], x, torch.full_like(x, 1e6)) for x in layers]
    w = torch.randn(3).tolist()
    mix = ScalarMix(3, do_layer_norm=True, initial_scalar_parameters=w)
    got = mix(poisoned, mask)
    expected = _by_hand(layers, w, 1.0, mask)
    torch.testing.assert_close(got[mask].double(), expected[mask], atol=1e-5, rtol=1e-5)


def test_default_is_an_even_mix_and_trains():
    layers = [torch.randn(2, 3, 4) for _ in range(3)]
    mix = ScalarMix(3)
    torch.testing.assert_close(mix(layers), sum(layers) / 3)
    mix(layers).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mix.scalar_parameters)
    assert mix.gamma.grad is not None


def test_fixed_parameters_do_not_train():
    mix = ScalarMix(3, initial_scalar_parameters=[0.1, -0.2, 0.3], trainable=False)
    assert not any(p.requires_grad for p in mix.parameters())


def test_gradcheck_float64():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    layers = [torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
    for ln in (False, True):
        assert torch.autograd.gradcheck(lambda w, g, *xs: scalar_mix_ref(list(xs), w, g, mask, ln), (w, g, *layers))


def test_state_dict_has_allennlp_layout():
    mix = ScalarMix(3)
    state = {
        "scalar_parameters.0": torch.tensor([0.5]),
        "scalar_parameters.1": torch.tensor([1.0]),
        "scalar_parameters.2": torch.tensor([-1.0]),
        "gamma": torch.tensor([2.0]),
    }
    assert set(mix.state_dict()) == set(state)
    mix.load_state_dict(state)
    layers = [torch.randn(2, 3, 4) for _ in range(3)]
    torch.testing.assert_close(mix(layers).double(), _by_hand(layers, [0.5, 1.0, -1.0], 2.0), atol=1e-6, rtol=1e-6)


def test_errors():
    with pytest.raises(ElmoFastError, match="2 initial scalar parameters"):
        ScalarMix(3, initial_scalar_parameters=[0.0, 1.0])
    with pytest.raises(ElmoFastError, match="needs the mask"):
        ScalarMix(2, do_layer_norm=True)([torch.randn(1, 2, 3)] * 2)
    with pytest.raises(ElmoFastError, match="2 layers given to a mixture of 3"):
        ScalarMix(3)([torch.randn(1, 2, 3)] * 2)
