"""The LSTM's CUDA kernels against the reference: the inference biLSTM (bilstm), one trainable layer
(lstm_layer_forward, which keeps `saved` in the CPU op's layout, and lstm_layer_backward) and the
training stack on it (ops.bilstm_train).

Two targets run each test (tests/support/cuda_targets.py): "cuda", the kernels on a GPU (skips, saying
why, without one), and "emulated", the same kernels and bindings compiled for the CPU emulator (a default
subset; every case with ELMO_FAST_CUDA_EMULATION=1). Outputs come from a poisoned allocator; the backward
passes run with @poisoned (tests/support/grad_checks.py); TF32 is off (exact_fp32)."""

import pytest
import torch
from cuda_targets import (
    LOW_PRECISION,
    emulated_by_default,
    exact_fp32,  # noqa: F401  (autouse: TF32 off)
    needs_cpu_ops,
    no_nan,
    on,
    poison,
    ran_ops,
    same_layout_on,
)
from grad_checks import poisoned, ref_grads
from lstm_cases import GRADCHECK_CASES, LSTM_CASES, indexed_case, layer_case, lstm_inputs, stack_case
from tolerances import assert_close, assert_grad_close, max_abs_error

from elmo_fast.bilm import ops, reference
from elmo_fast.bilm.reference import bilstm_ref, lstm_layer_pair_ref


def run_bilstm(target, xg0, token_index, lengths, weights, cell_clip, proj_clip, h0, c0, lengths_on_cpu=False):
    dev = target.device
    mv = lambda t: None if t is None else same_layout_on(t, dev)
    poison(target)
    return target.op("bilstm")(
        mv(xg0),
        mv(token_index),
        lengths if lengths_on_cpu else mv(lengths),
        [mv(w) for w in weights],
        cell_clip,
        proj_clip,
        mv(h0),
        mv(c0),
    )


def check_bilstm(target, case, dtype, clips, states, seed=0, **run_kwargs):
    L, B, T, P, C, lengths = LSTM_CASES[case]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, dtype, seed, states=states)
    what = f"{target.name} bilstm {case} {dtype} clips={clips} states={states}"
    got = run_bilstm(target, xg0, token_index, lengths, weights, *clips, h0, c0, **run_kwargs)
    d64 = lambda t: None if t is None else t.double()
    expected = bilstm_ref(xg0.double(), token_index, lengths, [w.double() for w in weights], *clips, d64(h0), d64(c0))
    for name, g, e in zip(("outputs", "h", "c"), got, expected):
        assert g.shape == e.shape and g.dtype == dtype and g.device == target.device, f"{what} {name}"
        if dtype in LOW_PRECISION:  # bounded by PyTorch's own error in that dtype
            no_nan(g, f"{what} {name}")
        else:
            assert_close(g, e, dtype=dtype, what=f"{what} {name}")
    if dtype in LOW_PRECISION:
        mv = lambda t: None if t is None else t.to(target.device)
        lowp = bilstm_ref(mv(xg0), mv(token_index), lengths, [mv(w) for w in weights], *clips, mv(h0), mv(c0))
        for name, g, lp, e in zip(("outputs", "h", "c"), got, lowp, expected):
            assert max_abs_error(g, e) <= 2 * max_abs_error(lp, e) + 2e-2, f"{what} {name}"
    if B and T and any(lengths):  # padding stays exactly zero
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        assert (got[0].cpu()[:, pad] == 0).all(), f"{what}: padding not zero"
    return got, expected


@emulated_by_default(
    lambda case, clips, states: (
        case in ("one_token", "unsorted_with_empty_rows", "empty_batch") and clips == (3.0, 3.0) and states
    )
)
@pytest.mark.parametrize("case", list(LSTM_CASES))
@pytest.mark.parametrize("clips", [(3.0, 3.0), (None, None), (0.0, 0.5)], ids=["clips", "no_clips", "proj_clip"])
@pytest.mark.parametrize("states", [False, True], ids=["zero_states", "states"])
def test_bilstm_float32(target, case, clips, states):
    check_bilstm(target, case, torch.float32, clips, states)


