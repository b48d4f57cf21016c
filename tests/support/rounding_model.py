"""The fp32 rounding-error model behind the whole-model fp32 bound (derivation: tests/support/tolerances.py,
"The fp32 bar from a rounding-error model").

Every GEMM and convolution of the reference's computation (F.linear, F.conv1d) is run in float64 and its
output perturbed by independent Gaussian noise of the standard deviation that fp32 rounding gives a
dot product of K terms p_i = x_i w_i under the probabilistic model,

    sigma = u sqrt((K + e) / 6) ||p||_2,   u = 2^-24,   e = 0 with FMA (one rounding per term), 2 without,

so that the deviation of the outputs from the unperturbed float64 run is a sample of the fp32 error the
model predicts, propagated through the highway layers and every LSTM step as the computation itself
propagates it (clips, gates and skip connections included). Nothing here reads an fp32 result.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

U32 = 2.0**-24


def dot_sigma(p_sq_sum: Tensor, terms: int, fma: bool) -> Tensor:
    """The model's standard deviation of an fp32 dot product's error, from sum_i (x_i w_i)^2."""
    return U32 * math.sqrt((terms + (0 if fma else 2)) / 6.0) * p_sq_sum.clamp_min(0).sqrt()


class _NoisyFunctional(SimpleNamespace):
    """torch.nn.functional with linear and conv1d perturbed by the model's noise (float64 only)."""

    def __init__(self, fma: bool, generator: torch.Generator) -> None:
        super().__init__()
        self._fma = fma
        self._gen = generator

    def __getattr__(self, name):
        return getattr(F, name)

    def _noise(self, out: Tensor, p_sq_sum: Tensor, terms: int) -> Tensor:
        sigma = dot_sigma(p_sq_sum, terms, self._fma)
        return out + sigma * torch.randn(out.shape, generator=self._gen, dtype=out.dtype)

    def linear(self, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        return self._noise(F.linear(x, w, b), F.linear(x * x, w * w), w.shape[-1])

    def conv1d(self, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        return self._noise(F.conv1d(x, w, b), F.conv1d(x * x, w * w), w.shape[1] * w.shape[2])


@contextlib.contextmanager
def rounding_noise(module, fma: bool, seed: int) -> Iterator[None]:
    """Within the block, `module`'s F (the reference's torch.nn.functional) adds the model's noise."""
    saved = module.F
    module.F = _NoisyFunctional(fma, torch.Generator().manual_seed(seed))
    try:
        yield
    finally:
        module.F = saved


def modeled_error(run: Callable[[], list[Tensor]], module, fma: bool, samples: int = 2) -> float:
    """max |run() with the model's noise - run()| over every output element and `samples` draws; `run`
    computes in float64 through `module` (e.g. elmo_fast.bilm.reference)."""
    exact = [t.detach().double() for t in run()]
    worst = 0.0
    for seed in range(samples):
        with rounding_noise(module, fma, seed):
            noisy = run()
        for a, b in zip(noisy, exact):
            if a.numel():
                worst = max(worst, float((a.detach().double() - b).abs().max()))
    return worst
