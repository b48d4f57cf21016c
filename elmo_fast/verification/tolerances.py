"""The one tolerance table of the project's ops: every comparison of a fast op with its reference twin
uses it (the tests through tests/support/tolerances.py, ``elmo-fast doctor`` and ``ELMO_FAST_SELFCHECK`` through
:mod:`elmo_fast.verification.selfcheck`). The whole model's bound in each precision is
:mod:`elmo_fast.bilm.precision`'s (fp32's is this table's float32 row).

Tolerances are for outputs of magnitude ~1, checked elementwise as |actual - expected| <=
atol + rtol * |expected|, where ``expected`` is the reference computed in float64 on the same
(already rounded) inputs, so the table bounds the op's own error, not input rounding.

* float64: only summation order differs from the oracle; 1e-12 leaves room for long reductions.
* float32: the project's bar, max abs error <= 1e-5 (rtol 0): ~100 ulp at 1.0, room for fp32
  accumulation in matmuls and LSTM recurrences, far below anything that moves an embedding.
* bfloat16: 8-bit mantissa, one rounding costs up to 2^-9 ~ 2e-3 relative. Kernels compute in
  fp32 and round once, but a layer chains a few bf16 roundings (matmul inputs, stored states):
  rtol 1e-2 is ~5 roundings, atol 2e-2 covers cancellation near 0 at output magnitude ~1.
* float16: 11-bit mantissa, one rounding ~ 2^-12 ~ 2.4e-4 relative: the bf16 budget scaled by 8.
"""

from __future__ import annotations

import torch
from torch import Tensor

TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(atol=1e-12, rtol=0.0),
    torch.float32: dict(atol=1e-5, rtol=0.0),
    torch.bfloat16: dict(atol=2e-2, rtol=1e-2),
    torch.float16: dict(atol=2.5e-3, rtol=1.25e-3),
}


#: Gradients of the fast ops' backward passes against the reference twin's autograd, computed in
#: float64 on the same (already rounded) inputs. A gradient's entries span orders of magnitude (a
#: weight's gradient sums over every token), so the bar is relative to the gradient's scale:
#:     max |actual - expected| <= rtol * max |expected|        (over the whole gradient tensor)
#: float64: summation order only. float32: 1e-5 of the largest entry (~100 ulp of it), room for the
#: fp32 recurrence over a few dozen steps and the long sums of the weight gradients. bfloat16 and
#: float16 (kernels computing in fp32 and rounding the result once: the highway gate; the char CNN on
#: CUDA): two half-ulps of the largest entry, 2^-8 and 2^-10.
GRAD_RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.bfloat16: 4e-3,
    torch.float16: 1e-3,
}


#: torch.autograd.gradcheck's defaults, for a float64 check of an op's backward against central
#: differences of its forward (step 1e-6: truncation ~1e-12, rounding ~1e-10 at values ~1).
GRADCHECK = dict(eps=1e-6, atol=1e-5, rtol=1e-3)


def max_abs_error(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| in float64 (0.0 for empty tensors, nan if any side has a NaN)."""
    if actual.numel() == 0:
        return 0.0
    return (actual.detach().double().cpu() - expected.detach().double().cpu()).abs().max().item()


def tolerance_ratio(actual: Tensor, expected: Tensor, dtype: torch.dtype) -> float:
    """max over elements of |actual - expected| / (atol + rtol * |expected|) with ``TOL[dtype]``:
    <= 1 within the table's bound (0.0 for empty tensors, inf where either side has a NaN)."""
    if actual.numel() == 0:
        return 0.0
    tol = TOL[dtype]
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    ratio = (a - e).abs() / (tol["atol"] + tol["rtol"] * e.abs())
    return float("inf") if bool(ratio.isnan().any()) else ratio.max().item()


def grad_ratio(actual: Tensor, expected: Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(max |actual - expected|, its bound ``GRAD_RTOL[dtype] * max |expected|``) for one gradient.
    An all-zero expected gradient must be matched exactly (bound 0); NaN gives an inf error."""
    if actual.numel() == 0:
        return 0.0, 0.0
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    diff = (a - e).abs()
    err = float("inf") if bool(diff.isnan().any()) else diff.max().item()
    return err, GRAD_RTOL[dtype] * e.abs().max().item()
