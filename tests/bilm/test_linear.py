"""ops.linear (x @ W^T + b; few rows against large weights stream the weights once on the CPU) and
ops.layer0_gates against their twins, reference.linear_ref (F.linear) and layer0_gates_ref."""

import pytest
import torch
from cpu_features import packed_dtypes
from tolerances import assert_close, assert_grad_close

from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import layer0_gates_ref, linear_ref

pytestmark = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


def linear_case(n, K, N, dtype, seed, bias=True, layout="contiguous"):
    """Fresh random x [n, K], weight [N, K], bias [N] (or None); x "contiguous", "sliced" (rows
    further apart than K) or "transposed" (column stride != 1: the op's copy path)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, K, generator=gen, dtype=torch.float64)
    weight = torch.randn(N, K, generator=gen, dtype=torch.float64) / K**0.5
    b = torch.randn(N, generator=gen, dtype=torch.float64) if bias else None
    if layout == "sliced":
        buf = torch.randn(n, K + 5, generator=gen, dtype=torch.float64)
        buf[:, 2 : 2 + K] = x
        x = buf[:, 2 : 2 + K]
    elif layout == "transposed":
        x = x.t().contiguous().t()
    elif layout != "contiguous":
        raise ValueError(layout)
    return x.to(dtype), weight.to(dtype), None if b is None else b.to(dtype)


# Small weights take the GEMV up to 32 rows, weights of 16 MB and more up to 128: 33 / 129 rows
# take ATen's GEMM, the others the GEMV (n = 0: nothing to compute).
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "transposed"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "n,K,N", [(0, 5, 3), (1, 1, 1), (1, 7, 6), (3, 16, 37), (7, 33, 5), (27, 64, 130), (32, 9, 11), (33, 9, 11)]
)
def test_linear_matches_reference(n, K, N, bias, layout):
    x, w, b = linear_case(n, K, N, torch.float32, seed=n + K + N, bias=bias, layout=layout)
    got = ops.linear(x, w, b)
    assert got.shape == (n, N) and got.dtype == torch.float32
    assert_close(
        got,
        linear_ref(x.double(), w.double(), None if b is None else b.double()),
        dtype=torch.float32,
        what=f"linear n={n} K={K} N={N} bias={bias} {layout}",
    )


@pytest.mark.parametrize("n", [1, 27, 128, 129])
@pytest.mark.slow
def test_linear_large_weights(n):
    # 'original' layer 0's shape per direction: W_ih [4C, P] = [16384, 512], 32 MB
    x, w, b = linear_case(n, 512, 16384, torch.float32, seed=n)
    assert_close(
        ops.linear(x, w, b),
        linear_ref(x.double(), w.double(), b.double()),
        dtype=torch.float32,
        what=f"linear n={n} against 32 MB of weights",
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_linear_other_dtypes_take_aten(dtype):
    x, w, b = linear_case(5, 12, 7, dtype, seed=3)
    assert torch.equal(ops.linear(x, w, b), linear_ref(x, w, b))


def test_linear_gradcheck():
    x, w, b = (t.requires_grad_() for t in linear_case(4, 6, 5, torch.float64, seed=11))
    assert torch.autograd.gradcheck(ops.linear, (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: ops.linear(x, w, None), (x, w))


@pytest.mark.parametrize("n,K,N", [(0, 4, 3), (1, 7, 6), (27, 64, 130), (33, 9, 11)])
def test_linear_grads_match_reference(n, K, N):
    case = linear_case(n, K, N, torch.float32, seed=5 + n)
    grad = torch.randn(n, N, generator=torch.Generator().manual_seed(n))
    got_in = [t.clone().requires_grad_() for t in case]
    want_in = [t.clone().requires_grad_() for t in case]
    ops.linear(*got_in).backward(grad)
    linear_ref(*want_in).backward(grad)
    for name, g, w in zip(("x", "weight", "bias"), got_in, want_in):
        assert_grad_close(g.grad, w.grad, what=f"linear grad_{name} n={n}")


@pytest.mark.parametrize("n", [0, 3, 33])
def test_linear_opcheck(n):
    torch.library.opcheck(torch.ops.elmo_fast.linear.default, linear_case(n, 8, 6, torch.float32, seed=n))
    torch.library.opcheck(torch.ops.elmo_fast.linear.default, linear_case(n, 8, 6, torch.float32, seed=n, bias=False))


def test_linear_bad_input_is_a_one_line_error():
    x, w, b = linear_case(3, 8, 6, torch.float32, seed=1)
    for args, says in (
        ((x, w[:, :5], None), "same K"),
        ((x, w.double(), None), "dtype"),
        ((x, w, b[:4]), "bias expected shape"),
        ((x[0], w, None), "x must have 2 dims"),
    ):
        with pytest.raises(RuntimeError, match=says) as e:
            ops.linear(*args)
        assert str(e.value).startswith("linear: ") and "\n" not in str(e.value).strip(), str(e.value)


@pytest.mark.parametrize("U,P,C", [(1, 3, 5), (27, 16, 64), (40, 19, 46)])
def test_layer0_gates_matches_reference(U, P, C):
    gen = torch.Generator().manual_seed(U + P)
    weights = []
    for _ in range(2):
        weights += [torch.randn(4 * C, P, generator=gen) / P**0.5, None, torch.randn(4 * C, generator=gen), None]
    tokens = torch.randn(U, P, generator=gen)
    got = ops.layer0_gates(tokens, weights)
    assert got.shape == (U, 2, 4 * C)
    want = layer0_gates_ref(tokens.double(), [None if w is None else w.double() for w in weights])
    assert_close(got, want, dtype=torch.float32, what=f"layer0_gates U={U} P={P} C={C}")


# A packed weight (ops.pack_weight, CPU): x and the weight rounded to bf16, float sums, a float32 result.
@pytest.mark.parametrize("dtype", packed_dtypes())
@pytest.mark.parametrize("n,K,N", [(0, 4, 16), (1, 2, 16), (5, 48, 80), (33, 64, 128), (70, 10, 48)])
def test_linear_packed_weight(n, K, N, dtype):
    x, w, b = linear_case(n, K, N, torch.float32, seed=n + K + N)
    w = w.to(dtype)
    got = ops.linear(x, ops.pack_weight(w), b)
    assert got.dtype == torch.float32 and got.shape == (n, N)
    want = linear_ref(x.to(dtype).double(), w.double(), b.double())
    assert_close(got, want, dtype=torch.float32, what=f"linear packed {dtype} n={n} K={K} N={N}")
    gates = ops.layer0_gates_packed(x, [ops.pack_weight(w), ops.pack_weight(-w)], [b, -b])
    assert gates.shape == (n, 2, N) and torch.equal(gates[:, 0], got)


@pytest.mark.parametrize("dtype", packed_dtypes())
def test_linear_packed_weight_refuses_in_one_line(dtype):
    x, w, b = linear_case(3, 4, 16, torch.float32, seed=0)
    p = ops.pack_weight(w.to(dtype))
    with pytest.raises(
        RuntimeError,
        match=r"linear: x \[n, K\] and weight \[N, K\] \(packed\) must have the same K, "
        r"got x \[3, 6\] and weight \[16, 4\]",
    ):
        ops.linear(torch.randn(3, 6), p, b)
    with pytest.raises(RuntimeError, match="linear: with a packed weight x must have dtype float32, got float64"):
        ops.linear(x.double(), p, b)
    with pytest.raises(RuntimeError, match="linear: bias must have dtype float32, got bfloat16"):
        ops.linear(x, p, b.bfloat16())


def test_linear_gemv_rows_is_the_callers_choice():
    # Every row count through either kernel: the same values to fp32 rounding; a bad value in one line.
    x, w, b = linear_case(40, 33, 70, torch.float32, seed=7)
    gemv, gemm = ops.linear(x, w, b, 1000), ops.linear(x, w, b, 0)
    assert_close(gemv, gemm, dtype=torch.float32, what="linear gemv vs gemm")
    assert torch.equal(ops.linear(x, w, b, 32), ops.linear(x, w, b))  # 32: the default for small weights
    with pytest.raises(RuntimeError, match="linear: gemv_max_rows must be >= 0 or None, got -1"):
        ops.linear(x, w, b, -1)
