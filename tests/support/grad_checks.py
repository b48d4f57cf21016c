"""Backward passes against the autograd of their reference twins: gradients of sum(w * out) for fresh
random w, compared with tolerances.assert_grad_close (max error relative to the gradient's largest entry),
the fast side in the inputs' dtype, the reference in float64 on the same rounded inputs.

Tests of backward passes run with @poisoned: every tensor the ops allocate (torch.empty, inside the ops
too) starts as NaN, deterministic mode's fill of uninitialized memory, so an element a kernel forgets to
write fails the comparison."""

import pytest
import torch
from tolerances import GRAD_RTOL, assert_grad_close


@pytest.fixture
def poisoned_allocations(monkeypatch):
    """torch.empty, also inside the ops, returns NaN-filled memory while deterministic mode is on (cuBLAS
    then needs a fixed workspace configuration)."""
    assert torch.utils.deterministic.fill_uninitialized_memory
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


poisoned = pytest.mark.usefixtures("poisoned_allocations")


def grads(fn, inputs, seed=0, weights=None):
    """The gradients of sum(w * out) over fn's outputs w.r.t. inputs (fresh random w unless given), and w."""
    outs = fn(*inputs)
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    if weights is None:
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
    got = torch.autograd.grad(outs, inputs, weights, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, got)], weights


def leaves(tensors, dtype=None):
    return [t.detach().to(dtype or t.dtype).clone().requires_grad_() for t in tensors]


def check_grads(fast, ref, inputs, what, seed=0):
    """fast's gradients in the inputs' dtype against ref's in float64 on the same (rounded) inputs."""
    got, w = grads(fast, leaves(inputs), seed)
    want, _ = grads(ref, leaves(inputs, torch.float64), weights=[x.double() for x in w])
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.dtype == inputs[i].dtype, what
        assert_grad_close(g, e, dtype=inputs[i].dtype, what=f"{what} input {i}")
    return got, want


def ref_grads(fn, inputs, weights):
    """Gradients of sum(w * out) over fn's outputs w.r.t. inputs, in float64."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    pairs = [(o, w.double()) for o, w in zip(outs, weights) if w is not None]
    if not pairs:
        return [torch.zeros_like(x) for x in leaves]
    got = torch.autograd.grad([o for o, _ in pairs], leaves, [w for _, w in pairs], allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, got)]


def assert_low_precision_grad(got, want, dtype, what):
    """bf16/fp16 kernels compute in fp32 and round once: GRAD_RTOL's bound for the dtype."""
    err = (got.cpu().double() - want).abs().max().item() if got.numel() else 0.0
    scale = want.abs().max().item() if want.numel() else 0.0
    assert err <= GRAD_RTOL[dtype] * scale + 1e-30, f"{what}: error {err:.3g} > {GRAD_RTOL[dtype]} x {scale:.3g}"
