"""Backward passes of the fast ops (CPU) against the autograd of their reference twins.

* char_cnn, highway, highway_gate: register_autograd formulas running char_cnn_backward /
  highway_gate_backward (elmo_fast/ops.py, csrc/cpu/).
* lstm_layer (op lstm_layer_forward + lstm_layer_backward): one layer, both directions, against
  reference.lstm_layer_pair_ref; the training stack ops.bilstm_train against reference.bilstm_train_ref.

Gradients are compared with tolerances.assert_grad_close (max error relative to the gradient's largest
entry, GRAD_RTOL), float64 exactly and under torch.autograd.gradcheck. Every tensor the ops allocate
starts as NaN here (deterministic mode's fill of uninitialized memory), so an element a kernel forgets to
write fails the comparison.
"""
import types

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import fresh_inductor_cache
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import (bilstm_ref, bilstm_train_ref, char_cnn_ref, highway_gate_ref, highway_ref,
                                 layer0_gates_ref, lstm_layer_pair_ref)
from test_char_cnn import ELMO_FILTERS, TINY_FILTERS, elmo_ids, random_cnn, transposed_storage, wider
from tolerances import assert_close, assert_grad_close

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")
pytestmark = needs_extension


@pytest.fixture(autouse=True)
def poisoned_allocations():
    """torch.empty, also inside the ops, returns NaN-filled memory while deterministic mode is on."""
    assert torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


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


# --- char CNN ------------------------------------------------------------------------------------------


def near_ties(ids, emb, weights, biases, activation, margin):
    """[N, sum n_k] True where a filter's max window is not clear by `margin` (float64 values): the
    largest and the next distinct value are closer, or (relu) the max is that close to 0. There an
    fp32 kernel and the float64 reference may pick different windows; gradients are masked there."""
    x = F.embedding(ids, emb.double()).transpose(1, 2)
    masks = []
    for w, b in zip(weights, biases):
        v = F.conv1d(x, w.double(), b.double())  # [N, n, windows]
        top = v.amax(dim=-1, keepdim=True)
        below = torch.where(v < top, v, torch.full_like(v, -torch.inf)).amax(dim=-1)
        ambiguous = (top.squeeze(-1) - below) < margin
        if activation == "relu":
            ambiguous |= top.squeeze(-1).abs() < margin
        masks.append(ambiguous)
    return torch.cat(masks, dim=1)


def check_char_cnn_grads(ids, emb, ws, bs, activation, what, seed=0):
    K = len(ws)
    dtype = emb.dtype
    gen = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(ids.shape[0], sum(w.shape[0] for w in ws), generator=gen, dtype=torch.float64)
    if dtype != torch.float64:
        tied = near_ties(ids, emb, ws, bs, activation, margin=1e-4)
        assert tied.double().mean() < 0.05, f"{what}: too many near-ties ({tied.double().mean():.1%}) to test"
        grad_out[tied] = 0
    inputs = [emb, *ws, *bs]

    def fast(e, *c):
        return ops.char_cnn(ids, e, list(c[:K]), list(c[K:]), activation)

    def ref(e, *c):
        return char_cnn_ref(ids, e, list(c[:K]), list(c[K:]), activation)

    got, _ = grads(fast, leaves(inputs), weights=[grad_out.to(dtype)])
    want, _ = grads(ref, leaves(inputs, torch.float64), weights=[grad_out])
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.dtype == dtype and g.shape == inputs[i].shape, what
        assert_grad_close(g, e, dtype=dtype, what=f"{what} input {i}")
    return got


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_char_cnn_gradcheck(activation):
    # Small filters in float64, ELMo-like ids (trailing padding runs, a "no token" row) and random ones.
    emb, ws, bs = random_cnn([(1, 3), (2, 5), (3, 4), (7, 2)], 3, torch.float64, seed=1, vocab=40)
    ids = torch.cat([elmo_ids(7, seed=3) % 40, torch.randint(0, 40, (2, 50), generator=torch.Generator().manual_seed(4))])
    K = len(ws)
    inputs = leaves([emb, *ws, *bs])
    assert torch.autograd.gradcheck(lambda e, *c: ops.char_cnn(ids, e, list(c[:K]), list(c[K:]), activation), inputs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("n", [1, 2, 37, 300])
def test_char_cnn_grads_match_reference(n, activation, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=n)
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (1, 50), generator=torch.Generator().manual_seed(n))])
    check_char_cnn_grads(ids, emb, ws, bs, activation, f"char_cnn grads N={n} {activation} {dtype}", seed=n)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_char_cnn_grads_elmo_filters(dtype):
    # The small/original models' 2048 filters (32 fp32 slices of up to width 7), D = 16.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, dtype, seed=5)
    check_char_cnn_grads(elmo_ids(200, seed=5), emb, ws, bs, "relu", f"char_cnn ELMo filters {dtype}")


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_char_cnn_grads_non_contiguous(layout):
    gen = torch.Generator().manual_seed(9)
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=9)
    ids = elmo_ids(40, seed=9)
    if layout == "sliced":
        ids, emb = wider(ids, 1, 3, 2, gen), wider(emb, 1, 2, 1, gen)
        ws = [wider(wider(w, 2, 1, 2, gen), 1, 2, 1, gen) for w in ws]
        bs = [wider(b, 0, 3, 1, gen) for b in bs]
    else:
        ids, emb, ws = transposed_storage(ids), transposed_storage(emb), [transposed_storage(w) for w in ws]
    got = check_char_cnn_grads(ids, emb, ws, bs, "tanh", f"char_cnn grads {layout}")
    assert all(g.is_contiguous() for g in got)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("length", [1, 7, 20, 49, 70])