@emulated_by_default(lambda case, dtype: case == "unsorted_with_empty_rows" and dtype == torch.bfloat16)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["sorted", "unsorted_with_empty_rows", "three_layers"])
def test_bilstm_other_dtypes(target, case, dtype):
    check_bilstm(target, case, dtype, (3.0, 3.0), True)


def test_bilstm_exercises_the_clips(target):
    _, expected = check_bilstm(target, "sorted", torch.float32, (3.0, 3.0), True)
    assert expected[2].abs().max() == 3.0, "cell clip not reached: the test data should exercise it"
    assert expected[0][0].abs().max() == 3.0, "projection clip not reached"


def test_bilstm_lengths_on_cpu(target):
    check_bilstm(target, "unsorted_with_empty_rows", torch.float32, (3.0, 3.0), True, lengths_on_cpu=True)


@emulated_by_default()
def test_bilstm_non_contiguous_inputs(target):
    L, B, T, P, C, lengths = LSTM_CASES["unsorted_with_empty_rows"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 9, states=True)
    g = torch.Generator().manual_seed(1)
    xg0_nc = torch.cat([torch.randn(xg0.shape[0], 2, 3, generator=g), xg0], 2)[:, :, 3:]
    index_nc = torch.stack([token_index, token_index + 1000], 2).reshape(B, 2 * T)[:, ::2]  # column stride 2
    weights_nc = [w.t().contiguous().t() if w.dim() == 2 else torch.stack([w, w], 1)[:, 0] for w in weights]
    h0_nc = h0.transpose(0, 1).contiguous().transpose(0, 1)
    assert not any(t.is_contiguous() for t in (xg0_nc, index_nc, weights_nc[1], weights_nc[2], h0_nc))
    assert torch.equal(index_nc, token_index) and torch.equal(xg0_nc, xg0)
    got = run_bilstm(target, xg0_nc, index_nc, lengths, weights_nc, 3.0, 3.0, h0_nc, c0)
    expected = bilstm_ref(xg0, token_index, lengths, weights, 3.0, 3.0, h0, c0)
    for g_, e in zip(got, expected):
        assert_close(g_, e.double(), dtype=torch.float32, what=f"{target.name} bilstm non-contiguous")


def test_bilstm_stacked_weight_views(target):
    # Weights that are views of one [2, ...] tensor per kind take the no-copy path of stack_pair;
    # the results must be identical to separate tensors'.
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 2, states=True)
    dev = target.device
    stacked = []
    for l in range(L):
        for k in range(4):
            both = torch.stack([weights[8 * l + k], weights[8 * l + 4 + k]]).to(dev)
            stacked.append((l, k, both))
    views = [None] * len(weights)
    for l, k, both in stacked:
        views[8 * l + k], views[8 * l + 4 + k] = both[0], both[1]
    separate = run_bilstm(target, xg0, token_index, lengths, weights, 3.0, 3.0, h0, c0)
    shared = target.op("bilstm")(
        xg0.to(dev), token_index.to(dev), lengths.to(dev), views, 3.0, 3.0, h0.to(dev), c0.to(dev)
    )
    for a, b in zip(separate, shared):
        assert torch.equal(a, b)


def test_bilstm_under_deterministic_algorithms(target, monkeypatch):
    # The host loop uses only ops that deterministic mode allows (gathers, no index_copy_/scatter);
    # cuBLAS GEMMs are allowed there only with a fixed workspace configuration.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        first = check_bilstm(target, "unsorted_with_empty_rows", torch.float32, (3.0, 3.0), True)[0]
        again = check_bilstm(target, "unsorted_with_empty_rows", torch.float32, (3.0, 3.0), True)[0]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@emulated_by_default()
def test_bilstm_clamps_token_index_as_the_reference(target):
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 3)
    token_index[0, 0], token_index[1, 2] = -3, xg0.shape[0] + 5  # active positions, out of range
    got = run_bilstm(target, xg0, token_index, lengths, weights, 3.0, 3.0, None, None)
    expected = bilstm_ref(xg0.double(), token_index, lengths, [w.double() for w in weights], 3.0, 3.0)
    for g_, e in zip(got, expected):
        assert_close(g_, e, dtype=torch.float32, what=f"{target.name} bilstm clamped index")


