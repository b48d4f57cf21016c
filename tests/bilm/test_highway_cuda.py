"""highway_gate and the highway stack's CUDA kernels, forward and backward, against their references.

Two targets run each test (tests/support/cuda_targets.py): "cuda", the kernels on a GPU (skips, saying
why, without one), and "emulated", the same kernels and bindings compiled for the CPU emulator (a default
subset; every case with ELMO_FAST_CUDA_EMULATION=1). Outputs come from a poisoned allocator; the backward
passes run with @poisoned (tests/support/grad_checks.py); TF32 is off (exact_fp32)."""

import pytest
import torch
from cuda_targets import (
    ALL_DTYPES,
    LOW_PRECISION,
    emulated_by_default,
    exact_fp32,  # noqa: F401  (autouse: TF32 off)
    needs_cpu_ops,
    no_nan,
    on,
    poison,
    same_layout_on,
)
from grad_checks import assert_low_precision_grad, poisoned, ref_grads
from highway_cases import gate_case, highway_inputs, make
from tolerances import TOL, assert_close, assert_grad_close, max_abs_error

from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import highway_gate_ref, highway_ref


@emulated_by_default(
    lambda n, h, layout, dtype: (
        (n, h) in ((7, 16), (129, 257)) and layout == "sliced" and dtype in (torch.float32, torch.bfloat16)
    )
)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "strided_rows", "transposed"])
@pytest.mark.parametrize("n,h", [(0, 3), (1, 1), (2, 3), (7, 16), (129, 257), (33, 2048)])
def test_highway_gate(target, n, h, layout, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=31 * n + h, layout=layout)
    what = f"{target.name} highway_gate {layout} N={n} H={h} {dtype}"
    poison(target)
    out = target.op("highway_gate")(same_layout_on(projected, target.device), same_layout_on(x, target.device))
    assert out.shape == (n, h) and out.dtype == dtype and out.is_contiguous() and out.device == target.device, what
    assert_close(out, highway_gate_ref(projected.double(), x.double()), what=what)


@emulated_by_default()
def test_highway_gate_propagates_nan_and_inf(target):
    projected = torch.tensor([[float("nan"), 1.0, 0.0, 0.0], [1.0, float("inf"), 0.0, float("-inf")]])
    x = torch.tensor([[1.0, 1.0], [2.0, 3.0]])
    out = target.op("highway_gate")(projected.to(target.device), x.to(target.device)).cpu()
    expected = highway_gate_ref(projected, x)
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out[~expected.isnan()], expected[~expected.isnan()])


def test_highway_gate_many_rows_use_the_grid_stride_loop(cuda_target):
    # More rows than the 65535 blocks grid.y allows: rows past it come from the kernel's row loop.
    projected, x = highway_inputs(70001, 3, torch.float32, seed=5)
    poison(cuda_target)
    out = ops.highway_gate(projected.cuda(), x.cuda())
    assert_close(out, highway_gate_ref(projected.double(), x.double()), what="highway_gate N=70001")


@emulated_by_default(
    lambda n, f, p, layers, dtype, sliced: (n, f) == (7, 33) and sliced and dtype in (torch.float32, torch.bfloat16)
)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("n,f,p,layers", [(0, 5, 3, 1), (1, 1, 1, 1), (7, 33, 5, 2), (129, 124, 16, 2), (3, 8, 4, 0)])
@pytest.mark.parametrize("sliced", [False, True])
def test_highway(target, n, f, p, layers, dtype, sliced):
    x, ws, bs, pw, pb = make(n, f, p, layers, dtype, seed=n + f, sliced=sliced)
    what = f"{target.name} highway n={n} f={f} p={p} layers={layers} {dtype}"
    dev = target.device
    poison(target)
    got = target.op("highway")(
        same_layout_on(x, dev), [same_layout_on(w, dev) for w in ws], [b.to(dev) for b in bs], pw.to(dev), pb.to(dev)
    )
    assert got.shape == (n, p) and got.dtype == dtype and got.device == dev, what
    expected = highway_ref(x.double(), [w.double() for w in ws], [b.double() for b in bs], pw.double(), pb.double())
    if dtype in LOW_PRECISION:
        # GEMMs in bf16/fp16 (fp32 accumulation): bound the error by PyTorch's own in that dtype.
        torch_lowp = highway_ref(x.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], pw.to(dev), pb.to(dev))
        assert max_abs_error(got, expected) <= 2 * max_abs_error(torch_lowp, expected) + 1e-2, what
        no_nan(got, what)
    else:
        assert_close(got, expected, dtype=dtype, what=what)
        if target.is_cuda and dtype == torch.float32:  # and the reference on the same device
            same = highway_ref(x.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], pw.to(dev), pb.to(dev))
            assert max_abs_error(got, same) <= TOL[torch.float32]["atol"], what


