"""The highway room on the CPU: the highway stack + projection op (ops.highway) and the gate (ops.highway_gate)
against their references, highway_ref and highway_gate_ref, forward and backward; and the reference's own
gradients. The CUDA kernels' tests: test_highway_cuda.py."""

import pytest
import torch
from bilm_cases import MINI
from grad_checks import check_grads, leaves, poisoned
from highway_cases import gate_case, highway_case, highway_inputs, make
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close, max_abs_error

from elmo_fast import load_options, load_weights
from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import highway_gate_ref, highway_ref

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n,f,p,layers", [(0, 5, 3, 1), (1, 1, 1, 1), (7, 33, 5, 2), (129, 124, 16, 2), (3, 8, 4, 0)])
@pytest.mark.parametrize("sliced", [False, True])
def test_highway_matches_reference(n, f, p, layers, dtype, sliced):
    x, ws, bs, pw, pb = make(n, f, p, layers, dtype, seed=n + f, sliced=sliced)
    expected = highway_ref(
        *(t.double() if isinstance(t, torch.Tensor) else [u.double() for u in t] for t in (x, ws, bs, pw, pb))
    )
    got = ops.highway(x, ws, bs, pw, pb)
    assert got.shape == (n, p) and got.dtype == dtype
    assert_close(got, expected.to(dtype), dtype=dtype, what=f"highway n={n} f={f} p={p} layers={layers}")


@needs_extension
def test_highway_on_the_fixture_weights(tiny_files):
    w = load_weights(tiny_files[1], load_options(tiny_files[0]))
    x = torch.rand(57, w.options.n_filters) * 4
    got = ops.highway(x, w.highway_weights, w.highway_biases, w.proj_weight, w.proj_bias)
    want = highway_ref(x, w.highway_weights, w.highway_biases, w.proj_weight, w.proj_bias)
    assert_close(got, want, dtype=torch.float32, what="highway on bilm-tf tiny")


@needs_extension
def test_highway_opcheck():
    x, ws, bs, pw, pb = make(6, 10, 4, 2)
    torch.library.opcheck(torch.ops.elmo_fast.highway.default, (x, ws, bs, pw, pb))


@needs_extension
@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.__setitem__(1, [a[1][0][:, :-1]] + a[1][1:]), r"highway_weights\[0\] must have shape"),
        (lambda a: a.__setitem__(2, a[2][:1]), "same length"),
        (lambda a: a.__setitem__(3, a[3][:, :-1]), "proj_weight must have shape"),
        (lambda a: a.__setitem__(4, a[4][:-1]), "proj_bias must have shape"),
        (lambda a: a.__setitem__(0, a[0][None]), "x must have 2 dims"),
        (lambda a: a.__setitem__(3, a[3].double()), "proj_weight"),
    ],
)
def test_highway_errors_name_the_argument(change, match):
    args = make(4, 6, 3, 2)
    change(args)
    with pytest.raises(RuntimeError, match=match):
        ops.highway(*args)


# --- highway_gate ---------------------------------------------------------------------------------


DTYPES = [torch.float32, torch.float64, torch.bfloat16]
NS = [0, 1, 2, 7, 129]
HS = [1, 3, 16, 257]


def check_highway(projected, x, what):
    out = ops.highway_gate(projected, x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous(), what
    assert not out.isnan().any(), f"{what}: NaN in output"
    # The oracle in float64 on the same rounded inputs: the table bounds the kernel's own error.
    expected = highway_gate_ref(projected.double(), x.double())
    assert_close(out, expected, what=what)
    return out, expected


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("h", HS)
@pytest.mark.parametrize("n", NS)
def test_highway_gate_matches_reference(n, h, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=1000 * n + h)
    check_highway(projected, x, f"highway_gate N={n} H={h} {dtype}")


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["sliced", "strided_rows", "transposed"])
@pytest.mark.parametrize("n,h", [(1, 1), (2, 3), (7, 16), (129, 257)])
def test_highway_gate_non_contiguous(n, h, layout, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=7 * n + h, layout=layout)
    if layout != "contiguous" and n > 1 and h > 1:
        assert not (projected.is_contiguous() and x.is_contiguous()), "test data should be non-contiguous"
    check_highway(projected, x, f"highway_gate {layout} N={n} H={h} {dtype}")