def test_bilstm_many_rows_use_the_grid_stride_loop(cuda_target):
    # 2 B > 65535 (direction, row) pairs: rows past grid.y come from the kernels' row loops.
    B = 33000
    lengths = torch.randint(0, 4, (B,), generator=torch.Generator().manual_seed(0)).tolist()
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(2, B, 3, 4, 4, lengths, torch.float32, 4, states=True)
    got = run_bilstm(cuda_target, xg0, token_index, lengths, weights, 3.0, 3.0, h0, c0)
    expected = bilstm_ref(
        xg0.double(), token_index, lengths, [w.double() for w in weights], 3.0, 3.0, h0.double(), c0.double()
    )
    for g_, e in zip(got, expected):
        assert_close(g_, e, dtype=torch.float32, what="bilstm B=33000")


def test_bilstm_errors_name_the_argument_on_cuda(cuda_target):
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 5)
    dev = cuda_target.device
    op = torch.ops.elmo_fast.bilstm.default
    wd = [w.to(dev) for w in weights]
    with pytest.raises(RuntimeError, match="bilstm: token_index and xg0 must be on the same device"):
        op(xg0.to(dev), token_index, lengths.to(dev), wd, 3.0, 3.0, None, None)
    with pytest.raises(RuntimeError, match=r"bilstm: weights\[5\] \(w_hh\) must be on xg0's device"):
        op(
            xg0.to(dev),
            token_index.to(dev),
            lengths,
            [w if i == 5 else w.to(dev) for i, w in enumerate(weights)],
            3.0,
            3.0,
            None,
            None,
        )
    with pytest.raises(RuntimeError, match=r"bilstm: lengths\[0\] = 10 is out of range \[0, T = 9\]"):
        op(xg0.to(dev), token_index.to(dev), torch.tensor([10, 1, 1, 1, 1], device=dev), wd, 3.0, 3.0, None, None)
    with pytest.raises(RuntimeError, match="bilstm: cell_clip must be positive, 0 or None, got -1"):
        op(xg0.to(dev), token_index.to(dev), lengths, wd, -1.0, 3.0, None, None)


# --- lstm_layer_forward / lstm_layer_backward -----------------------------------------------------


def run_layer(target, case, cell_clip, proj_clip, token_index=None, grads=("y", "h", "c"), seed=0, host_plan=True):
    """The target's forward and backward of one layer against the reference's (float64) and the CPU op's
    `saved`. Returns the target's gradients."""
    xg, lengths, w_hh, w_proj, h0, c0 = case
    dtype = xg.dtype
    what = f"{target.name} lstm_layer {dtype} clips={cell_clip, proj_clip} grads={grads}"
    plan = (lambda t: t) if host_plan else (lambda t: on(target, t))  # lengths / token_index
    poison(target)
    y, h, c, saved = target.op("lstm_layer_forward")(
        on(target, xg),
        plan(lengths),
        on(target, w_hh),
        on(target, w_proj),
        cell_clip,
        proj_clip,
        on(target, h0),
        on(target, c0),
        None if token_index is None else plan(token_index),
    )
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
    want = lstm_layer_pair_ref(
        *[t.double() for t in (dense.nan_to_num(), lengths, w_hh, w_proj)],
        cell_clip,
        proj_clip,
        *[t.double() for t in hc],
    )
    for name, g, w in zip("yhc", (y, h, c), want):
        assert g.dtype == dtype and g.device == target.device, what
        assert_close(g, w, dtype=dtype, what=f"{what} {name}")
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    assert torch.all(y.cpu()[:, padding] == 0), f"{what}: padding"
    cpu_saved = torch.ops.elmo_fast.lstm_layer_forward.default(
        xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0, token_index
    )[3]
    assert saved.shape == cpu_saved.shape and saved.is_contiguous(), what
    assert_close(saved, cpu_saved.double(), dtype=dtype, what=f"{what} saved (the CPU op's layout)")

    gen = torch.Generator().manual_seed(seed)
    weights = [
        torch.randn(t.shape, generator=gen, dtype=torch.float64) if name in grads else None
        for name, t in zip("yhc", (y, h, c))
    ]
    got = target.op("lstm_layer_backward")(
        *[None if w is None else on(target, w.to(dtype)) for w in weights],
        saved,
        plan(lengths),
        None if token_index is None else plan(token_index),
        list(xg.shape),
        on(target, w_hh),
        on(target, w_proj),
        cell_clip,
        proj_clip,
        on(target, h0),
        on(target, c0),
    )
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


