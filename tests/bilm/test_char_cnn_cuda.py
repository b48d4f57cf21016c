"""The char CNN's CUDA kernels, forward and backward, against the reference.

Two targets run each test (tests/support/cuda_targets.py): "cuda", the kernels on a GPU (skips, saying
why, without one), and "emulated", the same kernels and bindings compiled for the CPU emulator (a default
subset; every case with ELMO_FAST_CUDA_EMULATION=1). Outputs come from a poisoned allocator; the backward
passes run with @poisoned (tests/support/grad_checks.py); TF32 is off (exact_fp32)."""

import pytest
import torch
from char_cnn_cases import ELMO_FILTERS, FULL_FILTERS, TINY_FILTERS, char_cnn_inputs, elmo_ids, near_ties, random_cnn
from cuda_targets import (
    ALL_DTYPES,
    LOW_PRECISION,
    emulated_by_default,
    exact_fp32,  # noqa: F401  (autouse: TF32 off)
    needs_cpu_ops,
    on,
    poison,
    same_layout_on,
)
from grad_checks import assert_low_precision_grad, poisoned, ref_grads
from tolerances import assert_close, assert_grad_close

from elmo_fast.bilm.reference import char_cnn_ref


def run_char_cnn(target, ids, emb, ws, bs, activation):
    dev = target.device
    poison(target)
    return target.op("char_cnn")(
        same_layout_on(ids, dev),
        same_layout_on(emb, dev),
        [same_layout_on(w, dev) for w in ws],
        [same_layout_on(b, dev) for b in bs],
        activation,
    )


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize(
    "filters,dim",
    [(TINY_FILTERS, 4), (FULL_FILTERS, 16), (((1, 3), (50, 2), (7, 0), (2, 33)), 5)],
    ids=["tiny", "full", "odd"],
)
@emulated_by_default(
    lambda filters, dim, activation, dtype: (
        (filters is TINY_FILTERS and activation == "relu" and dtype == torch.float32)
        or (dim == 5 and activation == "tanh" and dtype == torch.bfloat16)
    )
)
def test_char_cnn(target, filters, dim, activation, dtype):
    if (
        target.name == "emulated"
        and filters is FULL_FILTERS
        and (dtype, activation) not in ((torch.float32, "relu"), (torch.bfloat16, "tanh"))
    ):
        pytest.skip("the emulator is slow: full filters run in float32/relu and bfloat16/tanh")
    ids, emb, ws, bs = char_cnn_inputs(filters, dim, dtype, seed=len(filters) + dim)
    what = f"{target.name} char_cnn {len(filters)} widths D={dim} {activation} {dtype}"
    got = run_char_cnn(target, ids, emb, ws, bs, activation)
    assert got.shape == (ids.shape[0], sum(n for _, n in filters)) and got.dtype == dtype, what
    # A convolution of 0 filters (the "odd" case) adds no columns; conv1d refuses it.
    kept = [k for k, (_, num) in enumerate(filters) if num > 0]
    expected = char_cnn_ref(
        ids, emb.double(), [ws[k].double() for k in kept], [bs[k].double() for k in kept], activation
    )
    assert_close(got, expected, dtype=dtype, what=what)