def test_char_cnn_grads_other_lengths(length, dtype):
    """Rows of another length than 50 (ELMoForManyLangs' max_characters_per_token) over a table of
    thousands of characters: the backward recomputes each filter's max window over L - w + 1 of them.
    At L = 70 a filter of width 65 (a window of more table entries than the 64 the fast max's overflow
    bound once assumed) takes part."""
    filters = [(w, n) for w, n in [(1, 4), (2, 5), (3, 3), (7, 6), (length, 2), (65, 3)] if w <= length]
    emb, ws, bs = random_cnn(filters, 5, dtype, seed=length, vocab=3001)
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(1, 3001, (60, length), generator=gen)
    cut = torch.randint(1, length + 1, (60,), generator=gen)
    ids[torch.arange(length) >= cut.unsqueeze(1)] = 7  # a trailing run of one id, as padding makes
    ids[:2] = 0  # no token
    check_char_cnn_grads(ids, emb, ws, bs, "relu" if length % 2 else "tanh", f"char_cnn grads L={length} {dtype}",
                         seed=length)


def test_char_cnn_grads_of_unused_rows_and_no_tokens():
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=2)
    ids = elmo_ids(20, seed=2)
    emb_leaf = emb.clone().requires_grad_()
    ops.char_cnn(ids, emb_leaf, ws, bs).square().sum().backward()
    unused = torch.ones(262, dtype=torch.bool)
    unused[ids.unique()] = False
    assert torch.all(emb_leaf.grad[unused] == 0) and emb_leaf.grad[~unused].abs().sum() > 0
    empty = leaves([emb, *ws, *bs])
    out = ops.char_cnn(ids[:0], empty[0], empty[1:6], empty[6:])
    got = torch.autograd.grad(out.sum(), empty)
    assert all(torch.all(g == 0) for g in got)


def test_char_cnn_expanded_gradient():
    # out.sum()'s gradient is an expanded tensor (stride 0): the backward reads it as rows.
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=3)
    ids = elmo_ids(30, seed=3)
    a = leaves([emb])
    b = leaves([emb])
    g_sum = torch.autograd.grad(ops.char_cnn(ids, a[0], ws, bs).sum(), a)[0]
    g_ref = torch.autograd.grad(char_cnn_ref(ids, b[0], ws, bs).sum(), b)[0]
    assert_grad_close(g_sum, g_ref, what="char_cnn expanded grad")


# --- highway ---------------------------------------------------------------------------------------------


def highway_case(n, f, p, layers, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=gen, dtype=torch.float64)
    hw = [torch.randn(2 * f, f, generator=gen, dtype=torch.float64) / f ** 0.5 for _ in range(layers)]
    hb = [torch.randn(2 * f, generator=gen, dtype=torch.float64) for _ in range(layers)]
    for b in hb:
        b[f:] -= 1.0  # gates lean to carrying x, as trained ones do; both sides of relu stay
    pw = torch.randn(p, f, generator=gen, dtype=torch.float64) / f ** 0.5
    pb = torch.randn(p, generator=gen, dtype=torch.float64)
    return [t.to(dtype) for t in (x, *hw, *hb, pw, pb)]


def highway_fns(layers, via_op):
    def fast(x, *w):
        args = (x, list(w[:layers]), list(w[layers:2 * layers]), w[-2], w[-1])
        return torch.ops.elmo_fast.highway.default(*args) if via_op else ops.highway(*args)

    def ref(x, *w):
        return highway_ref(x, list(w[:layers]), list(w[layers:2 * layers]), w[-2], w[-1])

    return fast, ref