@needs_cpu_ops
@poisoned
@emulated_by_default(
    lambda B, T, P, C, lengths, clips, dtype: (
        (B, T, P, C) == (6, 13, 37, 50) and clips == (1.0, 0.7) and dtype == torch.float32
    )
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("clips", [(1.0, 0.7), (None, None), (3.0, 0.0)], ids=["clips", "no_clips", "cell_clip"])
@pytest.mark.parametrize("B,T,P,C,lengths", GRADCHECK_CASES + [(9, 19, 16, 64, None), (6, 13, 37, 50, None)])
def test_lstm_layer(target, B, T, P, C, lengths, clips, dtype):
    case = layer_case(B, T, P, C, dtype, seed=B * T + P, lengths=lengths)
    run_layer(target, case, *clips, seed=B)


@needs_cpu_ops
@poisoned
@pytest.mark.parametrize("state", [True, False], ids=["states", "zero_states"])
@pytest.mark.parametrize("layout", ["sliced", "feature_major"])
def test_lstm_layer_non_contiguous_gates(target, layout, state):
    case = layer_case(5, 6, 3, 5, torch.float32, seed=7, lengths=[6, 0, 3, 1, 5], layout=layout, state=state)
    assert not case[0].is_contiguous()
    run_layer(target, case, 1.0, 0.7)


@needs_cpu_ops
@poisoned
@emulated_by_default(lambda grads: grads == ("h", "c"))
@pytest.mark.parametrize("grads", [("y",), ("h",), ("c",), ("h", "c"), ()], ids=lambda g: "+".join(g) or "none")
def test_lstm_layer_backward_of_some_outputs(target, grads):
    case = layer_case(5, 7, 4, 6, torch.float64, seed=8, lengths=[7, 2, 0, 5, 1])
    got = run_layer(target, case, 1.0, 0.7, grads=grads)
    if not grads:
        assert all(torch.all(g == 0) for g in got)


@needs_cpu_ops
@poisoned
def test_lstm_layer_backward_expanded_output_gradient(target):
    # y.sum()'s gradient: stride 0 everywhere; the op reads rows of P.
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(4, 5, 3, 4, torch.float64, seed=9, lengths=[5, 1, 0, 3])
    y, h, c, saved = target.op("lstm_layer_forward")(
        on(target, xg), lengths, on(target, w_hh), on(target, w_proj), 1.0, 0.7, on(target, h0), on(target, c0)
    )
    ones = torch.ones(1, 1, 1, 1, dtype=torch.float64, device=target.device).expand(y.shape)
    got = target.op("lstm_layer_backward")(
        ones,
        None,
        None,
        saved,
        lengths,
        None,
        list(xg.shape),
        on(target, w_hh),
        on(target, w_proj),
        1.0,
        0.7,
        on(target, h0),
        on(target, c0),
    )
    padding = torch.arange(5)[None, :] >= lengths[:, None]
    weight = (~padding).double()[None, :, :, None].expand(y.shape)  # the reference's y is 0 at padding anyway
    want = ref_grads(
        lambda x, a, b, s, t: lstm_layer_pair_ref(x.nan_to_num(), lengths, a, b, 1.0, 0.7, s, t),
        [xg, w_hh, w_proj, h0, c0],
        [weight],
    )
    for name, g, w in zip(["xg", "w_hh", "w_proj", "h0", "c0"], got, want):
        assert_grad_close(g, w, what=f"{target.name} expanded grad_y: {name}")


@needs_cpu_ops
@poisoned
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


@needs_cpu_ops
@poisoned
def test_lstm_layer_lengths_and_token_index_on_the_device(target):
    case = layer_case(7, 9, 5, 6, torch.float32, seed=23)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, "repeated", seed=24)
    run_layer(target, (xg, lengths, w_hh, w_proj, h0, c0), 1.5, 1.0, token_index=index, host_plan=False)