@emulated_by_default(lambda chars: chars in (1, 65, 513))
@pytest.mark.parametrize("chars", [1, 2, 7, 64, 65, 100, 511, 512, 513, 1100])
def test_char_cnn_other_token_lengths(target, chars):
    # Any L >= 1, as on the CPU: rows staged 8 at a time up to 64 ids, fewer per group up to 512,
    # one at a time from global memory beyond; a filter as wide as the row (one window).
    filters = ((1, 5), (2, 3)) if chars > 1 else ((1, 5),)
    if chars > 2:
        filters += ((chars, 2), (chars // 2, 3))
    ids, emb, ws, bs = char_cnn_inputs(filters, 3, torch.float32, seed=chars, chars=chars, n_random=9)
    ids = torch.cat([ids, ids[:3]])  # more tokens than one group holds, repeated rows
    ids[-1, chars // 3] = 262  # and a bad id: a NaN row
    got = run_char_cnn(target, ids, emb, ws, bs, "relu").cpu()
    assert got[-1].isnan().all()
    assert_close(
        got[:-1],
        char_cnn_ref(ids[:-1], emb.double(), [w.double() for w in ws], [b.double() for b in bs]),
        what=f"{target.name} char_cnn W={chars}",
    )


@emulated_by_default()
def test_char_cnn_token_length_rule(target):
    # Every backend's rule and message (the CPU op's, csrc/char_cnn_args.h): L >= 1, w_k <= L.
    _, emb, ws, bs = char_cnn_inputs(((1, 5),), 3, torch.float32, seed=1)
    with pytest.raises(
        RuntimeError,
        match=r"char_cnn: char_ids must have at least one character id per token "
        r"\(shape \[N, L\]\), got shape \[4, 0\]",
    ):
        run_char_cnn(target, torch.zeros(4, 0, dtype=torch.long), emb, ws, bs, "relu")
    with pytest.raises(
        RuntimeError,
        match=r"char_cnn: conv_weights\[0\] must have a width in 1..3 \(the characters "
        r"per token of char_ids, \[4, 3\]\), got shape \[2, 3, 4\]",
    ):
        run_char_cnn(target, torch.zeros(4, 3, dtype=torch.long), emb, [torch.zeros(2, 3, 4)], [torch.zeros(2)], "relu")


@emulated_by_default()
def test_char_cnn_empty_and_single(target):
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=3)
    got = run_char_cnn(target, ids[:0], emb, ws, bs, "relu")
    assert got.shape == (0, 124)
    got = run_char_cnn(target, ids[:1], emb, ws, bs, "relu")
    assert_close(got, char_cnn_ref(ids[:1], emb, ws, bs), what=f"{target.name} char_cnn N=1")


@emulated_by_default()
def test_char_cnn_non_contiguous(target):
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=4)
    wide_ids = torch.cat([torch.full((ids.shape[0], 3), 7), ids, torch.full((ids.shape[0], 2), 9)], 1)[:, 3:53]
    wide_emb = torch.cat([torch.randn(emb.shape[0], 2), emb], 1)[:, 2:]
    t_ws = [w.transpose(1, 2).contiguous().transpose(1, 2) for w in ws]  # strides (D w, 1, D)
    s_bs = [torch.stack([b, b + 100], 1)[:, 0] for b in bs]  # stride 2
    assert not (wide_ids.is_contiguous() or wide_emb.is_contiguous() or t_ws[1].is_contiguous())
    got = run_char_cnn(target, wide_ids, wide_emb, t_ws, s_bs, "tanh")
    assert_close(got, char_cnn_ref(ids, emb, ws, bs, "tanh"), what=f"{target.name} char_cnn non-contiguous")


@emulated_by_default()
def test_char_cnn_out_of_range_id_gives_nan_row(target):
    # Checking ids on the host would cost a device sync per call: a bad token gets a NaN row instead.
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=5)
    ids[2, 5] = 262
    ids[4, 0] = -1
    got = run_char_cnn(target, ids, emb, ws, bs, "relu").cpu()
    assert got[2].isnan().all() and got[4].isnan().all()
    good = [i for i in range(ids.shape[0]) if i not in (2, 4)]
    assert_close(got[good], char_cnn_ref(ids[good], emb, ws, bs), what="char_cnn other rows")


def test_char_cnn_many_tokens_use_the_grid_stride_loop(cuda_target):
    # 8 tokens per block and at most 65535 blocks along y: 600000 tokens need the token loop.
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=6)
    index = torch.randint(0, ids.shape[0], (600_000,), generator=torch.Generator().manual_seed(0))
    dev = cuda_target.device
    args = (emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "relu")
    poison(cuda_target)
    whole = torch.ops.elmo_fast.char_cnn.default(ids[index].to(dev), *args)
    each = torch.ops.elmo_fast.char_cnn.default(ids.to(dev), *args)
    assert_close(
        each,
        char_cnn_ref(ids, emb.double(), [w.double() for w in ws], [b.double() for b in bs]),
        dtype=torch.float32,
        what="char_cnn distinct rows",
    )
    assert torch.equal(whole, each[index.to(dev)])  # per-token math: bitwise the same wherever it runs