@pytest.mark.parametrize("via_op", [True, False], ids=["op", "ops.highway"])
@pytest.mark.parametrize("layers", [0, 1, 2])
def test_highway_gradcheck(layers, via_op):
    fast, _ = highway_fns(layers, via_op)
    assert torch.autograd.gradcheck(fast, leaves(highway_case(5, 4, 3, layers, torch.float64, seed=layers)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("via_op", [True, False], ids=["op", "ops.highway"])
@pytest.mark.parametrize("n,f,p,layers", [(1, 3, 2, 1), (7, 17, 5, 2), (129, 64, 16, 2)])
def test_highway_grads_match_reference(n, f, p, layers, via_op, dtype):
    fast, ref = highway_fns(layers, via_op)
    check_grads(fast, ref, highway_case(n, f, p, layers, dtype, seed=n), f"highway N={n} F={f} L={layers} {dtype}")


def test_highway_training_path_gives_the_ops_values():
    # With gradients needed, ops.highway runs the op's steps one by one: the same kernels, the same values.
    case = highway_case(33, 24, 8, 2, torch.float32, seed=4)
    fast, _ = highway_fns(2, via_op=False)
    op, _ = highway_fns(2, via_op=True)
    trained = fast(*leaves(case))
    assert trained.requires_grad and trained.grad_fn is not None
    assert torch.equal(trained.detach(), op(*case))


def gate_case(n, h, dtype, seed, layout="contiguous"):
    gen = torch.Generator().manual_seed(seed)
    projected = torch.randn(n, 2 * h, generator=gen, dtype=torch.float64) * 3
    x = torch.randn(n, h, generator=gen, dtype=torch.float64)
    projected, x = projected.to(dtype), x.to(dtype)
    if layout == "sliced":
        projected, x = wider(projected, 1, 2, 3, gen), wider(x, 1, 1, 4, gen)
    elif layout == "transposed":
        projected, x = projected.t().contiguous().t(), x.t().contiguous().t()
    return [projected, x]


def test_highway_gate_gradcheck():
    assert torch.autograd.gradcheck(ops.highway_gate, leaves(gate_case(6, 5, torch.float64, seed=1)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "transposed"])
@pytest.mark.parametrize("n,h", [(0, 3), (1, 1), (7, 16), (129, 257)])
def test_highway_gate_grads_match_reference(n, h, layout, dtype):
    check_grads(ops.highway_gate, highway_gate_ref, gate_case(n, h, dtype, seed=n + h, layout=layout),
                f"highway_gate N={n} H={h} {layout} {dtype}")


# --- lstm_layer ------------------------------------------------------------------------------------------


def layer_case(B, T, P, C, dtype, seed, lengths=None, state=True, layout="contiguous", junk=float("nan")):
    """Fresh random inputs of lstm_layer: (xg, lengths, w_hh, w_proj, h0, c0).

    Scaled as test_lstm's cases, so that cells and projections reach clips around 1-3: forget gates
    lean open (+1.5), projections 3x unit gain, recurrent weights small (a contractive recurrence).
    Padding positions of xg hold `junk` (NaN by default): the op must never read them.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    if lengths is None:
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    xg = randn(2, B, T, 4 * C, std=2.0)
    xg[..., C:2 * C] += 1.5
    xg[:, torch.arange(T)[None, :] >= lengths[:, None]] = junk
    w_hh = randn(2, 4 * C, P, std=0.35 * P ** -0.5)
    w_proj = randn(2, P, C, std=3.0 * C ** -0.5)
    h0 = randn(2, B, P, std=1.5) if state else None
    c0 = randn(2, B, C, std=2.0) if state else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    xg = cast(xg)
    if layout == "sliced":  # rows of a wider buffer, time-major: strides everywhere but the last dim
        buf = torch.randn(T, 2, B, 4 * C + 9, generator=gen, dtype=torch.float64).to(dtype)
        buf[..., 5:5 + 4 * C] = xg.permute(2, 0, 1, 3)
        xg = buf[..., 5:5 + 4 * C].permute(1, 2, 0, 3)
    elif layout == "feature_major":  # last dim not unit-stride: the op copies it once
        xg = transposed_storage(xg)
    elif layout != "contiguous":
        raise ValueError(layout)
    return xg, lengths, cast(w_hh), cast(w_proj), cast(h0), cast(c0)


def layer_fns(lengths, cell_clip, proj_clip, state):
    def fast(xg, w_hh, w_proj, *hc):
        return ops.lstm_layer(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, *(hc if state else (None, None)))

    def ref(xg, w_hh, w_proj, *hc):
        # the reference computes at padding too (and masks after): the junk there must be finite for it,
        # and nan_to_num's gradient is 0 there, as the op's
        return lstm_layer_pair_ref(xg.nan_to_num(), lengths, w_hh, w_proj, cell_clip, proj_clip,
                                   *(hc if state else (None, None)))

    return fast, ref


def differentiable(case):
    xg, _, w_hh, w_proj, h0, c0 = case
    return [t for t in (xg, w_hh, w_proj, h0, c0) if t is not None]


def clips_bind(case, cell_clip, proj_clip):
    """Whether the reference's unclipped cells and projections pass the clips somewhere."""
    xg, lengths, w_hh, w_proj, h0, c0 = [None if t is None else t.double() for t in case]
    y, _, c = lstm_layer_pair_ref(xg.nan_to_num(), lengths, w_hh, w_proj, None, None, h0, c0)
    padding = torch.arange(xg.shape[2])[None, :] >= lengths[:, None]
    return bool((c.abs() > cell_clip).any()) and bool((y[:, ~padding].abs() > proj_clip).any())


GRADCHECK_CASES = [  # B, T, P, C, lengths
    (5, 6, 3, 5, [6, 0, 3, 1, 5]),    # unsorted, a 0 and a 1, odd sizes
    (1, 1, 2, 3, [1]),                # B = 1, T = 1
    (3, 4, 5, 2, [0, 0, 0]),          # nothing runs: the states pass through
    (2, 7, 9, 3, [7, 7]),             # P > C
]


@pytest.mark.parametrize("layout", ["contiguous", "sliced", "feature_major"])
@pytest.mark.parametrize("B,T,P,C,lengths", GRADCHECK_CASES)
def test_lstm_layer_gradcheck(B, T, P, C, lengths, layout):
    case = layer_case(B, T, P, C, torch.float64, seed=B * T + P, lengths=lengths, layout=layout, junk=1e30)
    if layout != "contiguous":
        assert not case[0].is_contiguous()
    fast, _ = layer_fns(case[1], 1.0, 0.7, state=True)
    if B == 5:
        assert clips_bind(case, 1.0, 0.7), "the clips should bind somewhere"
    assert torch.autograd.gradcheck(fast, leaves(differentiable(case)))


def test_lstm_layer_gradcheck_zero_state_no_clips():
    case = layer_case(4, 5, 3, 4, torch.float64, seed=2, lengths=[5, 2, 4, 0], state=False, junk=1e30)
    fast, _ = layer_fns(case[1], None, None, state=False)
    assert torch.autograd.gradcheck(fast, leaves(differentiable(case)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("state", [True, False], ids=["state", "zeros"])
@pytest.mark.parametrize("B,T,P,C", [(1, 1, 3, 5), (5, 7, 3, 5), (9, 19, 16, 64), (6, 13, 37, 50)])
def test_lstm_layer_grads_match_reference(B, T, P, C, state, dtype):
    case = layer_case(B, T, P, C, dtype, seed=100 * B + T, state=state)
    fast, ref = layer_fns(case[1], 3.0, 3.0, state)
    check_grads(fast, ref, differentiable(case), f"lstm_layer B={B} T={T} P={P} C={C} {dtype}")


@pytest.mark.parametrize("layout", ["sliced", "feature_major"])
def test_lstm_layer_grads_non_contiguous(layout):
    case = layer_case(7, 11, 16, 24, torch.float32, seed=5, layout=layout)
    fast, ref = layer_fns(case[1], 3.0, 3.0, True)
    got, _ = check_grads(fast, ref, differentiable(case), f"lstm_layer {layout}")
    padding = torch.arange(11)[None, :] >= case[1][:, None]
    assert torch.all(got[0][:, padding] == 0), "grad_xg must be exactly 0 at padding"


@pytest.mark.parametrize("poisoned", [True, False], ids=["poisoned", "huge_pages"])
def test_lstm_layer_small_preset_fp32(poisoned):
    # 'small' shapes (P = 128, C = 1024): long sums in the weight gradients, clips at 3 binding.
    # Unpoisoned, the op's large buffers (saved, grad_xg: > 4 MB here) come from its huge-page
    # allocator, which deterministic mode's fill switches off.
    torch.use_deterministic_algorithms(poisoned)
    gen = torch.Generator().manual_seed(8)
    lengths = torch.randint(1, 31, (16,), generator=gen)
    lengths[3] = 30
    case = layer_case(16, 30, 128, 1024, torch.float32, seed=8, lengths=lengths)
    assert clips_bind(case, 3.0, 3.0)
    fast, ref = layer_fns(case[1], 3.0, 3.0, True)
    check_grads(fast, ref, differentiable(case), "lstm_layer small preset")


@pytest.mark.parametrize("used", ["y", "h", "c", "h+c"])
def test_lstm_layer_grads_of_some_outputs(used):
    # Unused outputs reach the backward as None (no zero tensors are made).
    case = layer_case(5, 6, 4, 6, torch.float64, seed=3)
    fast, ref = layer_fns(case[1], 1.5, 1.0, True)
    pick = {"y": [0], "h": [1], "c": [2], "h+c": [1, 2]}[used]
    inputs = differentiable(case)

    def loss(fn, args):
        outs = fn(*args)
        return sum((outs[i] * torch.linspace(-1, 1, outs[i].numel(), dtype=outs[i].dtype).view_as(outs[i])).sum()
                   for i in pick)

    a, b = leaves(inputs), leaves(inputs)
    got = torch.autograd.grad(loss(fast, a), a, allow_unused=True)
    want = torch.autograd.grad(loss(ref, b), b, allow_unused=True)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_grad_close(g, torch.zeros_like(g) if w is None else w, what=f"lstm_layer {used} input {i}")


@pytest.mark.parametrize("gemv_rows", ["0", "1000"])  # BLAS for every step / the op's GEMV for every step
@pytest.mark.parametrize("schedule,threads", [("directions", 2), ("sequential", 2), ("sequential", 1)])
def test_lstm_layer_gemm_paths_and_schedules(gemv_rows, schedule, threads, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", gemv_rows)
    monkeypatch.setenv("ELMO_FAST_BILSTM_THREADS", schedule)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        case = layer_case(11, 13, 37, 50, torch.float32, seed=11)
        fast, ref = layer_fns(case[1], 3.0, 3.0, True)
        check_grads(fast, ref, differentiable(case), f"lstm_layer gemv<={gemv_rows} {schedule} x{threads}")
    finally:
        torch.set_num_threads(before)


def test_lstm_layer_tuning_is_the_environments_choice(monkeypatch):
    # tuning [gemv rows, gemv rows, concurrent from] runs what the environment's forcing runs, forward and
    # backward (the autograd formula passes it on), bit for bit.
    case = layer_case(11, 13, 37, 50, torch.float32, seed=12)
    xg, lengths, w_hh, w_proj, h0, c0 = case

    def run(tuning):
        leaves_ = [t.detach().requires_grad_() for t in (xg.nan_to_num(), w_hh, w_proj, h0, c0)]
        y, h, c = ops.lstm_layer(leaves_[0], lengths, *leaves_[1:3], 3.0, 3.0, *leaves_[3:], tuning=tuning)
        grads = torch.autograd.grad((y * y).sum() + h.sum() + c.sum(), leaves_)
        return (y, h, c, *grads)

    for rows, mode, conc in [("0", "sequential", 0), ("1000", "directions", 1)]:
        tuned = run([int(rows), int(rows), conc])
        with monkeypatch.context() as m:
            m.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", rows)
            m.setenv("ELMO_FAST_BILSTM_THREADS", mode)
            forced = run(None)
        for a, b in zip(tuned, forced):
            assert torch.equal(a, b), (rows, mode)


def indexed_case(case, mode, seed):
    """case's gates as rows of xg [2, U, 4C] picked by token_index [B, T] (junk at padding positions):
    "packed" one row per real position, as bilstm_train passes them; "repeated" U = N / 2 random
    rows (positions share rows: their gradients add up); "spare" packed rows among as many unread ones."""
    xg, lengths, *rest = case
    gen = torch.Generator().manual_seed(seed)
    B, T = xg.shape[1], xg.shape[2]
    valid = torch.arange(T)[None, :] >= 0
    valid = valid & (torch.arange(T)[None, :] < lengths[:, None])
    N = int(valid.sum())
    if mode == "repeated":
        U = max(1, N // 2)
        rows = torch.randn(2, U, xg.shape[3], generator=gen, dtype=torch.float64).to(xg.dtype) * 2
        index = torch.randint(0, U, (B, T), generator=gen)
    else:
        U = N if mode == "packed" else 2 * N + 3
        slots = torch.randperm(U, generator=gen)[:N] if mode == "spare" else torch.arange(N)
        rows = torch.randn(2, U, xg.shape[3], generator=gen, dtype=torch.float64).to(xg.dtype)
        rows[:, slots] = xg[:, valid]
        index = torch.zeros(B, T, dtype=torch.long)
        index[valid] = slots
    junk = torch.tensor([-5, U, U + 1000])[torch.randint(0, 3, (int((~valid).sum()),), generator=gen)]
    index[~valid] = junk
    return rows, lengths, *rest, index


def indexed_fns(lengths, index, cell_clip, proj_clip):
    U_safe = lambda xg: index.clamp(0, max(xg.shape[1] - 1, 0))  # noqa: E731  (the reference reads padding)

    def fast(xg, w_hh, w_proj, h0, c0):
        return ops.lstm_layer(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0, token_index=index)

    def ref(xg, w_hh, w_proj, h0, c0):
        return lstm_layer_pair_ref(xg[:, U_safe(xg)], lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0)

    return fast, ref


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mode", ["packed", "repeated", "spare"])
@pytest.mark.parametrize("lengths", ["random", "full"])
def test_lstm_layer_token_index(mode, lengths, dtype):
    B, T = 7, 9
    case = layer_case(B, T, 5, 6, dtype, seed=21, lengths=torch.full((B,), T) if lengths == "full" else None)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, mode, seed=22)
    fast, ref = indexed_fns(lengths, index, 1.5, 1.0)
    got, _ = check_grads(fast, ref, [xg, w_hh, w_proj, h0, c0], f"lstm_layer token_index {mode} {dtype}")
    read = torch.zeros(xg.shape[1], dtype=torch.bool)
    read[index[torch.arange(T)[None, :] < lengths[:, None]]] = True
    assert torch.all(got[0][:, ~read] == 0), "rows no position reads get exactly 0"


def test_lstm_layer_token_index_gradcheck():
    case = layer_case(5, 6, 3, 4, torch.float64, seed=23, lengths=[6, 0, 3, 1, 5], junk=1e30)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, "repeated", seed=24)
    fast, _ = indexed_fns(lengths, index, 1.0, 0.7)
    assert torch.autograd.gradcheck(fast, leaves([xg, w_hh, w_proj, h0, c0]))


def test_lstm_layer_dense_little_padding():
    # Dense xg with <= 25% padding: dW_hh comes from grad_xg's rows directly (no packed dgates).
    case = layer_case(8, 10, 6, 7, torch.float32, seed=25, lengths=[10, 9, 10, 8, 10, 10, 7, 10])
    fast, ref = layer_fns(case[1], 3.0, 3.0, True)
    check_grads(fast, ref, differentiable(case), "lstm_layer little padding")


def test_lstm_layer_values_and_padding():
    case = layer_case(6, 9, 5, 7, torch.float32, seed=4, lengths=[9, 0, 4, 1, 9, 2])
    xg, lengths, w_hh, w_proj, h0, c0 = case
    y, h, c = ops.lstm_layer(xg, lengths, w_hh, w_proj, 3.0, 3.0, h0, c0)
    want = lstm_layer_pair_ref(*[t.double() for t in (xg.nan_to_num(), lengths, w_hh, w_proj)], 3.0, 3.0,
                               h0.double(), c0.double())
    for name, g, w in zip("yhc", (y, h, c), want):
        assert_close(g, w, what=f"lstm_layer {name}")
    padding = torch.arange(9)[None, :] >= lengths[:, None]
    assert torch.all(y[:, padding] == 0)
    assert torch.equal(h[:, 1], h0[:, 1]) and torch.equal(c[:, 1], c0[:, 1])  # length 0: initial state


# the autouse fixture sets global state once for all examples
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 6), T=st.integers(1, 9), P=st.integers(1, 11), C=st.integers(1, 13),
       seed=st.integers(0, 2**31 - 1), clips=st.sampled_from([(None, None), (1.0, 0.5), (0.0, 2.0)]))
def test_lstm_layer_random_shapes_float64(B, T, P, C, seed, clips):
    case = layer_case(B, T, P, C, torch.float64, seed=seed)
    fast, ref = layer_fns(case[1], *clips, True)
    check_grads(fast, ref, differentiable(case), f"lstm_layer B={B} T={T} P={P} C={C} clips={clips}", seed=seed)


def test_lstm_layer_errors_name_the_argument():
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(3, 4, 3, 5, torch.float32, seed=0, lengths=[4, 1, 2])
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: xg expected shape \[2, B, T, 4C\] = \[2, 3, T, 20\]"):
        ops.lstm_layer(xg[..., :-1], lengths, w_hh, w_proj, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: lengths\[1\] = 5 is out of range \[0, T = 4\]"):
        ops.lstm_layer(xg, torch.tensor([4, 5, 2]), w_hh, w_proj, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: w_hh expected shape \[2, 20, 3\]"):
        ops.lstm_layer(xg, lengths, w_hh[:, :, :2], w_proj, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: c0 expected shape \[2, 3, 5\]"):
        ops.lstm_layer(xg, lengths, w_hh, w_proj, None, None, h0, c0[:1])
    with pytest.raises(RuntimeError, match="lstm_layer_forward: w_proj must have dtype float32, got float64"):
        ops.lstm_layer(xg, lengths, w_hh, w_proj.double(), None, None)
    with pytest.raises(RuntimeError, match="lstm_layer_forward: cell_clip must be positive, 0 or None, got -1"):
        ops.lstm_layer(xg, lengths, w_hh, w_proj, -1.0, None)
    with pytest.raises(RuntimeError, match="lstm_layer_forward: xg has dtype bfloat16; supported: float32, float64"):
        ops.lstm_layer(xg.bfloat16(), lengths, w_hh.bfloat16(), w_proj.bfloat16(), None, None)
    rows = xg[:, 0]
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: token_index\[1, 0\] = 4 is out of range for xg "
                                            r"with 4 rows"):
        ops.lstm_layer(rows, lengths, w_hh, w_proj, None, None, token_index=torch.arange(12).view(3, 4) % 5)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: xg with token_index expected shape \[2, U, 4C\]"):
        ops.lstm_layer(xg, lengths, w_hh, w_proj, None, None, token_index=torch.zeros(3, 4, dtype=torch.long))


def test_no_cuda_backward_says_so(monkeypatch):
    fake_cuda = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(ops, "HAS_CUDA_BACKWARD", False)
    with pytest.raises(NotImplementedError, match="char_cnn has no CUDA backward in this build"):
        ops._no_cuda_backward("char_cnn", fake_cuda)
    with pytest.raises(NotImplementedError, match="lstm_layer has no CUDA kernel in this build"):
        ops._require_training_kernels("lstm_layer", fake_cuda)
    monkeypatch.setattr(ops, "HAS_CUDA_BACKWARD", True)  # a build with the CUDA training ops: no objection
    ops._no_cuda_backward("char_cnn", fake_cuda)
    ops._require_training_kernels("lstm_layer", fake_cuda)


def test_cuda_backward_follows_the_build():
    """The CUDA training ops come with the CUDA kernels: a CPU-only build has neither."""
    assert ops.HAS_CUDA_BACKWARD == (ops.HAS_CUDA_KERNELS and all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"elmo_fast::{name}", "CUDA") for name in ops.TRAINING_OPS))
    if not ops.HAS_CUDA_KERNELS:
        assert not ops.HAS_CUDA_BACKWARD


# --- opcheck and torch.compile ------------------------------------------------------------------------


@pytest.mark.parametrize("B,T,P,C,lengths,clip,state,dtype", [
    (0, 3, 3, 5, [], None, False, torch.float32),
    (1, 1, 3, 5, [1], 1.0, True, torch.float32),
    (5, 7, 3, 5, [7, 0, 3, 1, 5], 1.0, True, torch.float32),
    (3, 4, 16, 24, [2, 4, 3], None, False, torch.float64),
])
def test_lstm_layer_opcheck(B, T, P, C, lengths, clip, state, dtype):
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(B, T, P, C, dtype, seed=B + T, lengths=lengths, state=state, junk=0.0)
    args = [xg, lengths, w_hh, w_proj, clip, clip, h0, c0]
    grad_args = [a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_forward.default, grad_args)
    y, h, c, saved = torch.ops.elmo_fast.lstm_layer_forward.default(*[a.detach() if isinstance(a, torch.Tensor)
                                                                     else a for a in args])
    torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_backward.default,
                          (torch.randn_like(y), torch.randn_like(h), None, saved, lengths, None, list(xg.shape),
                           w_hh.detach(), w_proj.detach(), clip, clip, None if h0 is None else h0.detach(), None))
    rows, *_, index = indexed_case((xg.detach(), lengths, w_hh, w_proj, h0, c0), "repeated", seed=B)
    if B:
        indexed = [rows.requires_grad_(), *grad_args[1:], index]
        torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_forward.default, indexed)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_char_cnn_and_highway_opcheck_with_gradients(activation):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=1)
    ids = elmo_ids(9, seed=1)
    torch.library.opcheck(torch.ops.elmo_fast.char_cnn.default, (ids, *leaves([emb]), leaves(ws), leaves(bs), activation))
    out = ops.char_cnn(ids, emb, ws, bs, activation)
    torch.library.opcheck(torch.ops.elmo_fast.char_cnn_backward.default,
                          (torch.randn_like(out), ids, emb, ws, bs, activation))
    x, *w = leaves(highway_case(6, 8, 4, 2, torch.float32, seed=2))
    torch.library.opcheck(torch.ops.elmo_fast.highway.default, (x, w[:2], w[2:4], w[4], w[5]))
    projected, x = leaves(gate_case(5, 7, torch.float32, seed=3, layout="sliced"))
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (projected, x))
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate_backward.default,
                          (torch.randn(5, 7), projected.detach(), x.detach()))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch internals
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_forward_and_backward(dynamic):
    torch._dynamo.reset()
    case = layer_case(5, 7, 4, 6, torch.float32, seed=6, lengths=[7, 0, 3, 1, 6], junk=0.0)
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=6)
    ids = elmo_ids(11, seed=6)
    hw = highway_case(11, sum(n for _, n in TINY_FILTERS), 8, 1, torch.float32, seed=6)[1:]

    def f(xg, w_hh, w_proj, h0, c0, emb, w0, hw0, pw):
        y, h, c = ops.lstm_layer(xg, case[1], w_hh, w_proj, 3.0, 3.0, h0, c0)
        tokens = ops.highway(ops.char_cnn(ids, emb, [w0, *ws[1:]], bs), [hw0], hw[1:2], pw, hw[3])
        return (y * y).sum() + h.sum() + 0.5 * c.sum() + tokens.square().mean()

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    inputs = [*differentiable(case), emb, ws[0], hw[0], hw[2]]
    a, b = leaves(inputs), leaves(inputs)
    # A cache of its own: inductor's on-disk cache (/tmp/torchinductor_$USER) does not key on a custom op's
    # schema, so code compiled by another checkout whose ops take other arguments would be reused here.
    with fresh_inductor_cache():
        got = torch.autograd.grad(compiled(*b), b)
    want = torch.autograd.grad(f(*a), a)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_grad_close(g, w, what=f"compiled input {i}")