@needs_extension
def test_highway_gate_bf16_no_worse_than_pytorch_bf16():
    # fp32 inside and one rounding should beat (or tie) PyTorch computing the formula in bf16.
    projected, x = highway_inputs(129, 257, torch.bfloat16, seed=3)
    out, expected = check_highway(projected, x, "highway_gate bf16")
    torch_bf16 = highway_gate_ref(projected, x)
    assert max_abs_error(out, expected) <= max_abs_error(torch_bf16, expected) + 1e-6


@needs_extension
def test_highway_gate_multithreaded_rows_match_single_thread():
    # Enough elements for at::parallel_for to split rows across threads; results are per-row
    # independent, so they must be bitwise identical to a single-threaded run.
    projected, x = highway_inputs(4099, 33, torch.float32, seed=11, layout="sliced")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = ops.highway_gate(projected, x)
    finally:
        torch.set_num_threads(threads)
    multi = ops.highway_gate(projected, x)
    assert torch.equal(single, multi)
    assert_close(multi, highway_gate_ref(projected.double(), x.double()), what="highway_gate 4099x33")


@needs_extension
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 40),
    h=st.integers(1, 70),
    seed=st.integers(0, 2**31 - 1),
    layout=st.sampled_from(["contiguous", "sliced", "strided_rows", "transposed"]),
    dtype=st.sampled_from(DTYPES),
)
def test_highway_gate_random_shapes(n, h, seed, layout, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=seed, layout=layout)
    check_highway(projected, x, f"highway_gate {layout} N={n} H={h} {dtype} seed={seed}")


@needs_extension
def test_highway_gate_propagates_nan_and_inf():
    projected = torch.tensor([[float("nan"), 1.0, 0.0, 0.0], [1.0, float("inf"), 0.0, float("-inf")]])
    x = torch.tensor([[1.0, 1.0], [2.0, 3.0]])
    out = ops.highway_gate(projected, x)
    expected = highway_gate_ref(projected, x)
    assert torch.equal(out.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(out[finite], expected[finite])


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "n,h,layout", [(0, 3, "contiguous"), (1, 1, "contiguous"), (7, 16, "sliced"), (5, 3, "transposed")]
)
def test_highway_gate_opcheck(n, h, layout, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=n + h, layout=layout)
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (projected, x))


@needs_extension
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch internals
@pytest.mark.slow
def test_highway_gate_torch_compile_fullgraph():
    def f(projected, x):
        return ops.highway_gate(projected * 0.5, x) + 1.0

    compiled = torch.compile(f, fullgraph=True)
    for n in (3, 7):  # a second shape: recompiles or goes dynamic, either way no graph break
        projected, x = highway_inputs(n, 16, torch.float32, seed=n)
        assert_close(
            compiled(projected, x),
            highway_gate_ref(projected.double() * 0.5, x.double()) + 1.0,
            what=f"compiled highway_gate N={n}",
        )


@needs_extension
@pytest.mark.parametrize(
    "projected_shape,x_shape,match",
    [
        ((4, 32), (4, 16, 1), "highway_gate: x must have 2 dims, got 3"),
        ((4 * 32,), (4, 16), "highway_gate: projected must have 2 dims, got 1"),
        ((5, 32), (4, 16), "highway_gate: projected and x must have the same number of rows N, got 5 and 4"),
        ((4, 30), (4, 16), r"highway_gate: projected must have 2 \* H = 32 columns"),
        ((4, 16), (4, 16), r"highway_gate: projected must have 2 \* H = 32 columns"),
    ],
)
def test_highway_gate_shape_errors_name_the_argument(projected_shape, x_shape, match):
    with pytest.raises(RuntimeError, match=match):
        ops.highway_gate(torch.randn(projected_shape), torch.randn(x_shape))