def test_char_cnn_errors_name_the_argument_on_cuda(cuda_target):
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=7)
    dev = cuda_target.device
    op = torch.ops.elmo_fast.char_cnn.default
    with pytest.raises(RuntimeError, match="char_cnn: char_embedding and char_ids must be on the same device"):
        op(ids.to(dev), emb, [w.to(dev) for w in ws], [b.to(dev) for b in bs], "relu")
    with pytest.raises(RuntimeError, match=r"char_cnn: conv_weights\[1\] must be on char_ids' device"):
        op(
            ids.to(dev),
            emb.to(dev),
            [w.to(dev) if i != 1 else w for i, w in enumerate(ws)],
            [b.to(dev) for b in bs],
            "relu",
        )
    with pytest.raises(RuntimeError, match=r"char_cnn: conv_weights\[0\] must have a width in 1..50 \(the characters"):
        op(ids.to(dev), emb.to(dev), [torch.randn(3, 4, 51, device=dev)], [torch.randn(3, device=dev)], "relu")
    with pytest.raises(RuntimeError, match='char_cnn: activation must be "relu" or "tanh", got "gelu"'):
        op(ids.to(dev), emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "gelu")


# --- char_cnn_backward ----------------------------------------------------------------------------


def check_char_cnn_backward(target, ids, emb, ws, bs, activation, what, seed=0, grad_out=None):
    dtype = emb.dtype
    K = len(ws)
    cols = sum(w.shape[0] for w in ws)
    if grad_out is None:
        grad_out = torch.randn(ids.shape[0], cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        if dtype != torch.float64 and ids.shape[0]:
            # where a max window is not clear, an fp32 kernel and the float64 reference may pick others
            kept = [k for k, w in enumerate(ws) if w.shape[0] > 0]  # (0-filter convolutions: no columns)
            tied = near_ties(
                ids,
                emb,
                [ws[k] for k in kept],
                [bs[k] for k in kept],
                activation,
                margin=1e-2 if dtype in LOW_PRECISION else 1e-4,
            )
            assert tied.double().mean() < 0.1, f"{what}: too many near-ties to test"
            grad_out[tied] = 0.0
        grad_out = grad_out.to(dtype)
    poison(target)
    got_e, got_w, got_b = target.op("char_cnn_backward")(
        on(target, grad_out),
        on(target, ids),
        on(target, emb),
        [on(target, w) for w in ws],
        [on(target, b) for b in bs],
        activation,
    )
    kept = [k for k, w in enumerate(ws) if w.shape[0] > 0]  # conv1d refuses 0 filters: none to compare there

    def ref(e, *c):
        return char_cnn_ref(ids, e, list(c[: len(kept)]), list(c[len(kept) :]), activation)

    want = ref_grads(ref, [emb, *[ws[k] for k in kept], *[bs[k] for k in kept]], [grad_out])
    got = [got_e, *[got_w[k] for k in kept], *[got_b[k] for k in kept]]
    for k in range(K):
        assert got_w[k].shape == ws[k].shape and got_b[k].shape == bs[k].shape, what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == dtype and g.device == target.device, what
        if dtype in LOW_PRECISION:
            assert_low_precision_grad(g, w, dtype, f"{what} input {i}")
        else:
            assert_grad_close(g, w, dtype=dtype, what=f"{what} input {i}")
    return got_e, got_w, got_b


@needs_cpu_ops
@poisoned
@emulated_by_default(lambda n, activation, dtype: n == 37 and activation == "tanh" and dtype == torch.float32)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("n", [1, 2, 37])
def test_char_cnn_backward(target, n, activation, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=n)
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (1, 50), generator=torch.Generator().manual_seed(n))])
    check_char_cnn_backward(
        target, ids, emb, ws, bs, activation, f"{target.name} char_cnn_backward N={n} {activation} {dtype}", seed=n
    )


@needs_cpu_ops
@poisoned
def test_char_cnn_backward_elmo_filters(target):
    # The small/original models' 2048 filters of widths 1..7, D = 16; many tokens per chunk.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, torch.float32, seed=5)
    n = 24 if target.name == "emulated" else 3000
    check_char_cnn_backward(target, elmo_ids(n, seed=5), emb, ws, bs, "relu", f"{target.name} ELMo filters N={n}")


@needs_cpu_ops
@poisoned
@emulated_by_default(lambda dtype: dtype == torch.bfloat16)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_char_cnn_backward_low_precision(target, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=11)
    check_char_cnn_backward(target, elmo_ids(21, seed=11), emb, ws, bs, "tanh", f"{target.name} {dtype}", seed=11)