@needs_cpu_ops
@poisoned
def test_lstm_layer_is_deterministic(target):
    # Rows read by many positions accumulate in a fixed order (index_put_ with accumulate).
    case = layer_case(16, 12, 8, 16, torch.float32, seed=25)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, "repeated", seed=26)
    args = [on(target, t) for t in (xg, lengths, w_hh, w_proj)]
    outs = [target.op("lstm_layer_forward")(*args, 1.0, 1.0, on(target, h0), on(target, c0), index) for _ in range(2)]
    grad_y = torch.randn(outs[0][0].shape, generator=torch.Generator().manual_seed(0)).to(target.device)
    grads = [
        target.op("lstm_layer_backward")(
            grad_y,
            None,
            None,
            o[3],
            lengths,
            index,
            list(xg.shape),
            args[2],
            args[3],
            1.0,
            1.0,
            on(target, h0),
            on(target, c0),
        )
        for o in outs
    ]
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@needs_cpu_ops
@poisoned
@emulated_by_default()
def test_lstm_layer_errors_are_the_cpu_ops(target):
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(3, 4, 3, 5, torch.float32, seed=0, lengths=[4, 1, 2])
    op = target.op("lstm_layer_forward")
    d = lambda t: on(target, t)
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
    with pytest.raises(
        RuntimeError,
        match=r"lstm_layer_forward: token_index\[1, 0\] = 4 is out of range for xg "
        r"with 4 rows",
    ):
        op(d(xg[:, 0]), lengths, d(w_hh), d(w_proj), None, None, None, None, torch.arange(12).view(3, 4) % 5)
    y, h, c, saved = op(d(xg.nan_to_num()), lengths, d(w_hh), d(w_proj), None, None, None, None)
    with pytest.raises(
        RuntimeError,
        match=r"lstm_layer_backward: saved must be lstm_layer_forward's contiguous "
        r"\[2, N, 6C \+ P\] = \[2, 7, 33\]",
    ):
        target.op("lstm_layer_backward")(
            None, None, None, saved[:, 1:], lengths, None, list(xg.shape), d(w_hh), d(w_proj), None, None, None, None
        )


# --- bilstm_train on the target's kernels ---------------------------------------------------------


@needs_cpu_ops
@poisoned
def test_bilstm_train_with_dropout_on_the_target(target, ops_on):
    """bilstm_train's masks and skip connections on the target's kernels against bilstm_train_ref."""
    x, lengths, weights, h0, c0, masks = stack_case(5, 7, 2, 4, 6, torch.float64, seed=4, lengths=[7, 0, 3, 1, 6])
    dev = ops_on
    fast_in = [t.to(dev).requires_grad_() for t in (x, h0, c0, *weights)]
    ref_in = [t.clone().requires_grad_() for t in (x, h0, c0, *weights)]
    ref = reference.bilstm_train_ref(ref_in[0], lengths, ref_in[3:], 3.0, 3.0, ref_in[1], ref_in[2], 0.1, True, masks)
    gen = torch.Generator().manual_seed(5)
    proj = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref]
    with ran_ops(target) as ran:
        fast = ops.bilstm_train(
            fast_in[0],
            lengths.to(dev),
            fast_in[3:],
            3.0,
            3.0,
            fast_in[1],
            fast_in[2],
            0.1,
            True,
            [m.to(dev) for m in masks],
        )
        got = torch.autograd.grad(sum((o * p.to(o)).sum() for o, p in zip(fast, proj)), fast_in)
    assert {"lstm_layer_forward", "lstm_layer_backward"} <= ran, ran
    for a, b in zip(fast, ref):
        assert_close(a, b, what=f"{target.name} bilstm_train outputs")
    want = torch.autograd.grad(sum((o * p).sum() for o, p in zip(ref, proj)), ref_in)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_grad_close(g, w, what=f"{target.name} bilstm_train gradient {i}")
