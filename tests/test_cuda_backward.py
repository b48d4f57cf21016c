"""The CUDA training ops against the autograd of their reference twins (in float64, on the same
rounded inputs) and against the CPU ops: the backward passes of highway_gate and char_cnn, and the
trainable LSTM layer (lstm_layer_forward, which keeps `saved` in the CPU op's layout, and
lstm_layer_backward); then a whole biLM's gradients through ops.char_cnn, ops.highway and
ops.bilstm_train running these kernels.

Two targets, as in tests/test_cuda.py (whose fixtures these are): "cuda" (a GPU and a CUDA build;
skips otherwise) and "emulated" (the same kernels and bindings on the CPU emulator: the cases marked
@emulated_by_default in every run, all of them with ELMO_FAST_CUDA_EMULATION=1). Every tensor the ops allocate starts as NaN (deterministic mode's fill
of uninitialized memory, on both targets), so an element a kernel forgets to write fails.
"""
import contextlib

import pytest
import torch

from elmo_fast import batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops, reference
from elmo_fast.bilm.reference import char_cnn_ref, highway_gate_ref, lstm_layer_pair_ref
from test_backward import (GRADCHECK_CASES, elmo_ids, gate_case, indexed_case, layer_case, near_ties,
                           random_cnn)
from test_char_cnn import ELMO_FILTERS, TINY_FILTERS
from test_cuda import (ALL_DTYPES, LOW_PRECISION, cuda_target, emulated_by_default, emulated_target,  # noqa: F401
                       exact_fp32, poison, same_layout_on, sentences, target)
from test_gradients import bilm_fast_train, rebuild
from tolerances import GRAD_RTOL, assert_close, assert_grad_close

pytestmark = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built (the CPU ops are compared with)")


