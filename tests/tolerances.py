"""The tests' assertions over the project's bounds: per op, the one tolerance table
:mod:`elmo_fast.bilm.tolerances` (in the package so that ``elmo-fast doctor`` and
``ELMO_FAST_SELFCHECK`` hold the installed ops to the same bounds; its docstring says where each
bound comes from); for the whole model, each precision's stated bound (:mod:`elmo_fast.bilm.precision`).
"""
from __future__ import annotations

import torch

from elmo_fast.bilm.precision import PRECISIONS
from elmo_fast.bilm.tolerances import GRAD_RTOL, TOL, max_abs_error

__all__ = ["GRAD_RTOL", "MODEL_BF16", "MODEL_BOUNDS", "TOL", "assert_close", "assert_grad_close", "max_abs_error"]


#: The whole model in each precision (elmo_fast.bilm.precision, which states these bounds, as the
#: README does), against the fp32 reference, per output layer: max abs error <= max_rel of the
#: layer's max |value|, RMS error <= rms_rel of its RMS. bf16 (GEMMs in bf16, fp32 accumulation,
#: cell state and elementwise): measured max 0.8% at default scales, 2.5% with the clips exercised,
#: RMS ~0.2-0.5%. tf32 and fp16 round GEMM inputs to 11 significant bits, 8x finer than bf16's 8:
#: simulated (reference biLM with its GEMM operands rounded so) max ~0.1%, RMS ~0.07%.
MODEL_BOUNDS = {p.name: dict(max_rel=p.bound.max_rel, rms_rel=p.bound.rms_rel)
                for p in PRECISIONS.values() if p.bound.rms_rel is not None}
MODEL_BF16 = MODEL_BOUNDS["bf16"]


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