@needs_cpu_ops
@poisoned
@emulated_by_default(lambda chars: chars in (1, 600))
@pytest.mark.parametrize("chars", [1, 7, 64, 100, 600])
def test_char_cnn_backward_other_token_lengths(target, chars):
    # Rows of L != 50 ids, filters of every width up to L, 0 filters in one convolution, a vocabulary
    # of other size (rows of a wider buffer: strides).
    filters = [(1, 3), (min(2, chars), 0), (chars, 2)] + ([(3, 4)] if chars >= 3 else [])
    emb, ws, bs = random_cnn(filters, 3, torch.float64, seed=chars, vocab=300)
    gen = torch.Generator().manual_seed(chars)
    ids = torch.randint(0, 300, (9, chars + 4), generator=gen)[:, 2 : 2 + chars]
    ids[4, chars // 2 :] = 299
    ids[6] = 0
    check_char_cnn_backward(target, ids, emb, ws, bs, "relu", f"{target.name} char_cnn_backward L={chars}")


@needs_cpu_ops
@poisoned
@emulated_by_default()
def test_char_cnn_backward_expanded_gradient_and_no_tokens(target):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=3)
    ids = elmo_ids(30, seed=3)
    ones = torch.ones(1, 1, dtype=torch.float64).expand(30, sum(w.shape[0] for w in ws))
    check_char_cnn_backward(target, ids, emb, ws, bs, "tanh", f"{target.name} expanded gradient", grad_out=ones)
    e, w, b = target.op("char_cnn_backward")(
        torch.zeros(0, ones.shape[1], dtype=torch.float64, device=target.device),
        ids[:0].to(target.device),
        emb.to(target.device),
        [x.to(target.device) for x in ws],
        [x.to(target.device) for x in bs],
        "relu",
    )
    assert all(torch.all(t == 0) for t in (e, *w, *b))
    assert e.shape == emb.shape


@needs_cpu_ops
@poisoned
def test_char_cnn_backward_unused_rows_get_zero(target):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=2)
    ids = elmo_ids(20, seed=2)
    e, _, _ = check_char_cnn_backward(target, ids, emb, ws, bs, "relu", f"{target.name} unused rows")
    unused = torch.ones(262, dtype=torch.bool)
    unused[ids.unique()] = False
    assert torch.all(e.cpu()[unused] == 0) and e.cpu()[~unused].abs().sum() > 0


@needs_cpu_ops
@poisoned
@emulated_by_default()
def test_char_cnn_backward_bad_id_gives_nan(target):
    # The forward gives such a token a NaN row (no device sync to check ids): its gradients say so too.
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=4)
    ids = elmo_ids(6, seed=4)
    ids[2, 3] = 262
    grad = torch.ones(6, sum(w.shape[0] for w in ws))
    e, w, b = target.op("char_cnn_backward")(
        grad.to(target.device),
        ids.to(target.device),
        emb.to(target.device),
        [x.to(target.device) for x in ws],
        [x.to(target.device) for x in bs],
        "tanh",
    )
    assert all(t.isnan().any() for t in b) and e.isnan().any()


@needs_cpu_ops
@poisoned
@emulated_by_default(lambda budget: budget == 10_000)
@pytest.mark.parametrize("budget", [1, 10_000, 300_000])
def test_char_cnn_backward_histogram_within_its_budget(target, monkeypatch, budget):
    """The histogram pass's workspace stays within its budget (256 MB; here 1 byte: one character id per
    pass; 10 kB: 4 ids per pass; 300 kB: every id, 3 token chunks) by slicing the vocabulary into
    passes: the gradients are the same. (At 256 MB, ELMo's filters and 10k characters
    would have needed 0.5 GB in one pass.)"""
    monkeypatch.setenv("ELMO_FAST_CHAR_CNN_HIST_BYTES", str(budget))
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=12, vocab=40)
    ids = torch.randint(0, 40, (130, 9), generator=torch.Generator().manual_seed(12))
    ids[3, 4] = 0  # row 0 of the embedding used too
    check_char_cnn_backward(
        target, ids, emb, ws, bs, "relu", f"{target.name} char_cnn_backward, histogram budget {budget} bytes", seed=12
    )


@needs_cpu_ops
@poisoned
def test_char_cnn_backward_is_deterministic(target):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=6)
    ids = elmo_ids(50, seed=6)
    grad = torch.randn(50, sum(w.shape[0] for w in ws), generator=torch.Generator().manual_seed(6))
    args = (
        grad.to(target.device),
        ids.to(target.device),
        emb.to(target.device),
        [x.to(target.device) for x in ws],
        [x.to(target.device) for x in bs],
        "relu",
    )
    first, again = target.op("char_cnn_backward")(*args), target.op("char_cnn_backward")(*args)
    assert torch.equal(first[0], again[0]) and all(torch.equal(a, b) for a, b in zip(first[1], again[1]))