# --- the training stack -----------------------------------------------------------------------------------


def stack_case(B, T, L, P, C, dtype, seed, lengths=None, dropout=0.1):
    """x [B, T, P], lengths, the flat weights (layer 0's w_ih and bias used), h0, c0, dropout masks."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    if lengths is None:
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    weights = []
    for _ in range(2 * L):
        bias = randn(4 * C, std=0.1)
        bias[C:2 * C] += 1.5
        weights += [randn(4 * C, P, std=2.0 * P ** -0.5), randn(4 * C, P, std=0.35 * P ** -0.5), bias,
                    randn(P, C, std=3.0 * C ** -0.5)]
    x = randn(B, T, P, std=1.5)
    h0, c0 = randn(L, B, 2 * P, std=1.5), randn(L, B, 2 * C, std=2.0)
    keep = 1 - dropout
    masks = [(torch.rand(2, B, T, P, generator=gen, dtype=torch.float64) < keep).double() / keep for _ in range(L)]
    cast = lambda ts: [t.to(dtype) for t in ts]  # noqa: E731
    return x.to(dtype), lengths, cast(weights), h0.to(dtype), c0.to(dtype), cast(masks)


def stack_fns(lengths, masks, clip):
    def run(fn):
        def call(x, h0, c0, *w):
            return fn(x, lengths, list(w), clip, clip, h0, c0, 0.1, True, [m.to(x.dtype) for m in masks])
        return call

    return run(ops.bilstm_train), run(bilstm_train_ref)


def test_bilstm_train_gradcheck():
    x, lengths, weights, h0, c0, masks = stack_case(4, 5, 2, 3, 4, torch.float64, seed=1, lengths=[5, 0, 2, 3],
                                                    dropout=0.3)
    fast, _ = stack_fns(lengths, masks, 1.0)
    assert torch.autograd.gradcheck(fast, leaves([x, h0, c0, *weights]))


@pytest.mark.parametrize("B,T,L,P,C,clip", [
    (7, 11, 2, 16, 64, 3.0),      # 'tiny' shapes
    (5, 9, 3, 3, 5, 1.0),         # three layers, odd sizes
    (16, 25, 2, 128, 1024, 3.0),  # 'small' shapes
])
def test_bilstm_train_matches_reference_fp32(B, T, L, P, C, clip):
    gen = torch.Generator().manual_seed(B + T)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths[1] = T
    x, lengths, weights, h0, c0, masks = stack_case(B, T, L, P, C, torch.float32, seed=B * T, lengths=lengths)
    fast, ref = stack_fns(lengths, masks, clip)
    inputs = [x, h0, c0, *weights]
    got = fast(*inputs)
    want = ref(*leaves(inputs, torch.float64))
    for name, g, w in zip(("outputs", "h", "c"), got, want):
        assert_close(g, w, what=f"bilstm_train {name}")
    assert bool((want[2].abs() == clip).any()) and bool((want[0][0].abs() == clip).any()), "clips not exercised"
    check_grads(fast, ref, inputs, f"bilstm_train B={B} T={T} L={L} P={P} C={C}")


def test_bilstm_train_residual_adds_the_dropped_input():
    # bilm-tf: DropoutWrapper(ResidualWrapper(cell)): layer 1 = lstm(drop(y0)) + drop(y0). With layer 1's
    # projection zero its LSTM part is 0, so its output is exactly the dropped layer-0 output.
    x, lengths, weights, h0, c0, masks = stack_case(6, 8, 2, 5, 7, torch.float32, seed=3, dropout=0.5)
    weights[8 + 3] = torch.zeros_like(weights[8 + 3])
    weights[8 + 7] = torch.zeros_like(weights[8 + 7])
    outputs, _, _ = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, 0.5, True, masks)
    dropped = outputs[0].view(6, 8, 2, 5).permute(2, 0, 1, 3) * masks[1]
    assert torch.equal(outputs[1], dropped.permute(1, 2, 0, 3).reshape(6, 8, 10))
    assert bool((masks[1] == 0).any())


def test_bilstm_train_without_dropout_is_bilstm():
    # training=False (or no dropout): the inference op's stack, layer 0's gates from the same x.
    x, lengths, weights, h0, c0, masks = stack_case(9, 13, 2, 16, 64, torch.float32, seed=4)
    B, T, P = x.shape
    for kwargs in (dict(dropout=0.1, training=False, masks=masks), dict(dropout=0.0)):
        got = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, **kwargs)
        want = ops.bilstm(layer0_gates_ref(x.view(B * T, P), weights), torch.arange(B * T).view(B, T), lengths,
                          weights, 3.0, 3.0, h0, c0)
        for g, w in zip(got, want):
            assert_close(g, w, what=f"bilstm_train {kwargs} vs bilstm")
    ref = bilstm_ref(layer0_gates_ref(x.double().view(B * T, P), [w.double() for w in weights]),
                     torch.arange(B * T).view(B, T), lengths, [w.double() for w in weights], 3.0, 3.0, h0.double(),
                     c0.double())
    assert_close(got[0], ref[0], what="bilstm_train vs bilstm_ref")


def test_bilstm_train_fresh_dropout():
    x, lengths, weights, h0, c0, _ = stack_case(8, 10, 2, 16, 64, torch.float32, seed=5, lengths=[10] * 8)
    torch.manual_seed(0)
    a = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, dropout=0.1)
    b = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, dropout=0.1)
    assert not torch.equal(a[0], b[0]), "each call draws its own masks"
    masks = ops.dropout_masks((2, 8, 10, 16), 2, 0.1, generator=torch.Generator().manual_seed(1))
    zeros = torch.cat([(m == 0).flatten() for m in masks]).double().mean().item()
    assert 0.07 < zeros < 0.13 and all(torch.all((m == 0) | (m == 1 / 0.9)) for m in masks)


def test_bilstm_train_per_direction_inputs():
    x, lengths, weights, h0, c0, masks = stack_case(5, 6, 2, 4, 6, torch.float64, seed=6)
    x2 = torch.stack([x, x.flip(-1)])
    fast, ref = stack_fns(lengths, masks, 1.0)
    check_grads(fast, ref, [x2, h0, c0, *weights], "bilstm_train [2, B, T, P] input")