@pytest.fixture(autouse=True)
def poisoned_allocations(monkeypatch):
    """torch.empty, also inside the ops, returns NaN-filled memory while deterministic mode is on (cuBLAS
    then needs a fixed workspace configuration)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def on(target, t):
    return None if t is None else same_layout_on(t, target.device)


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


# --- highway_gate_backward ---------------------------------------------------------------------------


@emulated_by_default(lambda n, h, layout, dtype: ((n, h), layout, dtype) in (((129, 257), "sliced", torch.float32),
                                                                         ((7, 16), "contiguous", torch.bfloat16)))
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


@emulated_by_default()
def test_highway_gate_backward_expanded_gradient(target):
    projected, x = gate_case(9, 5, torch.float32, seed=1)
    grad = torch.ones(1, 1).expand(9, 5)  # out.sum()'s gradient: stride 0 everywhere
    got = target.op("highway_gate_backward")(grad.to(target.device), on(target, projected), on(target, x))
    want = ref_grads(highway_gate_ref, [projected, x], [grad])
    for g, w in zip(got, want):
        assert_grad_close(g, w, dtype=torch.float32, what=f"{target.name} highway_gate_backward expanded")


# --- char_cnn_backward --------------------------------------------------------------------------------


def check_char_cnn_backward(target, ids, emb, ws, bs, activation, what, seed=0, grad_out=None):
    dtype = emb.dtype
    K = len(ws)
    cols = sum(w.shape[0] for w in ws)
    if grad_out is None:
        grad_out = torch.randn(ids.shape[0], cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        if dtype != torch.float64 and ids.shape[0]:
            # where a max window is not clear, an fp32 kernel and the float64 reference may pick others
            kept = [k for k, w in enumerate(ws) if w.shape[0] > 0]  # (0-filter convolutions: no columns)
            tied = near_ties(ids, emb, [ws[k] for k in kept], [bs[k] for k in kept], activation,
                             margin=1e-2 if dtype in LOW_PRECISION else 1e-4)
            assert tied.double().mean() < 0.1, f"{what}: too many near-ties to test"
            grad_out[tied] = 0.0
        grad_out = grad_out.to(dtype)
    poison(target)
    got_e, got_w, got_b = target.op("char_cnn_backward")(on(target, grad_out), on(target, ids), on(target, emb),
                                                          [on(target, w) for w in ws], [on(target, b) for b in bs],
                                                          activation)
    kept = [k for k, w in enumerate(ws) if w.shape[0] > 0]  # conv1d refuses 0 filters: none to compare there

    def ref(e, *c):
        return char_cnn_ref(ids, e, list(c[:len(kept)]), list(c[len(kept):]), activation)

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


@emulated_by_default(lambda n, activation, dtype: n == 37 and activation == "tanh" and dtype == torch.float32)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("n", [1, 2, 37])
def test_char_cnn_backward(target, n, activation, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=n)
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (1, 50), generator=torch.Generator().manual_seed(n))])
    check_char_cnn_backward(target, ids, emb, ws, bs, activation, f"{target.name} char_cnn_backward N={n} "
                            f"{activation} {dtype}", seed=n)


def test_char_cnn_backward_elmo_filters(target):
    # The small/original models' 2048 filters of widths 1..7, D = 16; many tokens per chunk.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, torch.float32, seed=5)
    n = 24 if target.name == "emulated" else 3000
    check_char_cnn_backward(target, elmo_ids(n, seed=5), emb, ws, bs, "relu", f"{target.name} ELMo filters N={n}")


@emulated_by_default(lambda dtype: dtype == torch.bfloat16)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_char_cnn_backward_low_precision(target, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=11)
    check_char_cnn_backward(target, elmo_ids(21, seed=11), emb, ws, bs, "tanh", f"{target.name} {dtype}", seed=11)


@emulated_by_default(lambda chars: chars in (1, 600))
@pytest.mark.parametrize("chars", [1, 7, 64, 100, 600])
def test_char_cnn_backward_other_token_lengths(target, chars):
    # Rows of L != 50 ids, filters of every width up to L, 0 filters in one convolution, a vocabulary
    # of other size (rows of a wider buffer: strides).
    filters = [(1, 3), (min(2, chars), 0), (chars, 2)] + ([(3, 4)] if chars >= 3 else [])
    emb, ws, bs = random_cnn(filters, 3, torch.float64, seed=chars, vocab=300)
    gen = torch.Generator().manual_seed(chars)
    ids = torch.randint(0, 300, (9, chars + 4), generator=gen)[:, 2:2 + chars]
    ids[4, chars // 2:] = 299
    ids[6] = 0
    check_char_cnn_backward(target, ids, emb, ws, bs, "relu", f"{target.name} char_cnn_backward L={chars}")


@emulated_by_default()
def test_char_cnn_backward_expanded_gradient_and_no_tokens(target):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=3)
    ids = elmo_ids(30, seed=3)
    ones = torch.ones(1, 1, dtype=torch.float64).expand(30, sum(w.shape[0] for w in ws))
    check_char_cnn_backward(target, ids, emb, ws, bs, "tanh", f"{target.name} expanded gradient", grad_out=ones)
    e, w, b = target.op("char_cnn_backward")(torch.zeros(0, ones.shape[1], dtype=torch.float64, device=target.device),
                                             ids[:0].to(target.device), emb.to(target.device),
                                             [x.to(target.device) for x in ws], [x.to(target.device) for x in bs],
                                             "relu")
    assert all(torch.all(t == 0) for t in (e, *w, *b))
    assert e.shape == emb.shape


def test_char_cnn_backward_unused_rows_get_zero(target):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=2)
    ids = elmo_ids(20, seed=2)
    e, _, _ = check_char_cnn_backward(target, ids, emb, ws, bs, "relu", f"{target.name} unused rows")
    unused = torch.ones(262, dtype=torch.bool)
    unused[ids.unique()] = False
    assert torch.all(e.cpu()[unused] == 0) and e.cpu()[~unused].abs().sum() > 0


@emulated_by_default()
def test_char_cnn_backward_bad_id_gives_nan(target):
    # The forward gives such a token a NaN row (no device sync to check ids): its gradients say so too.
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=4)
    ids = elmo_ids(6, seed=4)
    ids[2, 3] = 262
    grad = torch.ones(6, sum(w.shape[0] for w in ws))
    e, w, b = target.op("char_cnn_backward")(grad.to(target.device), ids.to(target.device), emb.to(target.device),
                                             [x.to(target.device) for x in ws], [x.to(target.device) for x in bs],
                                             "tanh")
    assert all(t.isnan().any() for t in b) and e.isnan().any()


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
    check_char_cnn_backward(target, ids, emb, ws, bs, "relu",
                            f"{target.name} char_cnn_backward, histogram budget {budget} bytes", seed=12)


def test_char_cnn_backward_is_deterministic(target):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=6)
    ids = elmo_ids(50, seed=6)
    grad = torch.randn(50, sum(w.shape[0] for w in ws), generator=torch.Generator().manual_seed(6))
    args = (grad.to(target.device), ids.to(target.device), emb.to(target.device), [x.to(target.device) for x in ws],
            [x.to(target.device) for x in bs], "relu")
    first, again = target.op("char_cnn_backward")(*args), target.op("char_cnn_backward")(*args)
    assert torch.equal(first[0], again[0]) and all(torch.equal(a, b) for a, b in zip(first[1], again[1]))


# --- lstm_layer_forward / lstm_layer_backward -----------------------------------------------------------


def run_layer(target, case, cell_clip, proj_clip, token_index=None, grads=("y", "h", "c"), seed=0,
              host_plan=True):
    """The target's forward and backward of one layer against the reference's (float64) and the CPU op's
    `saved`. Returns the target's gradients."""
    xg, lengths, w_hh, w_proj, h0, c0 = case
    dtype = xg.dtype
    what = f"{target.name} lstm_layer {dtype} clips={cell_clip, proj_clip} grads={grads}"
    plan = (lambda t: t) if host_plan else (lambda t: on(target, t))  # lengths / token_index
    poison(target)
    y, h, c, saved = target.op("lstm_layer_forward")(on(target, xg), plan(lengths), on(target, w_hh),
                                                     on(target, w_proj), cell_clip, proj_clip, on(target, h0),
                                                     on(target, c0), None if token_index is None else plan(token_index))
    B = lengths.shape[0]
    T = xg.shape[2] if token_index is None else token_index.shape[1]
    safe = None if token_index is None else token_index.clamp(0, max(xg.shape[1] - 1, 0))
    dense = xg if token_index is None else xg[:, safe]

    def ref(xg_, w_hh_, w_proj_, *hc):
        dense_ = xg_.nan_to_num() if token_index is None else xg_[:, safe]
        return lstm_layer_pair_ref(dense_, lengths, w_hh_, w_proj_, cell_clip, proj_clip, *hc)

    hc = [t for t in (h0, c0) if t is not None]
    if len(hc) == 1:
        pytest.fail("give both states or neither")
    want = lstm_layer_pair_ref(*[t.double() for t in (dense.nan_to_num(), lengths, w_hh, w_proj)], cell_clip,
                               proj_clip, *[t.double() for t in hc])
    for name, g, w in zip("yhc", (y, h, c), want):
        assert g.dtype == dtype and g.device == target.device, what
        assert_close(g, w, dtype=dtype, what=f"{what} {name}")
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    assert torch.all(y.cpu()[:, padding] == 0), f"{what}: padding"
    cpu_saved = torch.ops.elmo_fast.lstm_layer_forward.default(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0,
                                                                c0, token_index)[3]
    assert saved.shape == cpu_saved.shape and saved.is_contiguous(), what
    assert_close(saved, cpu_saved.double(), dtype=dtype, what=f"{what} saved (the CPU op's layout)")

    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64) if name in grads else None
               for name, t in zip("yhc", (y, h, c))]
    got = target.op("lstm_layer_backward")(*[None if w is None else on(target, w.to(dtype)) for w in weights], saved,
                                           plan(lengths), None if token_index is None else plan(token_index),
                                           list(xg.shape), on(target, w_hh), on(target, w_proj), cell_clip,
                                           proj_clip, on(target, h0), on(target, c0))
    inputs = [xg, w_hh, w_proj, *hc]
    expected = ref_grads(ref, inputs, weights)
    names = ["xg", "w_hh", "w_proj", "h0", "c0"]
    for name, g, w in zip(names, got, expected):
        assert g.dtype == dtype and g.device == target.device, f"{what} {name}"
        assert_grad_close(g, w, dtype=dtype, what=f"{what} grad {name}")
    if not hc:  # the gradients of the zero states: those of h0 and c0 given as zeros
        zeros = [torch.zeros(2, B, w_hh.shape[2], dtype=dtype), torch.zeros(2, B, w_proj.shape[2], dtype=dtype)]
        expected = ref_grads(ref, [xg, w_hh, w_proj, *zeros], weights)
        for name, g, w in zip(names[3:], got[3:], expected[3:]):
            assert_grad_close(g, w, dtype=dtype, what=f"{what} grad {name} (zero states)")
    return got