def test_highway_ops_opcheck(cuda_target):
    projected, x = highway_inputs(7, 16, torch.float32, seed=1, layout="sliced")
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (projected.cuda(), x.cuda()))
    args = [t.cuda() if isinstance(t, torch.Tensor) else [u.cuda() for u in t] for t in make(6, 10, 4, 2)]
    torch.library.opcheck(torch.ops.elmo_fast.highway.default, tuple(args))


def test_highway_errors_name_the_argument_on_cuda(cuda_target):
    dev = cuda_target.device
    with pytest.raises(RuntimeError, match="highway_gate: projected and x must be on the same device"):
        torch.ops.elmo_fast.highway_gate.default(torch.randn(4, 8), torch.randn(4, 4, device=dev))
    with pytest.raises(RuntimeError, match="highway_gate: x must be a CUDA tensor, got cpu"):
        torch.ops.elmo_fast.highway_gate.default(torch.randn(4, 8, device=dev), torch.randn(4, 4))
    with pytest.raises(RuntimeError, match="highway_gate: x has dtype int64; supported on CUDA"):
        torch.ops.elmo_fast.highway_gate.default(
            torch.zeros(4, 8, dtype=torch.long, device=dev), torch.zeros(4, 4, dtype=torch.long, device=dev)
        )
    with pytest.raises(RuntimeError, match=r"highway: highway_weights\[0\] and highway_biases\[0\] must be on x's"):
        torch.ops.elmo_fast.highway.default(
            torch.randn(2, 3, device=dev),
            [torch.randn(6, 3)],
            [torch.randn(6)],
            torch.randn(2, 3, device=dev),
            torch.randn(2, device=dev),
        )


# --- highway_gate_backward ------------------------------------------------------------------------


@needs_cpu_ops
@poisoned
@emulated_by_default(
    lambda n, h, layout, dtype: (
        ((n, h), layout, dtype) in (((129, 257), "sliced", torch.float32), ((7, 16), "contiguous", torch.bfloat16))
    )
)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "transposed"])
@pytest.mark.parametrize("n,h", [(0, 3), (1, 1), (7, 16), (129, 257), (33, 2048)])
def test_highway_gate_backward(target, n, h, layout, dtype):
    projected, x = gate_case(n, h, dtype, seed=n + h, layout=layout)
    grad = torch.randn(n, h, generator=torch.Generator().manual_seed(h), dtype=torch.float64).to(dtype)
    what = f"{target.name} highway_gate_backward N={n} H={h} {layout} {dtype}"
    poison(target)
    got = target.op("highway_gate_backward")(on(target, grad), on(target, projected), on(target, x))
    want = ref_grads(highway_gate_ref, [projected, x], [grad])
    for name, g, w, shape in zip(("grad_projected", "grad_x"), got, want, ((n, 2 * h), (n, h))):
        assert g.shape == shape and g.dtype == dtype and g.is_contiguous() and g.device == target.device, what
        if dtype in LOW_PRECISION:
            assert_low_precision_grad(g, w, dtype, f"{what} {name}")
        else:
            assert_grad_close(g, w, dtype=dtype, what=f"{what} {name}")


@needs_cpu_ops
@poisoned
@emulated_by_default()
def test_highway_gate_backward_expanded_gradient(target):
    projected, x = gate_case(9, 5, torch.float32, seed=1)
    grad = torch.ones(1, 1).expand(9, 5)  # out.sum()'s gradient: stride 0 everywhere
    got = target.op("highway_gate_backward")(grad.to(target.device), on(target, projected), on(target, x))
    want = ref_grads(highway_gate_ref, [projected, x], [grad])
    for g, w in zip(got, want):
        assert_grad_close(g, w, dtype=torch.float32, what=f"{target.name} highway_gate_backward expanded")
