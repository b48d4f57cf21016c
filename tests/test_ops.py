"""The compiled ops (elmo_fast._C through elmo_fast.bilm.ops) against their references."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elmo_fast.bilm import ops
from elmo_fast.errors import ExtensionNotBuiltError
from elmo_fast.bilm.reference import highway_gate_ref
from tolerances import TOL, assert_close, max_abs_error

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")

DTYPES = [torch.float32, torch.float64, torch.bfloat16]
NS = [0, 1, 2, 7, 129]
HS = [1, 3, 16, 257]


def highway_inputs(n, h, dtype, seed, layout="contiguous"):
    """projected [N, 2H] and x [N, H] of fresh random values that exercise every branch.

    transform takes both signs (both sides of relu); gate ranges over ~[-12, 12] plus saturating
    entries (+-30, +-100: past the kernel's exp clamp) so g covers (0, 1) and both ends.
    layout "contiguous", "sliced" (columns of wider buffers: row stride > width), "strided_rows"
    (every other row) or "transposed" (x with column stride != 1: the kernel's copy path).
    """
    gen = torch.Generator().manual_seed(seed)
    transform = torch.randn(n, h, generator=gen, dtype=torch.float64) * 2
    gate = torch.randn(n, h, generator=gen, dtype=torch.float64) * 4
    if gate.numel():
        saturate = torch.rand(n, h, generator=gen) < 0.1
        big = torch.tensor([-100.0, -30.0, 30.0, 100.0], dtype=torch.float64)
        gate[saturate] = big[torch.randint(0, 4, (int(saturate.sum()),), generator=gen)]
    x = torch.randn(n, h, generator=gen, dtype=torch.float64) + 0.5
    projected = torch.cat([transform, gate], dim=1).to(dtype)
    x = x.to(dtype)

    def wider(t, left, right):  # t as a column slice of a buffer with other data around it
        buf = torch.randn(t.shape[0], left + t.shape[1] + right, generator=gen, dtype=torch.float64).to(dtype)
        buf[:, left:left + t.shape[1]] = t
        return buf[:, left:left + t.shape[1]]

    def every_other_row(t):
        buf = torch.randn(2 * t.shape[0], t.shape[1], generator=gen, dtype=torch.float64).to(dtype)
        buf[::2] = t
        return buf[::2]

    if layout == "sliced":
        projected, x = wider(projected, 3, 2), wider(x, 2, 5)
    elif layout == "strided_rows":
        projected, x = every_other_row(projected), every_other_row(x)
    elif layout == "transposed":
        projected, x = projected.t().contiguous().t(), x.t().contiguous().t()
    elif layout != "contiguous":
        raise ValueError(layout)
    return projected, x


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
@given(n=st.integers(0, 40), h=st.integers(1, 70), seed=st.integers(0, 2**31 - 1),
       layout=st.sampled_from(["contiguous", "sliced", "strided_rows", "transposed"]),
       dtype=st.sampled_from(DTYPES))
def test_highway_gate_random_shapes(n, h, seed, layout, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=seed, layout=layout)
    check_highway(projected, x, f"highway_gate {layout} N={n} H={h} {dtype} seed={seed}")


@needs_extension
def test_highway_gate_propagates_nan_and_inf():
    projected = torch.tensor([[float("nan"), 1.0, 0.0, 0.0],
                              [1.0, float("inf"), 0.0, float("-inf")]])
    x = torch.tensor([[1.0, 1.0], [2.0, 3.0]])
    out = ops.highway_gate(projected, x)
    expected = highway_gate_ref(projected, x)
    assert torch.equal(out.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(out[finite], expected[finite])


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,h,layout", [(0, 3, "contiguous"), (1, 1, "contiguous"), (7, 16, "sliced"),
                                        (5, 3, "transposed")])
def test_highway_gate_opcheck(n, h, layout, dtype):
    projected, x = highway_inputs(n, h, dtype, seed=n + h, layout=layout)
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (projected, x))


@needs_extension
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch internals
def test_highway_gate_torch_compile_fullgraph():
    def f(projected, x):
        return ops.highway_gate(projected * 0.5, x) + 1.0

    compiled = torch.compile(f, fullgraph=True)
    for n in (3, 7):  # a second shape: recompiles or goes dynamic, either way no graph break
        projected, x = highway_inputs(n, 16, torch.float32, seed=n)
        assert_close(compiled(projected, x), highway_gate_ref(projected.double() * 0.5, x.double()) + 1.0,
                     what=f"compiled highway_gate N={n}")


@needs_extension
@pytest.mark.parametrize("projected_shape,x_shape,match", [
    ((4, 32), (4, 16, 1), "highway_gate: x must have 2 dims, got 3"),
    ((4 * 32,), (4, 16), "highway_gate: projected must have 2 dims, got 1"),
    ((5, 32), (4, 16), "highway_gate: projected and x must have the same number of rows N, got 5 and 4"),
    ((4, 30), (4, 16), r"highway_gate: projected must have 2 \* H = 32 columns"),
    ((4, 16), (4, 16), r"highway_gate: projected must have 2 \* H = 32 columns"),
])
def test_highway_gate_shape_errors_name_the_argument(projected_shape, x_shape, match):
    with pytest.raises(RuntimeError, match=match):
        ops.highway_gate(torch.randn(projected_shape), torch.randn(x_shape))


@needs_extension
def test_highway_gate_dtype_errors_name_the_argument():
    with pytest.raises(RuntimeError, match="projected and x must have the same dtype, got float32 and float64"):
        ops.highway_gate(torch.randn(4, 32), torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="highway_gate: x has dtype float16; supported: float32, float64, bfloat16"):
        ops.highway_gate(torch.randn(4, 32, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16))


def test_require_extension_says_how_to_build(monkeypatch):
    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    monkeypatch.setattr(ops, "EXTENSION_IMPORT_ERROR", "ImportError: no module named elmo_fast._C")
    with pytest.raises(ExtensionNotBuiltError, match=r"pip install --no-build-isolation -e \.") as info:
        ops.highway_gate(torch.randn(2, 4), torch.randn(2, 2))
    assert "no module named elmo_fast._C" in str(info.value)
    assert isinstance(info.value, ValueError)  # every ElmoFastError is a ValueError


@needs_extension
def test_extension_reports_cuda_build_flag():
    # A CPU build of torch can only produce a CPU extension, whatever the toolchain.
    assert isinstance(ops.HAS_CUDA_KERNELS, bool)
    if torch.version.cuda is None:
        assert not ops.HAS_CUDA_KERNELS