@emulated_by_default(lambda B, T, P, C, lengths, clips, dtype: (B, T, P, C) == (6, 13, 37, 50) and clips == (1.0, 0.7)
                     and dtype == torch.float32)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("clips", [(1.0, 0.7), (None, None), (3.0, 0.0)], ids=["clips", "no_clips", "cell_clip"])
@pytest.mark.parametrize("B,T,P,C,lengths", GRADCHECK_CASES + [(9, 19, 16, 64, None), (6, 13, 37, 50, None)])
def test_lstm_layer(target, B, T, P, C, lengths, clips, dtype):
    case = layer_case(B, T, P, C, dtype, seed=B * T + P, lengths=lengths)
    run_layer(target, case, *clips, seed=B)


@pytest.mark.parametrize("state", [True, False], ids=["states", "zero_states"])
@pytest.mark.parametrize("layout", ["sliced", "feature_major"])
def test_lstm_layer_non_contiguous_gates(target, layout, state):
    case = layer_case(5, 6, 3, 5, torch.float32, seed=7, lengths=[6, 0, 3, 1, 5], layout=layout, state=state)
    assert not case[0].is_contiguous()
    run_layer(target, case, 1.0, 0.7)


@emulated_by_default(lambda grads: grads == ("h", "c"))
@pytest.mark.parametrize("grads", [("y",), ("h",), ("c",), ("h", "c"), ()], ids=lambda g: "+".join(g) or "none")
def test_lstm_layer_backward_of_some_outputs(target, grads):
    case = layer_case(5, 7, 4, 6, torch.float64, seed=8, lengths=[7, 2, 0, 5, 1])
    got = run_layer(target, case, 1.0, 0.7, grads=grads)
    if not grads:
        assert all(torch.all(g == 0) for g in got)