@needs_extension
def test_highway_gate_dtype_errors_name_the_argument():
    with pytest.raises(RuntimeError, match="projected and x must have the same dtype, got float32 and float64"):
        ops.highway_gate(torch.randn(4, 32), torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="highway_gate: x has dtype float16; supported: float32, float64, bfloat16"):
        ops.highway_gate(torch.randn(4, 32, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16))


# --- backward passes, against the reference's autograd (tests/support/grad_checks.py) -------------


def highway_fns(layers, via_op):
    def fast(x, *w):
        args = (x, list(w[:layers]), list(w[layers : 2 * layers]), w[-2], w[-1])
        return torch.ops.elmo_fast.highway.default(*args) if via_op else ops.highway(*args)

    def ref(x, *w):
        return highway_ref(x, list(w[:layers]), list(w[layers : 2 * layers]), w[-2], w[-1])

    return fast, ref


@needs_extension
@poisoned
@pytest.mark.parametrize("via_op", [True, False], ids=["op", "ops.highway"])
@pytest.mark.parametrize("layers", [0, 1, 2])
def test_highway_gradcheck(layers, via_op):
    fast, _ = highway_fns(layers, via_op)
    assert torch.autograd.gradcheck(fast, leaves(highway_case(5, 4, 3, layers, torch.float64, seed=layers)))


@needs_extension
@poisoned
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("via_op", [True, False], ids=["op", "ops.highway"])
@pytest.mark.parametrize("n,f,p,layers", [(1, 3, 2, 1), (7, 17, 5, 2), (129, 64, 16, 2)])
def test_highway_grads_match_reference(n, f, p, layers, via_op, dtype):
    fast, ref = highway_fns(layers, via_op)
    check_grads(fast, ref, highway_case(n, f, p, layers, dtype, seed=n), f"highway N={n} F={f} L={layers} {dtype}")


@needs_extension
@poisoned
def test_highway_training_path_gives_the_ops_values():
    # With gradients needed, ops.highway runs the op's steps one by one: the same kernels, the same values.
    case = highway_case(33, 24, 8, 2, torch.float32, seed=4)
    fast, _ = highway_fns(2, via_op=False)
    op, _ = highway_fns(2, via_op=True)
    trained = fast(*leaves(case))
    assert trained.requires_grad and trained.grad_fn is not None
    assert torch.equal(trained.detach(), op(*case))


@needs_extension
@poisoned
def test_highway_gate_gradcheck():
    assert torch.autograd.gradcheck(ops.highway_gate, leaves(gate_case(6, 5, torch.float64, seed=1)))


@needs_extension
@poisoned
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "transposed"])
@pytest.mark.parametrize("n,h", [(0, 3), (1, 1), (7, 16), (129, 257)])
def test_highway_gate_grads_match_reference(n, h, layout, dtype):
    check_grads(
        ops.highway_gate,
        highway_gate_ref,
        gate_case(n, h, dtype, seed=n + h, layout=layout),
        f"highway_gate N={n} H={h} {layout} {dtype}",
    )


# --- the reference's own gradients, under gradcheck in float64 ------------------------------------


def test_gradcheck_highway(mini):
    torch.manual_seed(0)
    x = torch.randn(4, MINI.n_filters, dtype=torch.float64, requires_grad=True)
    inputs = [x, *leaves([*mini.highway_weights, *mini.highway_biases, mini.proj_weight, mini.proj_bias])]
    H = MINI.n_highway

    def f(x, *w):
        return highway_ref(x, list(w[:H]), list(w[H : 2 * H]), w[-2], w[-1])

    assert torch.autograd.gradcheck(f, inputs)
