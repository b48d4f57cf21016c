"""The one tolerance table of the project: every comparison of a fast op with its oracle uses it.

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

from elmo_fast.bilm.precision import PRECISIONS

TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(atol=1e-12, rtol=0.0),
    torch.float32: dict(atol=1e-5, rtol=0.0),
    torch.bfloat16: dict(atol=2e-2, rtol=1e-2),
    torch.float16: dict(atol=2.5e-3, rtol=1.25e-3),
}


#: The whole model in each precision (elmo_fast.bilm.precision, which states these bounds, as the
#: README does), against the fp32 reference, per output layer: max abs error <= max_rel of the
#: layer's max |value|, RMS error <= rms_rel of its RMS. bf16 (GEMMs in bf16, fp32 accumulation,
#: cell state and elementwise): measured max 0.8% at default scales, 2.5% with the clips exercised,
#: RMS ~0.2-0.5%. tf32 and fp16 round GEMM inputs to 11 significant bits, 8x finer than bf16's 8:
#: simulated (reference biLM with its GEMM operands rounded so) max ~0.1%, RMS ~0.07%.
MODEL_BOUNDS = {p.name: dict(max_rel=p.bound.max_rel, rms_rel=p.bound.rms_rel)
                for p in PRECISIONS.values() if p.bound.rms_rel is not None}
MODEL_BF16 = MODEL_BOUNDS["bf16"]


#: Gradients of the fast ops' backward passes against the reference twin's autograd, computed in
#: float64 on the same (already rounded) inputs. A gradient's entries span orders of magnitude (a
#: weight's gradient sums over every token), so the bar is relative to the gradient's scale:
#:     max |actual - expected| <= rtol * max |expected|        (over the whole gradient tensor)
#: float64: summation order only. float32: 1e-5 of the largest entry (~100 ulp of it), room for the
#: fp32 recurrence over a few dozen steps and the long sums of the weight gradients. bfloat16 and
#: float16 (kernels computing in fp32 and rounding the result once: the highway gate; the char CNN on
#: CUDA): two half-ulps of the largest entry, 2^-8 and 2^-10.
GRAD_RTOL: dict[torch.dtype, float] = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 4e-3,
                                       torch.float16: 1e-3}


def assert_grad_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                      what: str = "") -> None:
    """Assert max |actual - expected| <= GRAD_RTOL[dtype] * max |expected| (dtype default: actual's).

    An all-zero expected gradient must be matched exactly (0 <= 0); NaN anywhere fails.
    """
    dtype = actual.dtype if dtype is None else dtype
    prefix = f"{what}: " if what else ""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{prefix}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    if actual.numel() == 0:
        return
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    err = (a - e).abs().max().item()
    scale = e.abs().max().item()
    bound = GRAD_RTOL[dtype] * scale
    assert err <= bound, (f"{prefix}max abs error {err:.3e} > {GRAD_RTOL[dtype]:g} * max |expected| "
                          f"({scale:.3e}) for {dtype}")


def max_abs_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| in float64 (0.0 for empty tensors, nan if any side has a NaN)."""
    if actual.numel() == 0:
        return 0.0
    return (actual.detach().double().cpu() - expected.detach().double().cpu()).abs().max().item()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                 what: str = "") -> None:
    """Assert ``actual`` matches ``expected`` within ``TOL[dtype]`` (default: ``actual.dtype``).

    The message gives the max abs error, where it is and the tolerance, e.g.
    ``highway_gate N=7 H=3: max abs error 3.1e-04 at (2, 1) > atol 1e-05 + rtol 0 * |expected|``.
    NaN anywhere fails (NaN never passes as "close").
    """
    dtype = actual.dtype if dtype is None else dtype
    tol = TOL[dtype]
    prefix = f"{what}: " if what else ""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{prefix}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    if actual.numel() == 0:
        return
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    err = (a - e).abs()
    allowed = tol["atol"] + tol["rtol"] * e.abs()
    bad = ~(err <= allowed)  # NaN in either side counts as bad
    if bool(bad.any()):
        worst = torch.where(err.isnan(), torch.full_like(err, float("inf")), err - allowed)
        idx = tuple(int(i) for i in torch.unravel_index(worst.argmax(), err.shape))
        raise AssertionError(
            f"{prefix}max abs error {err.max().item():.3e} ({int(bad.sum())} of {err.numel()} elements "
            f"out of tolerance; worst at {idx}: actual {a[idx].item()!r}, expected {e[idx].item()!r}) "
            f"> atol {tol['atol']:g} + rtol {tol['rtol']:g} * |expected| for {dtype}")