def test_lstm_layer_backward_expanded_output_gradient(target):
    # y.sum()'s gradient: stride 0 everywhere; the op reads rows of P.
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(4, 5, 3, 4, torch.float64, seed=9, lengths=[5, 1, 0, 3])
    y, h, c, saved = target.op("lstm_layer_forward")(on(target, xg), lengths, on(target, w_hh), on(target, w_proj),
                                                     1.0, 0.7, on(target, h0), on(target, c0))
    ones = torch.ones(1, 1, 1, 1, dtype=torch.float64, device=target.device).expand(y.shape)
    got = target.op("lstm_layer_backward")(ones, None, None, saved, lengths, None, list(xg.shape), on(target, w_hh),
                                           on(target, w_proj), 1.0, 0.7, on(target, h0), on(target, c0))
    padding = torch.arange(5)[None, :] >= lengths[:, None]
    weight = (~padding).double()[None, :, :, None].expand(y.shape)  # the reference's y is 0 at padding anyway
    want = ref_grads(lambda x, a, b, s, t: lstm_layer_pair_ref(x.nan_to_num(), lengths, a, b, 1.0, 0.7, s, t),
                     [xg, w_hh, w_proj, h0, c0], [weight])
    for name, g, w in zip(["xg", "w_hh", "w_proj", "h0", "c0"], got, want):
        assert_grad_close(g, w, what=f"{target.name} expanded grad_y: {name}")


