"""The tests' assertions over the project's bounds: per op, the one tolerance table
:mod:`elmo_fast.verification.tolerances` (in the package so that ``elmo-fast doctor`` and
``ELMO_FAST_SELFCHECK`` hold the installed ops to the same bounds; its docstring says where each
bound comes from); for the whole model, each precision's stated bound (:mod:`elmo_fast.bilm.precision`).
"""

from __future__ import annotations

import torch

from elmo_fast.bilm.precision import PRECISIONS
from elmo_fast.verification.tolerances import GRAD_RTOL, TOL, max_abs_error

__all__ = ["GRAD_RTOL", "MODEL_BF16", "MODEL_BOUNDS", "TOL", "assert_close", "assert_grad_close", "max_abs_error"]


# --- The fp32 bar from a rounding-error model (the whole model on a GPU, the CUDA emulator) -------------
#
# The 1e-5 bar is the CPU's: there, fp32 GEMMs are MKL's blocked sums and every measured error was a few
# 1e-6. A GPU computes the same dot products in another order, and nvcc fuses a * b + c into one FMA
# (--fmad=true, the default; the emulator is built with -ffp-contract=fast to match). How large may the
# fp32 error of the whole biLM then be? The model (Higham & Mary's probabilistic rounding analysis):
#
#   * every fp32 operation rounds its exact result t to t (1 + d), the d independent, |d| <= u = 2^-24,
#     mean 0, variance <= u^2 / 3 (the error is uniform within half an ulp, and an ulp is <= 2u|t|);
#   * a dot product s = sum_i p_i, p_i = x_i w_i over K terms, accumulated one term after another (what a
#     cuBLAS thread does over K without split-K, and the emulated kernels' loops) with FMA rounds each
#     partial sum t_k = p_1 + ... + p_k once: fl(s) - s = sum_k d_k t_k. Partial sums of terms of either
#     sign grow like a random walk, E[t_k^2] = k ||p||^2 / K, so
#         sigma_FMA^2 = (u^2 / 3) sum_k E[t_k^2] = (u^2 / 3) (K + 1) / 2 ||p||^2 ~ u^2 (K / 6) ||p||_2^2;
#     without FMA each product rounds too: sigma^2 gains (u^2 / 3) ||p||^2, i.e. K -> K + 2. FMA or not,
#     sigma differs by sqrt(1 + 2 / K) <= 1.002 for the model's K >= 512: contraction moves no bound.
#     (A blocked or split-K order has smaller partial sums, hence a smaller sigma: the recursive order is
#     the model's upper estimate.)
#   * the elementwise work of a step (gate sum, sigmoid / tanh, c = f c + i g, m = o tanh(c), the clips)
#     adds a few roundings of relative size u: ~1e-7 at |c| <= 3, below a tenth of one GEMM's sigma
#     (u sqrt(K / 6) ||p||_2 ~ 1e-6 for the recurrent and projection GEMMs at 'original' sizes);
#   * the errors propagate through the highway layers and every LSTM step (gates, cell, clips, skip
#     connections) as the computation propagates them. To first order the output error is linear in the
#     d_k; rather than form the Jacobians, tests/support/rounding_model.py runs the float64 reference with every
#     GEMM and convolution output perturbed by N(0, sigma^2) of its own sigma (||p||_2 from the actual
#     inputs and weights): the deviation from the unperturbed float64 run is a sample of the fp32 error
#     the model predicts, with the step-to-step propagation included. The bound is 1.5x the largest
#     deviation over 2 such samples (the largest of ~10^5 Gaussian-like elements moves by < 20% between
#     samples).
#
# Numbers (random weights of elmo_fast.formats.random_models with the clips exercised, outputs up to |6|, the batch of
# tests/bilm/test_bilm_cuda.py::test_ops_bilm_matches_reference; max abs error against the float64 reference):
#
#   preset     model, FMA   model, no FMA   bound (1.5x)   emulator (FMA)   CPU fast   fp32 reference
#   tiny       1.6e-6       1.6e-6          1e-5 (bar)     1.3e-6           1.3e-6     1.9e-6
#   small      1.10e-5      1.11e-5         1.7e-5         3.1e-6           2.2e-6     4.0e-6
#   original   1.51e-5      1.51e-5         2.3e-5         6.3e-6           4.2e-6     3.7e-6
#
# FMA moves nothing (as derived); the blocked CPU sums stay at a few 1e-6, but a GPU summing 512 and
# 4096 terms one after another may reach the model's 1.1e-5 on 'small' and 1.5e-5 on 'original': the
# 1e-5 bar is not a bound a GPU must meet on these shapes. The GPU tests of the whole model in fp32
# (presets 'small' and 'original') therefore take the model's bound (fp32_model_bound); the CPU keeps
# the bar, and so does the emulator (its GEMMs are the CPU's; tests/bilm/test_bilm_cuda.py runs the
# table's emulator column as test_fp32_error_within_the_rounding_model).
MODEL_BOUND_SAFETY = 1.5


def fp32_model_bound(modeled: float) -> float:
    """The fp32 bound from the model's largest deviation (tests/support/rounding_model.py: modeled_error, with
    FMA), never below the fp32 bar."""
    return max(TOL[torch.float32]["atol"], MODEL_BOUND_SAFETY * modeled)


#: The whole model in each precision (elmo_fast.bilm.precision, which states these bounds, as the
#: README does), against the fp32 reference, per output layer: max abs error <= max_rel of the
#: layer's max |value|, RMS error <= rms_rel of its RMS. bf16 (GEMMs in bf16, fp32 accumulation,
#: cell state and elementwise): measured max 0.8% at default scales, 2.5% with the clips exercised,
#: RMS ~0.2-0.5%. tf32 and fp16 round GEMM inputs to 11 significant bits, 8x finer than bf16's 8:
#: simulated (reference biLM with its GEMM operands rounded so) max ~0.1%, RMS ~0.07%.
MODEL_BOUNDS = {
    p.name: dict(max_rel=p.bound.max_rel, rms_rel=p.bound.rms_rel)
    for p in PRECISIONS.values()
    if p.bound.rms_rel is not None
}
MODEL_BF16 = MODEL_BOUNDS["bf16"]


def assert_grad_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, what: str = ""
) -> None:
    """Assert max |actual - expected| <= GRAD_RTOL[dtype] * max |expected| (dtype default: actual's).

    An all-zero expected gradient must be matched exactly (0 <= 0); NaN anywhere fails.
    """
    dtype = actual.dtype if dtype is None else dtype
    prefix = f"{what}: " if what else ""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{prefix}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    if actual.numel() == 0:
        return
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    err = (a - e).abs().max().item()
    scale = e.abs().max().item()
    bound = GRAD_RTOL[dtype] * scale
    assert err <= bound, (
        f"{prefix}max abs error {err:.3e} > {GRAD_RTOL[dtype]:g} * max |expected| ({scale:.3e}) for {dtype}"
    )


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, what: str = ""
) -> None:
    """Assert ``actual`` matches ``expected`` within ``TOL[dtype]`` (default: ``actual.dtype``).

    The message gives the max abs error, where it is and the tolerance, e.g.
    ``highway_gate N=7 H=3: max abs error 3.1e-04 at (2, 1) > atol 1e-05 + rtol 0 * |expected|``.
    NaN anywhere fails (NaN never passes as "close").
    """
    dtype = actual.dtype if dtype is None else dtype
    tol = TOL[dtype]
    prefix = f"{what}: " if what else ""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{prefix}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
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
            f"> atol {tol['atol']:g} + rtol {tol['rtol']:g} * |expected| for {dtype}"
        )