@emulated_by_default(lambda mode, dtype: mode == "repeated" and dtype == torch.float32)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mode", ["packed", "repeated", "spare"])
def test_lstm_layer_token_index(target, mode, dtype):
    # Gates as rows picked by token_index (bilstm_train's packed rows; rows read by several positions
    # sum their gradients; rows no position reads get exactly 0).
    B, T = 7, 9
    case = layer_case(B, T, 5, 6, dtype, seed=21)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, mode, seed=22)
    got = run_layer(target, (xg, lengths, w_hh, w_proj, h0, c0), 1.5, 1.0, token_index=index)
    read = torch.zeros(xg.shape[1], dtype=torch.bool)
    read[index[torch.arange(T)[None, :] < lengths[:, None]]] = True
    assert torch.all(got[0].cpu()[:, ~read] == 0), "rows no position reads get exactly 0"


def test_lstm_layer_lengths_and_token_index_on_the_device(target):
    case = layer_case(7, 9, 5, 6, torch.float32, seed=23)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, "repeated", seed=24)
    run_layer(target, (xg, lengths, w_hh, w_proj, h0, c0), 1.5, 1.0, token_index=index, host_plan=False)


def test_lstm_layer_is_deterministic(target):
    # Rows read by many positions accumulate in a fixed order (index_put_ with accumulate).
    case = layer_case(16, 12, 8, 16, torch.float32, seed=25)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, "repeated", seed=26)
    args = [on(target, t) for t in (xg, lengths, w_hh, w_proj)]
    outs = [target.op("lstm_layer_forward")(*args, 1.0, 1.0, on(target, h0), on(target, c0), index) for _ in range(2)]
    grad_y = torch.randn(outs[0][0].shape, generator=torch.Generator().manual_seed(0)).to(target.device)
    grads = [target.op("lstm_layer_backward")(grad_y, None, None, o[3], lengths, index, list(xg.shape), args[2],
                                              args[3], 1.0, 1.0, on(target, h0), on(target, c0)) for o in outs]
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@emulated_by_default()
def test_lstm_layer_errors_are_the_cpu_ops(target):
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(3, 4, 3, 5, torch.float32, seed=0, lengths=[4, 1, 2])
    op = target.op("lstm_layer_forward")
    d = (lambda t: on(target, t))
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: xg expected shape \[2, B, T, 4C\] = \[2, 3, T, 20\]"):
        op(d(xg[..., :-1]), lengths, d(w_hh), d(w_proj), None, None, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: lengths\[1\] = 5 is out of range \[0, T = 4\]"):
        op(d(xg), torch.tensor([4, 5, 2]), d(w_hh), d(w_proj), None, None, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: w_hh expected shape \[2, 20, 3\]"):
        op(d(xg), lengths, d(w_hh[:, :, :2]), d(w_proj), None, None, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: c0 expected shape \[2, 3, 5\]"):
        op(d(xg), lengths, d(w_hh), d(w_proj), None, None, d(h0), d(c0[:1]))
    with pytest.raises(RuntimeError, match="lstm_layer_forward: w_proj must have dtype float32, got float64"):
        op(d(xg), lengths, d(w_hh), d(w_proj.double()), None, None, None, None)
    with pytest.raises(RuntimeError, match="lstm_layer_forward: cell_clip must be positive, 0 or None, got -1"):
        op(d(xg), lengths, d(w_hh), d(w_proj), -1.0, None, None, None)
    with pytest.raises(RuntimeError, match="lstm_layer_forward: xg has dtype bfloat16; supported: float32, float64"):
        op(d(xg.bfloat16()), lengths, d(w_hh.bfloat16()), d(w_proj.bfloat16()), None, None, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: token_index\[1, 0\] = 4 is out of range for xg "
                                            r"with 4 rows"):
        op(d(xg[:, 0]), lengths, d(w_hh), d(w_proj), None, None, None, None, torch.arange(12).view(3, 4) % 5)
    y, h, c, saved = op(d(xg.nan_to_num()), lengths, d(w_hh), d(w_proj), None, None, None, None)
    with pytest.raises(RuntimeError, match=r"lstm_layer_backward: saved must be lstm_layer_forward's contiguous "
                                            r"\[2, N, 6C \+ P\] = \[2, 7, 33\]"):
        target.op("lstm_layer_backward")(None, None, None, saved[:, 1:], lengths, None, list(xg.shape), d(w_hh),
                                         d(w_proj), None, None, None, None)


# --- a whole biLM's gradients through ops.char_cnn, ops.highway and ops.bilstm_train ------------------


_EMU_AUTOGRAD = []


@pytest.fixture
def ops_on(target, monkeypatch):
    """The device on which elmo_fast.bilm.ops runs the target's kernels: CUDA tensors for "cuda"; for
    "emulated", CPU tensors with torch.ops.elmo_fast swapped for the emulation's library (and the ops'
    autograd formulas registered on it), so that ops.* run the emulated CUDA kernels."""
    if target.is_cuda:
        return target.device
    emu = torch.ops.elmo_fast_emu
    assert torch.ops.elmo_fast is not emu  # (also makes the namespace an attribute of torch.ops)
    if not _EMU_AUTOGRAD:
        for name, backward, setup in (("char_cnn", ops._char_cnn_backward, ops._char_cnn_setup_context),
                                      ("highway_gate", ops._highway_gate_backward, ops._highway_gate_setup_context),
                                      ("lstm_layer_forward", ops._lstm_layer_backward, ops._lstm_layer_setup_context)):
            torch.library.register_autograd(f"elmo_fast_emu::{name}", backward, setup_context=setup)
        _EMU_AUTOGRAD.append(True)
    monkeypatch.setattr(torch.ops, "elmo_fast", emu)
    return target.device


@contextlib.contextmanager
def ran_ops(target):
    """The names of the target library's ops (elmo_fast / elmo_fast_emu) that ran inside the block."""
    library = "elmo_fast_emu::" if target.name == "emulated" else "elmo_fast::"
    ran = set()
    with torch.autograd.profiler.profile() as prof:
        yield ran
    ran.update(e.name[len(library):] for e in prof.function_events if e.name.startswith(library))


@emulated_by_default(lambda dtype: dtype == torch.float32)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_whole_bilm_training_on_the_target_equals_the_reference(target, ops_on, random_models, dtype):
    """bilm_ref's outputs and the gradients of every weight, from the fast ops under autograd (char_cnn,
    highway, bilstm_train: the kernels under test), against bilm_ref's autograd in float64 on the CPU."""
    import numpy as np

    options_file, weight_file = random_models("tiny", exercise_clips=True)
    weights = load_weights(weight_file, load_options(options_file)).to(dtype=dtype)
    options = weights.options
    ids = batch_to_ids(sentences(np.random.default_rng(8), 5, 1, 9) + [[]])
    fast_t = [t.detach().to(ops_on).requires_grad_() for t in weights.tensors()]
    ref_t = [t.detach().double().requires_grad_() for t in weights.tensors()]
    ref = reference.bilm_ref(ids, rebuild(options, ref_t))
    outs_ref = [*ref[0], ref[2], ref[3]]
    gen = torch.Generator().manual_seed(3)
    projections = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs_ref]
    with ran_ops(target) as ran:
        fast = bilm_fast_train(ids.to(ops_on), rebuild(options, fast_t))
        outs_fast = [*fast[0], fast[2], fast[3]]
        got = torch.autograd.grad(sum((o * p.to(o)).sum() for o, p in zip(outs_fast, projections)), fast_t)
    assert set(ops.TRAINING_OPS) | {"char_cnn", "highway_gate"} <= ran, f"the target's kernels did not all run: {ran}"
    for k, (a, b) in enumerate(zip(outs_fast, outs_ref)):
        assert_close(a, b, dtype=dtype, what=f"{target.name} output {k}")
    want = torch.autograd.grad(sum((o * p).sum() for o, p in zip(outs_ref, projections)), ref_t)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == ops_on.type
        assert_grad_close(g, w, dtype=dtype, what=f"{target.name} gradient {i}")
    assert all(g.abs().sum() > 0 for g in got)  # every weight trains


def test_bilstm_train_with_dropout_on_the_target(target, ops_on):
    """bilstm_train's masks and skip connections on the target's kernels against bilstm_train_ref."""
    from test_backward import stack_case

    x, lengths, weights, h0, c0, masks = stack_case(5, 7, 2, 4, 6, torch.float64, seed=4, lengths=[7, 0, 3, 1, 6])
    dev = ops_on
    fast_in = [t.to(dev).requires_grad_() for t in (x, h0, c0, *weights)]
    ref_in = [t.clone().requires_grad_() for t in (x, h0, c0, *weights)]
    ref = reference.bilstm_train_ref(ref_in[0], lengths, ref_in[3:], 3.0, 3.0, ref_in[1], ref_in[2], 0.1, True, masks)
    gen = torch.Generator().manual_seed(5)
    proj = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref]
    with ran_ops(target) as ran:
        fast = ops.bilstm_train(fast_in[0], lengths.to(dev), fast_in[3:], 3.0, 3.0, fast_in[1], fast_in[2], 0.1, True,
                                [m.to(dev) for m in masks])
        got = torch.autograd.grad(sum((o * p.to(o)).sum() for o, p in zip(fast, proj)), fast_in)
    assert {"lstm_layer_forward", "lstm_layer_backward"} <= ran, ran
    for a, b in zip(fast, ref):
        assert_close(a, b, what=f"{target.name} bilstm_train outputs")
    want = torch.autograd.grad(sum((o * p).sum() for o, p in zip(ref, proj)), ref_in)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_grad_close(g, w, what=f"{target.name} bilstm_train gradient {i}")


def test_training_ops_opcheck_on_cuda(cuda_target):
    """The CUDA kernels against the ops' fakes and autograd formulas (torch.library.opcheck)."""
    dev = cuda_target.device
    grad_leaf = (lambda t: t.detach().to(dev).requires_grad_())
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(5, 7, 3, 5, torch.float32, seed=12, lengths=[7, 0, 3, 1, 5],
                                                   junk=0.0)
    args = [grad_leaf(xg), lengths, grad_leaf(w_hh), grad_leaf(w_proj), 1.0, 1.0, grad_leaf(h0), grad_leaf(c0)]
    torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_forward.default, args)
    y, h, c, saved = torch.ops.elmo_fast.lstm_layer_forward.default(*[a.detach() if isinstance(a, torch.Tensor)
                                                                     else a for a in args])
    torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_backward.default,
                          (torch.randn_like(y), torch.randn_like(h), None, saved, lengths, None, list(xg.shape),
                           w_hh.to(dev), w_proj.to(dev), 1.0, 1.0, h0.to(dev), None))
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=1)
    ids = elmo_ids(9, seed=1).to(dev)
    torch.library.opcheck(torch.ops.elmo_fast.char_cnn.default,
                          (ids, grad_leaf(emb), [grad_leaf(w) for w in ws], [grad_leaf(b) for b in bs], "tanh"))
    out = ops.char_cnn(ids, emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "tanh")
    torch.library.opcheck(torch.ops.elmo_fast.char_cnn_backward.default,
                          (torch.randn_like(out), ids, emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs],
                           "tanh"))
    projected, x = gate_case(5, 16, torch.float32, seed=3, layout="sliced")
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (grad_leaf(projected), grad_leaf(x)))
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate_backward.default,
                          (torch.randn(5, 16, device=dev), projected.to(dev), x.to(dev)))


def test_emulation_has_every_training_op(emulated_target):
    for name in ops.TRAINING_OPS:
        emu = getattr(torch.ops.elmo_fast_emu, name).default._schema
        real = getattr(torch.ops.elmo_fast, name).default._schema
        assert str(emu).replace("elmo_fast_emu::", "elmo_fast::") == str(real), name


def test_training_uses_the_cuda_ops_only_where_built():
    from elmo_fast.training.trainer import training_backend

    assert training_backend("fast", "cpu") == "fast"
    assert training_backend("fast", "cuda") == ("fast" if ops.HAS_CUDA_BACKWARD else "reference")
