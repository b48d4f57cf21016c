"""The LSTM room on the CPU: the fused inference biLSTM (elmo_fast.bilm.ops.bilstm) against its oracle,
elmo_fast.bilm.reference.bilstm_ref; one trainable layer (ops.lstm_layer: lstm_layer_forward and
lstm_layer_backward) against lstm_layer_pair_ref and its autograd; the training stack (ops.bilstm_train)
against bilstm_train_ref; and the reference's own gradients. The CUDA kernels' tests: test_lstm_cuda.py."""

import itertools

import cli_process
import pytest
import torch
from bilm_cases import MINI
from cpu_features import needs_packed_bf16, packed_dtypes
from grad_checks import check_grads, leaves, poisoned
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lstm_cases import GRADCHECK_CASES, differentiable, indexed_case, layer_case, stack_case
from tolerances import assert_close, assert_grad_close, max_abs_error

from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import (
    bilstm_ref,
    bilstm_train_ref,
    flat_lstm_weights,
    layer0_gates_ref,
    lstm_layer_pair_ref,
)

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)

CLIP = 3.0


def lengths_for(B, T, pattern, gen):
    """[B] lengths in [0, T], deliberately unsorted."""
    if pattern == "random":  # ties and zeros likely for small T
        return torch.randint(0, T + 1, (B,), generator=gen)
    if pattern == "full":
        return torch.full((B,), T)
    if pattern == "one_long":  # one long row among many of length 1 (and a 0 when B allows)
        lengths = torch.ones(B, dtype=torch.long)
        lengths[B // 2] = T
        if B > 3:
            lengths[-1] = 0
        return lengths
    raise ValueError(pattern)


def lstm_case(B, T, L, P, C, dtype, seed, *, lengths="random", state=True, U=None, xg0_layout="contiguous"):
    """Fresh random inputs of bilstm: (xg0, token_index, lengths, weights, h0, c0).

    Scaled so that the cell clip and the projection clip (at CLIP) are hit: forget gates lean open
    (+1.5) so cells integrate up to the clip, projections are 3x larger than unit gain; the
    recurrent weights stay small so the recurrence is contractive and fp32 rounding cannot grow.
    token_index repeats xg0's rows (U < B * T) and holds out-of-range junk past each row's length,
    which the op must never read.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    weights = []
    for _ in range(L):
        for _ in range(2):
            bias = randn(4 * C, std=0.1)
            bias[C : 2 * C] += 1.5
            weights += [
                randn(4 * C, P, std=P**-0.5),
                randn(4 * C, P, std=0.35 * P**-0.5),
                bias,
                randn(P, C, std=3.0 * C**-0.5),
            ]
    if U is None:
        U = max(1, (B * T) // 2)
    xg0 = randn(U, 2, 4 * C, std=2.0)
    xg0[:, :, C : 2 * C] += 1.5
    lengths = lengths_for(B, T, lengths, gen) if isinstance(lengths, str) else torch.as_tensor(lengths)
    token_index = torch.randint(0, max(U, 1), (B, T), generator=gen)
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    token_index[padding] = torch.tensor([-5, U, U + 1000])[torch.randint(0, 3, (int(padding.sum()),), generator=gen)]
    h0 = randn(L, B, 2 * P, std=1.5).to(dtype) if state else None
    c0 = randn(L, B, 2 * C, std=2.0).to(dtype) if state else None
    xg0 = xg0.to(dtype)
    if xg0_layout == "sliced":  # rows of a wider buffer: strides (3 * (4C + 7), 4C + 7, 1)
        buf = torch.randn(U, 3, 4 * C + 7, generator=gen, dtype=torch.float64).to(dtype)
        buf[:, 1:, 3 : 3 + 4 * C] = xg0
        xg0 = buf[:, 1:, 3 : 3 + 4 * C]
    elif xg0_layout == "feature_major":  # last dim not unit-stride: the op copies it once
        xg0 = xg0.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    elif xg0_layout != "contiguous":
        raise ValueError(xg0_layout)
    return xg0, token_index, lengths, [w.to(dtype) for w in weights], h0, c0


def reference(xg0, token_index, lengths, weights, cell_clip, proj_clip, h0, c0):
    """bilstm_ref in float64 on the same (already rounded) inputs."""
    d = lambda t: None if t is None else t.double()  # noqa: E731
    return bilstm_ref(d(xg0), token_index, lengths, [d(w) for w in weights], cell_clip, proj_clip, d(h0), d(c0))


def check_bilstm(case, cell_clip, proj_clip, what):
    xg0, token_index, lengths, weights, h0, c0 = case
    out, h, c = ops.bilstm(xg0, token_index, lengths, weights, cell_clip, proj_clip, h0, c0)
    L, B, T = len(weights) // 8, token_index.shape[0], token_index.shape[1]
    P, C = weights[3].shape
    assert out.shape == (L, B, T, 2 * P) and h.shape == (L, B, 2 * P) and c.shape == (L, B, 2 * C), what
    assert out.dtype == h.dtype == c.dtype == xg0.dtype, what
    want_out, want_h, want_c = reference(*case[:4], cell_clip, proj_clip, h0, c0)
    assert_close(out, want_out, what=f"{what} outputs")
    assert_close(h, want_h, what=f"{what} h")
    assert_close(c, want_c, what=f"{what} c")
    padding = torch.arange(T)[None, :] >= lengths[:, None]  # [B, T]
    assert torch.all(out[:, padding] == 0), f"{what}: padding must be exactly 0"
    return (out, h, c), (want_out, want_h, want_c)


SHAPES = list(itertools.product([0, 1, 2, 5], [1, 2, 7, 19], [1, 2, 3]))


@needs_extension
@pytest.mark.parametrize("variant", ["clips+state", "noclip+zeros"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("B,T,L", SHAPES)
def test_bilstm_matches_reference(B, T, L, dtype, variant):
    P, C = [(3, 5), (16, 64)][(B + T + L) % 2]
    clip = CLIP if variant == "clips+state" else None
    seed = 1000 * B + 10 * T + L
    case = lstm_case(B, T, L, P, C, dtype, seed, state=variant == "clips+state")
    check_bilstm(case, clip, clip, f"bilstm B={B} T={T} L={L} P={P} C={C} {dtype} {variant}")


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("pattern", ["one_long", "full", "random"])
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "feature_major"])
def test_bilstm_lengths_and_layouts(pattern, layout, dtype):
    B, T, L, P, C = 9, 19, 2, 16, 64
    case = lstm_case(B, T, L, P, C, dtype, seed=7, lengths=pattern, xg0_layout=layout)
    if layout != "contiguous":
        assert not case[0].is_contiguous()
    (_, _, c), (want_out, _, want_c) = check_bilstm(case, CLIP, CLIP, f"bilstm {pattern} {layout} {dtype}")
    # the data really exercise both clips (the reference's own states sit at +-CLIP)
    assert bool((want_c.abs() == CLIP).any()), "the cell clip was not reached"
    assert bool((want_out[0].abs() == CLIP).any()), "the projection clip was not reached"


@needs_extension
@pytest.mark.slow
def test_bilstm_clips_are_applied_and_zero_means_none():
    case = lstm_case(5, 19, 2, 16, 64, torch.float32, seed=3, lengths=[19, 4, 19, 0, 11])
    (out, _, c), (want_out, _, want_c) = check_bilstm(case, CLIP, CLIP, "bilstm clips 3.0")
    assert bool((want_c.abs() == CLIP).any()) and bool((want_out[0].abs() == CLIP).any())
    ran = case[2] > 0  # a row of length 0 returns its initial c, which is not clipped
    assert float(c[:, ran].abs().max()) <= CLIP and float(out[0].abs().max()) <= CLIP
    unclipped, _, unclipped_c = ops.bilstm(*case[:4], None, None, *case[4:])
    assert float(unclipped_c[:, ran].abs().max()) > CLIP and float(unclipped[0].abs().max()) > CLIP
    zero, _, _ = ops.bilstm(*case[:4], 0.0, 0.0, *case[4:])  # as the reference: 0 means no clip
    assert torch.equal(zero, unclipped)
    check_bilstm(case, CLIP, None, "bilstm cell clip only")
    check_bilstm(case, None, CLIP, "bilstm projection clip only")


@needs_extension
def test_bilstm_rows_of_length_zero_keep_their_state():
    case = lstm_case(4, 5, 2, 3, 5, torch.float32, seed=4, lengths=[0, 5, 0, 2])
    (out, h, c), _ = check_bilstm(case, CLIP, CLIP, "bilstm zero-length rows")
    h0, c0 = case[4], case[5]
    for b in (0, 2):
        assert torch.equal(h[:, b], h0[:, b]) and torch.equal(c[:, b], c0[:, b])
        assert torch.all(out[:, b] == 0)
    everything_empty = lstm_case(3, 4, 2, 3, 5, torch.float32, seed=5, lengths=[0, 0, 0], U=0)
    out, h, c = ops.bilstm(*everything_empty[:4], CLIP, CLIP, *everything_empty[4:])
    assert torch.all(out == 0) and torch.equal(h, everything_empty[4]) and torch.equal(c, everything_empty[5])


@needs_extension
@pytest.mark.slow
def test_bilstm_realistic_small_preset_fp32():
    # ELMo 'small' shapes: long GEMM reductions (K = 1024 in the projection) at the 1e-5 bar.
    B, T, L, P, C = 16, 30, 2, 128, 1024
    gen = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[3] = T
    case = lstm_case(B, T, L, P, C, torch.float32, seed=12, lengths=lengths, U=B * T)
    (_, _, _), (want_out, _, want_c) = check_bilstm(case, CLIP, CLIP, "bilstm small preset")
    assert bool((want_c.abs() == CLIP).any()) and bool((want_out[0].abs() == CLIP).any())


@needs_extension
@pytest.mark.parametrize("schedule", ["directions", "sequential"])
@pytest.mark.parametrize("threads", [1, 2])
def test_bilstm_thread_schedules(schedule, threads, monkeypatch):
    # Both ways of sharing threads between the directions (ELMO_FAST_BILSTM_THREADS), any count.
    monkeypatch.setenv("ELMO_FAST_BILSTM_THREADS", schedule)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        case = lstm_case(6, 13, 2, 16, 64, torch.float32, seed=21)
        check_bilstm(case, CLIP, CLIP, f"bilstm {schedule} {threads} threads")
    finally:
        torch.set_num_threads(before)


@needs_extension
@pytest.mark.parametrize("gemv_rows", ["0", "1000"])
@pytest.mark.parametrize("P,C", [(3, 5), (16, 64), (37, 50)])
@pytest.mark.slow
def test_bilstm_gemm_paths(P, C, gemv_rows, monkeypatch):
    # Steps with few active rows use the op's own GEMV, the others BLAS (float32): force each one
    # for every step (ELMO_FAST_BILSTM_GEMV_ROWS), on sizes that leave remainders everywhere.
    monkeypatch.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", gemv_rows)
    case = lstm_case(11, 13, 2, P, C, torch.float32, seed=P + C)
    check_bilstm(case, CLIP, CLIP, f"bilstm P={P} C={C} gemv rows <= {gemv_rows}")


@needs_extension
@pytest.mark.parametrize("capability", ["default", "avx2"])
@pytest.mark.slow
def test_bilstm_other_isa_levels(capability):
    # The float kernels exist per ISA level, picked once per process from ATen's CPU capability:
    # run the lower levels in a fresh process (ATEN_CPU_CAPABILITY caps the level).
    import os
    import sys
    from pathlib import Path

    script = (
        "import torch, test_lstm as t\n"
        "assert torch.backends.cpu.get_cpu_capability() == {want!r}, torch.backends.cpu.get_cpu_capability()\n"
        "t.check_bilstm(t.lstm_case(11, 13, 2, 37, 50, torch.float32, seed=3), 3.0, 3.0, 'bilstm')\n"
        "t.test_bilstm_nonlinearities_accurate_across_scales()\n"
        "t.check_bf16(t.bf16_case(5, 7, 1, 16, 64, seed=4), 'bilstm bf16')\n"
    ).format(want="DEFAULT" if capability == "default" else capability.upper())
    here = Path(__file__).resolve().parent
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, PYTHONPATH=os.pathsep.join([str(here), *sys.path]))
    done = cli_process.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@needs_extension
@pytest.mark.slow
def test_bilstm_inference_mode_and_parameters():
    # The directions run on two threads: the second must see the caller's inference mode, or
    # writing to the workspace (inference tensors) fails. Weights that require grad work too.
    case = lstm_case(4, 7, 2, 16, 64, torch.float32, seed=31)
    weights = [w.clone().requires_grad_() for w in case[3]]
    with torch.inference_mode():
        out, _, _ = ops.bilstm(case[0], case[1], case[2], weights, CLIP, CLIP, case[4], case[5])
    with torch.no_grad():
        again, _, _ = ops.bilstm(case[0], case[1], case[2], weights, CLIP, CLIP, case[4], case[5])
    want = reference(*case[:4], CLIP, CLIP, case[4], case[5])[0]
    assert_close(out, want, what="bilstm inference mode")
    assert_close(again, want, what="bilstm no_grad")


@needs_extension
def test_bilstm_nonlinearities_accurate_across_scales():
    # One step, W_proj = I, saturated input/output gates: c = tanh(x) and h = tanh(tanh(x)) for x
    # over 10 decades and both signs, so the kernel's polynomial tanh shows its relative error
    # (no cancellation near 0); the sigmoid is exercised through i = x with g saturated.
    x = torch.cat([torch.logspace(-8, 1.7, 200, dtype=torch.float64)] * 2) * torch.tensor(
        [1.0, -1.0]
    ).repeat_interleave(200)
    x = torch.cat([x, torch.tensor([0.0, 0.624, 0.625, 0.626, -0.625, 44.0, 90.0, -90.0], dtype=torch.float64)])
    C = P = x.numel()
    big = torch.full_like(x, 30.0)
    weights = [torch.zeros(4 * C, P), torch.zeros(4 * C, P), torch.zeros(4 * C), torch.eye(P)] * 2
    token_index, lengths = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    for gates in (
        torch.cat([big, torch.zeros_like(x), x, big]),  # c = tanh(x)
        torch.cat([x, torch.zeros_like(x), big, big]),
    ):  # c = sigmoid(x)
        xg0 = gates.float().expand(1, 2, 4 * C)
        out, h, c = ops.bilstm(xg0, token_index, lengths, weights, None, None)
        want_out, want_h, want_c = reference(xg0, token_index, lengths, weights, None, None, None, None)
        for got, want in ((c, want_c), (h, want_h)):
            err = (got.double() - want).abs()
            assert bool((err <= 1e-6 * want.abs() + 1e-30).all()), f"max relative error {(err / want.abs()).max():.2e}"


@needs_extension
@pytest.mark.parametrize(
    "B,T,L,P,C,state,clip,dtype",
    [
        (0, 3, 1, 3, 5, False, None, torch.float32),
        (1, 1, 1, 3, 5, True, CLIP, torch.float32),
        (5, 7, 2, 3, 5, True, CLIP, torch.float32),
        (3, 4, 2, 16, 64, False, None, torch.float64),
    ],
)
def test_bilstm_opcheck(B, T, L, P, C, state, clip, dtype):
    xg0, token_index, lengths, weights, h0, c0 = lstm_case(B, T, L, P, C, dtype, seed=B + T, state=state)
    torch.library.opcheck(torch.ops.elmo_fast.bilstm.default, (xg0, token_index, lengths, weights, clip, clip, h0, c0))


@needs_extension
@pytest.mark.slow
def test_bilstm_opcheck_bf16_weights():
    xg0, token_index, lengths, weights, h0, c0 = bf16_case(5, 7, 2, 16, 64, seed=8)
    torch.library.opcheck(torch.ops.elmo_fast.bilstm.default, (xg0, token_index, lengths, weights, CLIP, CLIP, h0, c0))


@needs_extension
@needs_packed_bf16
@pytest.mark.slow
def test_bilstm_opcheck_packed_bf16_weights():
    xg0, token_index, lengths, weights, h0, c0 = bf16_case(5, 7, 2, 16, 64, seed=8)
    packed_weights = [w if k % 4 == 2 else ops.pack_weight(w) for k, w in enumerate(weights)]
    torch.library.opcheck(
        torch.ops.elmo_fast.bilstm.default, (xg0, token_index, lengths, packed_weights, CLIP, CLIP, h0, c0, [0, 0, 1])
    )
    torch.library.opcheck(torch.ops.elmo_fast.pack_weight.default, (weights[1],))


# --- bfloat16 weights: GEMMs in bf16 with fp32 accumulation; states, gates and outputs in fp32 -----


def bf16_case(B, T, L, P, C, seed, bias_dtype=torch.bfloat16, **kw):
    """lstm_case in float32 with the GEMM weights rounded to bfloat16 (biases in bias_dtype)."""
    xg0, token_index, lengths, weights, h0, c0 = lstm_case(B, T, L, P, C, torch.float32, seed, **kw)
    weights = [w.to(bias_dtype if k % 4 == 2 else torch.bfloat16) for k, w in enumerate(weights)]
    return xg0, token_index, lengths, weights, h0, c0


def check_bf16(case, what):
    """The op with bf16 weights against the oracle on the same weights widened: the bf16 row of TOL."""
    xg0, token_index, lengths, weights, h0, c0 = case
    got = ops.bilstm(xg0, token_index, lengths, weights, CLIP, CLIP, h0, c0)
    assert all(t.dtype == torch.float32 for t in got), what
    want = reference(xg0, token_index, lengths, [w.float() for w in weights], CLIP, CLIP, h0, c0)
    for name, g, w in zip(("outputs", "h", "c"), got, want):
        assert_close(g, w, dtype=torch.bfloat16, what=f"{what} {name}")
    padding = torch.arange(token_index.shape[1])[None, :] >= lengths[:, None]
    assert torch.all(got[0][:, padding] == 0), f"{what}: padding must be exactly 0"
    return got, want


# Error budget of bf16 weights. Every GEMM input is rounded to bf16 and, on the oneDNN path, every
# GEMM result too; one layer stays within the bf16 row of TOL. A stack does not: each layer's output
# adds the previous ones' (skip connections), so their errors add up. Measured max abs error of the
# layer-l output with activations at the +-3 clips ('small' shapes, all steps through oneDNN):
# ~1.3e-2, 2.0e-2 (up to 2.4e-2), 3.2e-2 for l = 0, 1, 2, about half of what PyTorch's own bf16
# gives (2.4e-2, 4.4e-2, 7.6e-2). Stacks are held to that relative bound.
@needs_extension
@pytest.mark.parametrize("gemv_rows", ["0", "8", "1000"])  # oneDNN for every step / the default / GEMV
@pytest.mark.parametrize("B,T,P,C", [(1, 1, 3, 5), (5, 7, 3, 5), (11, 13, 16, 64), (2, 19, 37, 50)])
def test_bilstm_bf16_weights_one_layer(B, T, P, C, gemv_rows, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", gemv_rows)
    check_bf16(bf16_case(B, T, 1, P, C, seed=B + T), f"bilstm bf16 B={B} T={T} gemv rows <= {gemv_rows}")


@needs_extension
@pytest.mark.parametrize("misaligned", [False, True])
@pytest.mark.parametrize("P,C", [(16, 64), (19, 46), (22, 45)])
@pytest.mark.parametrize("B", [1, 2, 7])
def test_bilstm_bf16_gemv_is_fp32_accurate(B, P, C, misaligned, monkeypatch):
    # Steps through gemv_nt keep the activations in fp32 (only the weights are bf16): with one layer
    # (no bf16 input GEMM) the result meets the float32 bar against the same widened weights. Even K
    # with 4-byte aligned weights takes the word-pair kernel, odd K (P = 19: W_hh; C = 45: W_proj) or
    # weights 2 bytes off a word (misaligned) the per-element one; P = 19, 22 leave a tail of rows
    # of W_proj after the blocks of 4, and B = 7 a tail of rows of a after one 4-row block.
    if B > 2:  # the default sends only B <= 2 through gemv_nt
        monkeypatch.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", "1000")
    xg0, token_index, lengths, weights, h0, c0 = bf16_case(B, 19, 1, P, C, seed=5 + B + P, bias_dtype=torch.float32)
    if misaligned:

        def shifted(w):
            if w.dtype != torch.bfloat16:
                return w
            view = torch.empty(w.numel() + 1, dtype=w.dtype)[1:].view(w.shape)
            return view.copy_(w)

        weights = [shifted(w) for w in weights]
        assert all(w.data_ptr() % 4 == 2 for w in weights if w.dtype == torch.bfloat16)
    got = ops.bilstm(xg0, token_index, lengths, weights, CLIP, CLIP, h0, c0)
    want = reference(xg0, token_index, lengths, [w.float() for w in weights], CLIP, CLIP, h0, c0)
    for g, w in zip(got, want):
        assert_close(g, w, dtype=torch.float32, what="bilstm bf16 weights through gemv_nt")


@needs_extension
@pytest.mark.parametrize("gemv_rows", ["0", "8"])  # oneDNN for every step / the default
@pytest.mark.parametrize("B,T,L,P,C", [(16, 30, 2, 128, 1024), (11, 13, 2, 16, 64), (11, 13, 3, 16, 64)])
@pytest.mark.slow
def test_bilstm_bf16_stack_no_worse_than_pytorch_bf16(B, T, L, P, C, gemv_rows, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", gemv_rows)
    lengths = torch.randint(1, T + 1, (B,), generator=torch.Generator().manual_seed(B + L))
    xg0, token_index, lengths, weights, h0, c0 = bf16_case(B, T, L, P, C, seed=14, lengths=lengths, U=B * T)
    got = ops.bilstm(xg0, token_index, lengths, weights, CLIP, CLIP, h0, c0)
    want = reference(xg0, token_index, lengths, [w.float() for w in weights], CLIP, CLIP, h0, c0)
    torch_bf16 = bilstm_ref(xg0.bfloat16(), token_index, lengths, weights, CLIP, CLIP, h0.bfloat16(), c0.bfloat16())
    for name, g, t, w in zip(("outputs", "h", "c"), got, torch_bf16, want):
        assert max_abs_error(g, w) <= max_abs_error(t, w), f"bilstm bf16 L={L} {name}"
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    assert torch.all(got[0][:, padding] == 0)


# --- bfloat16 weights packed (ops.pack_weight) for oneDNN's BRGeMM micro-kernel: float results ---------


def packed(weights):
    """bf16_case's weights with every GEMM weight the op reads packed (layer 0's w_ih too: it is not read)."""
    return [w if k % 4 == 2 else ops.pack_weight(w) for k, w in enumerate(weights)]


@needs_extension
@pytest.mark.parametrize("dtype", packed_dtypes())
def test_pack_weight_layout(dtype):
    # packed[j, k // g, c, k % g] = w[j * nb + c, k], nb the widest of 64, 32, 16 dividing N, g = 2 in bf16
    g = 2 if dtype == torch.bfloat16 else 1
    for N, K, nb in [(16, 2, 16), (48, 6, 16), (96, 10, 32), (128, 4, 64)]:
        w = torch.randn(N, K, generator=torch.Generator().manual_seed(N + K)).to(dtype)
        p = ops.pack_weight(w)
        assert p.shape == (N // nb, K // g, nb, g) and p.dtype == dtype and p.is_contiguous()
        for j, k, c in [(0, 0, 0), (N // nb - 1, K - 1, nb - 1), (N // nb // 2, K // 2, nb // 2)]:
            assert p[j, k // g, c, k % g] == w[j * nb + c, k]
    assert ops.pack_weight(torch.randn(32, 5)).shape == (1, 5, 32, 1)  # odd K: float32 only


@needs_extension
@pytest.mark.parametrize(
    "shape,dtype,match",
    [
        (
            (24, 4),
            torch.float32,
            r"pack_weight: weight \[N, K\] must have N a multiple of 16 to be packed, got \[24, 4\]",
        ),
        (
            (32, 5),
            torch.bfloat16,
            r"pack_weight: weight \[N, K\] must have N a multiple of 16 and K even to be packed, "
            r"got \[32, 5\]",
        ),
        ((32,), torch.float32, r"pack_weight: weight must have 2 dims \[N, K\], got 1"),
        ((32, 4), torch.float64, "pack_weight: weight has dtype float64; supported: float32, bfloat16"),
    ],
)
def test_pack_weight_refuses_in_one_line(shape, dtype, match):
    with pytest.raises(RuntimeError, match=match):
        ops.pack_weight(torch.randn(*shape).to(dtype))


@needs_extension
@pytest.mark.parametrize("tuning", [None, [0, 0, 1]])
@pytest.mark.parametrize("B,T,L,P,C", [(1, 1, 1, 16, 4), (37, 9, 2, 16, 64), (3, 19, 3, 32, 12)])
def test_bilstm_packed_float32_weights(B, T, L, P, C, tuning):
    # float32 packed weights: every GEMM through the micro-kernel, the float32 bar against the oracle
    xg0, token_index, lengths, weights, h0, c0 = lstm_case(B, T, L, P, C, torch.float32, seed=B + C)
    got = ops.bilstm(xg0, token_index, lengths, packed(weights), CLIP, CLIP, h0, c0, tuning)
    want = reference(xg0, token_index, lengths, weights, CLIP, CLIP, h0, c0)
    for name, g, w in zip(("outputs", "h", "c"), got, want):
        assert_close(g, w, dtype=torch.float32, what=f"bilstm packed float32 B={B} L={L} {name}")


# Shapes that packing takes (4C and P multiples of 16, P and C even): P = 48 and C = 20 leave column
# blocks of 16; B = 37 a tail of rows after a block of 32, T = 1 a single step.
@needs_extension
@pytest.mark.parametrize("tuning", [None, [0, 0, 0], [0, 0, 1], [-1, -1, -1]])
@pytest.mark.parametrize("B,T,L,P,C", [(1, 1, 1, 16, 4), (5, 7, 1, 48, 20), (37, 9, 2, 16, 64), (3, 19, 3, 32, 8)])
@pytest.mark.slow
@needs_packed_bf16
def test_bilstm_packed_weights(B, T, L, P, C, tuning):
    xg0, token_index, lengths, weights, h0, c0 = bf16_case(B, T, L, P, C, seed=3 * B + T, bias_dtype=torch.float32)
    got = ops.bilstm(xg0, token_index, lengths, packed(weights), CLIP, CLIP, h0, c0, tuning)
    assert all(t.dtype == torch.float32 for t in got)
    want = reference(xg0, token_index, lengths, [w.float() for w in weights], CLIP, CLIP, h0, c0)
    torch_bf16 = bilstm_ref(
        xg0.bfloat16(), token_index, lengths, [w.bfloat16() for w in weights], CLIP, CLIP, h0.bfloat16(), c0.bfloat16()
    )
    what = f"bilstm packed B={B} T={T} L={L} tuning={tuning}"
    for name, g, w, t in zip(("outputs", "h", "c"), got, want, torch_bf16):
        if L == 1:  # one layer: bf16 GEMM inputs, float results: the bf16 row of TOL
            assert_close(g, w, dtype=torch.bfloat16, what=f"{what} {name}")
        # a stack: no worse than torch's own bf16
        assert max_abs_error(g, w) <= max(max_abs_error(t, w), 1e-3), f"{what} {name}"
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    assert torch.all(got[0][:, padding] == 0), f"{what}: padding must be exactly 0"
    # the schedule changes nothing but the order of float sums
    other_schedule = [0, 0, 1 - (tuning or [0, 0, 0])[2] % 2]
    other = ops.bilstm(xg0, token_index, lengths, packed(weights), CLIP, CLIP, h0, c0, other_schedule)
    for g, o in zip(got, other):
        assert_close(g, o, dtype=torch.float32, what=f"{what}, other schedule")


@needs_extension
@needs_packed_bf16
def test_bilstm_packed_weights_refused_where_they_cannot_be_used():
    xg0, token_index, lengths, weights, h0, c0 = bf16_case(3, 4, 2, 16, 8, seed=1, bias_dtype=torch.float32)
    p = packed(weights)
    some = weights[:9] + [p[9]] + weights[10:]
    with pytest.raises(
        RuntimeError,
        match=r"bilstm: the GEMM weights \(w_hh, w_proj, and w_ih of layers >= 1\) "
        r"must be all packed or none, got 1 of 10 packed",
    ):
        ops.bilstm(xg0, token_index, lengths, some, CLIP, CLIP, h0, c0)
    w32 = [w.float() for w in weights]
    with pytest.raises(
        RuntimeError,
        match=r"bilstm: weights\[3\] \(w_proj of layer 0, forward\) must have the dtype "
        r"of the other weights \(bfloat16\), got float32",
    ):
        ops.bilstm(xg0, token_index, lengths, w32[:1] + [p[1]] + w32[2:], CLIP, CLIP, h0, c0)
    wrong = list(p)
    wrong[13] = ops.pack_weight(torch.randn(48, 16))  # w_hh must be [4C, P] = [32, 16]
    with pytest.raises(
        RuntimeError,
        match=r"bilstm: weights\[13\] \(w_hh of layer 1, backward\) expected shape "
        r"\[32, 16\] \(packed\), got \[48, 16\]",
    ):
        ops.bilstm(xg0, token_index, lengths, wrong, CLIP, CLIP, h0, c0)


@needs_extension
@pytest.mark.parametrize(
    "tuning,match",
    [
        (
            [1, 2],
            r"bilstm: tuning must hold 3 values \[gemv_rows_in_turn, gemv_rows_concurrent, concurrent_min_rows\] "
            r"or be None, got 2 values",
        ),
        ([0, -2, 0], r"bilstm: tuning values must be >= 0, or -1 for the default, got \[0, -2, 0\]"),
    ],
)
def test_bilstm_tuning_checked_in_one_line(tuning, match):
    xg0, token_index, lengths, weights, h0, c0 = lstm_case(3, 4, 1, 3, 5, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match=match):
        ops.bilstm(xg0, token_index, lengths, weights, CLIP, CLIP, h0, c0, tuning)


@needs_extension
@pytest.mark.parametrize("B", [1, 9, 40])
def test_bilstm_tuning_is_the_environments_choice(B, monkeypatch):
    # tuning [gemv rows, gemv rows, concurrent from] computes what the environment's forcing computes,
    # bit for bit: the same kernels; -1 is the default, as no tuning.
    case = lstm_case(B, 6, 2, 16, 64, torch.float32, seed=B)
    for rows, mode, conc in [
        ("0", "sequential", 0),
        ("1000", "sequential", 0),
        ("1000", "directions", 1),
        ("0", "directions", 1),
    ]:
        tuned = ops.bilstm(*case[:4], CLIP, CLIP, *case[4:], [int(rows), int(rows), conc])
        with monkeypatch.context() as m:
            m.setenv("ELMO_FAST_BILSTM_GEMV_ROWS", rows)
            m.setenv("ELMO_FAST_BILSTM_THREADS", mode)
            forced = ops.bilstm(*case[:4], CLIP, CLIP, *case[4:])
        for a, b in zip(tuned, forced):
            assert torch.equal(a, b), (rows, mode)
    unset = ops.bilstm(*case[:4], CLIP, CLIP, *case[4:], [-1, -1, -1])
    for a, b in zip(unset, ops.bilstm(*case[:4], CLIP, CLIP, *case[4:])):
        assert torch.equal(a, b)


def _error_case():
    return lstm_case(3, 4, 2, 3, 5, torch.float32, seed=0)


def _with(case, **changes):
    names = ["xg0", "token_index", "lengths", "weights", "h0", "c0"]
    args = dict(zip(names, case))
    args.update(changes)
    return [args[n] for n in names]


@needs_extension
@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: dict(xg0=c[0][:, 0]), "bilstm: xg0 must have 3 dims, got 2"),
        (lambda c: dict(xg0=c[0][..., :-1]), r"bilstm: xg0 expected shape \[U, 2, 4C\] = \[\d+, 2, 20\]"),
        (lambda c: dict(token_index=c[1][0]), "bilstm: token_index must have 2 dims, got 1"),
        (lambda c: dict(lengths=c[2][None]), "bilstm: lengths must have 1 dims, got 2"),
        (lambda c: dict(lengths=c[2][:2]), r"bilstm: lengths expected shape \[3\], got \[2\]"),
        (lambda c: dict(lengths=c[2].int()), "bilstm: lengths must have dtype int64, got int32"),
        (lambda c: dict(token_index=c[1].int()), "bilstm: token_index must have dtype int64, got int32"),
        (lambda c: dict(lengths=torch.tensor([1, 5, 2])), r"bilstm: lengths\[1\] = 5 is out of range \[0, T = 4\]"),
        (lambda c: dict(lengths=torch.tensor([1, -1, 2])), r"bilstm: lengths\[1\] = -1 is out of range"),
        (
            lambda c: dict(lengths=torch.tensor([4, 4, 4]), token_index=torch.full((3, 4), 99)),
            r"bilstm: token_index\[0, 0\] = 99 is out of range for xg0 with \d+ rows",
        ),
        (lambda c: dict(weights=c[3][:7]), "bilstm: weights must hold 8 tensors per layer .* got 7"),
        (lambda c: dict(weights=[]), "bilstm: weights must hold 8 tensors per layer .* got 0"),
        (
            lambda c: dict(weights=c[3][:5] + [c[3][5][:, :2]] + c[3][6:]),
            r"bilstm: weights\[5\] \(w_hh of layer 0, backward\) expected shape \[20, 3\], got \[20, 2\]",
        ),
        (
            lambda c: dict(weights=c[3][:8] + [c[3][8][:-1]] + c[3][9:]),
            r"bilstm: weights\[8\] \(w_ih of layer 1, forward\) expected shape \[20, 3\], got \[19, 3\]",
        ),
        (
            lambda c: dict(weights=c[3][:10] + [c[3][10][:4]] + c[3][11:]),
            r"bilstm: weights\[10\] \(bias of layer 1, forward\) expected shape \[20\], got \[4\]",
        ),
        (
            lambda c: dict(weights=c[3][:15] + [c[3][15].t()]),
            r"bilstm: weights\[15\] \(w_proj of layer 1, backward\) expected shape \[3, 5\], got \[5, 3\]",
        ),
        (
            lambda c: dict(weights=[w.double() for w in c[3]]),
            r"bilstm: weights\[1\] \(w_hh of layer 0, forward\) has dtype float64; with xg0 of dtype float32 the "
            r"weights must be float32 or bfloat16",
        ),
        (
            lambda c: dict(xg0=c[0].double(), h0=c[4].double(), c0=c[5].double(), weights=[w.bfloat16() for w in c[3]]),
            r"bilstm: weights\[1\] .* has dtype bfloat16; with xg0 of dtype float64 the weights must be float64$",
        ),
        (
            lambda c: dict(weights=c[3][:5] + [c[3][5].bfloat16()] + c[3][6:]),
            r"bilstm: weights\[5\] \(w_hh of layer 0, backward\) must have the dtype of the other weights \(float32\), "
            r"got bfloat16",
        ),
        (lambda c: dict(h0=c[4][:1]), r"bilstm: h0 expected shape \[2, 3, 6\], got \[1, 3, 6\]"),
        (lambda c: dict(c0=c[5][..., :-1]), r"bilstm: c0 expected shape \[2, 3, 10\], got \[2, 3, 9\]"),
        (lambda c: dict(h0=c[4].double()), "bilstm: h0 and xg0 must have the same dtype, got float64 and float32"),
        (
            lambda c: dict(xg0=c[0].half(), weights=[w.half() for w in c[3]]),
            "bilstm: xg0 has dtype float16; supported: float32, float64",
        ),
    ],
)
def test_bilstm_errors_name_the_argument(change, match):
    case = _error_case()
    with pytest.raises(RuntimeError, match=match):
        ops.bilstm(*_with(case, **change(case))[:4], CLIP, CLIP, *_with(case, **change(case))[4:])


@needs_extension
def test_bilstm_negative_clip_is_an_error():
    case = _error_case()
    with pytest.raises(RuntimeError, match="bilstm: cell_clip must be positive, 0 or None, got -1"):
        ops.bilstm(*case[:4], -1.0, CLIP, *case[4:])


# --- lstm_layer: one trainable layer, both directions, and its backward (tests/support/grad_checks.py) ---


def layer_fns(lengths, cell_clip, proj_clip, state):
    def fast(xg, w_hh, w_proj, *hc):
        return ops.lstm_layer(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, *(hc if state else (None, None)))

    def ref(xg, w_hh, w_proj, *hc):
        # the reference computes at padding too (and masks after): the junk there must be finite for it,
        # and nan_to_num's gradient is 0 there, as the op's
        return lstm_layer_pair_ref(
            xg.nan_to_num(), lengths, w_hh, w_proj, cell_clip, proj_clip, *(hc if state else (None, None))
        )

    return fast, ref


def clips_bind(case, cell_clip, proj_clip):
    """Whether the reference's unclipped cells and projections pass the clips somewhere."""
    xg, lengths, w_hh, w_proj, h0, c0 = [None if t is None else t.double() for t in case]
    y, _, c = lstm_layer_pair_ref(xg.nan_to_num(), lengths, w_hh, w_proj, None, None, h0, c0)
    padding = torch.arange(xg.shape[2])[None, :] >= lengths[:, None]
    return bool((c.abs() > cell_clip).any()) and bool((y[:, ~padding].abs() > proj_clip).any())


@needs_extension
@poisoned
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "feature_major"])
@pytest.mark.parametrize("B,T,P,C,lengths", GRADCHECK_CASES)
@pytest.mark.slow
def test_lstm_layer_gradcheck(B, T, P, C, lengths, layout):
    case = layer_case(B, T, P, C, torch.float64, seed=B * T + P, lengths=lengths, layout=layout, junk=1e30)
    if layout != "contiguous":
        assert not case[0].is_contiguous()
    fast, _ = layer_fns(case[1], 1.0, 0.7, state=True)
    if B == 5:
        assert clips_bind(case, 1.0, 0.7), "the clips should bind somewhere"
    assert torch.autograd.gradcheck(fast, leaves(differentiable(case)))


@needs_extension
@poisoned
@pytest.mark.slow
def test_lstm_layer_gradcheck_zero_state_no_clips():
    case = layer_case(4, 5, 3, 4, torch.float64, seed=2, lengths=[5, 2, 4, 0], state=False, junk=1e30)
    fast, _ = layer_fns(case[1], None, None, state=False)
    assert torch.autograd.gradcheck(fast, leaves(differentiable(case)))


@needs_extension
@poisoned
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("state", [True, False], ids=["state", "zeros"])
@pytest.mark.parametrize(
    "B,T,P,C", [(1, 1, 3, 5), (5, 7, 3, 5), pytest.param(9, 19, 16, 64, marks=pytest.mark.slow), (6, 13, 37, 50)]
)
def test_lstm_layer_grads_match_reference(B, T, P, C, state, dtype):
    case = layer_case(B, T, P, C, dtype, seed=100 * B + T, state=state)
    fast, ref = layer_fns(case[1], 3.0, 3.0, state)
    check_grads(fast, ref, differentiable(case), f"lstm_layer B={B} T={T} P={P} C={C} {dtype}")


@needs_extension
@poisoned
@pytest.mark.parametrize("layout", ["sliced", "feature_major"])
def test_lstm_layer_grads_non_contiguous(layout):
    case = layer_case(7, 11, 16, 24, torch.float32, seed=5, layout=layout)
    fast, ref = layer_fns(case[1], 3.0, 3.0, True)
    got, _ = check_grads(fast, ref, differentiable(case), f"lstm_layer {layout}")
    padding = torch.arange(11)[None, :] >= case[1][:, None]
    assert torch.all(got[0][:, padding] == 0), "grad_xg must be exactly 0 at padding"


@needs_extension
@poisoned
@pytest.mark.parametrize("poisoned", [True, False], ids=["poisoned", "huge_pages"])
@pytest.mark.slow
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


@needs_extension
@poisoned
@pytest.mark.parametrize("used", ["y", "h", "c", "h+c"])
def test_lstm_layer_grads_of_some_outputs(used):
    # Unused outputs reach the backward as None (no zero tensors are made).
    case = layer_case(5, 6, 4, 6, torch.float64, seed=3)
    fast, ref = layer_fns(case[1], 1.5, 1.0, True)
    pick = {"y": [0], "h": [1], "c": [2], "h+c": [1, 2]}[used]
    inputs = differentiable(case)

    def loss(fn, args):
        outs = fn(*args)
        return sum(
            (outs[i] * torch.linspace(-1, 1, outs[i].numel(), dtype=outs[i].dtype).view_as(outs[i])).sum() for i in pick
        )

    a, b = leaves(inputs), leaves(inputs)
    got = torch.autograd.grad(loss(fast, a), a, allow_unused=True)
    want = torch.autograd.grad(loss(ref, b), b, allow_unused=True)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_grad_close(g, torch.zeros_like(g) if w is None else w, what=f"lstm_layer {used} input {i}")


@needs_extension
@poisoned
@pytest.mark.parametrize("gemv_rows", ["0", "1000"])  # BLAS for every step / the op's GEMV for every step
@pytest.mark.parametrize("schedule,threads", [("directions", 2), ("sequential", 2), ("sequential", 1)])
@pytest.mark.slow
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


@needs_extension
@poisoned
@pytest.mark.slow
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


def indexed_fns(lengths, index, cell_clip, proj_clip):
    U_safe = lambda xg: index.clamp(0, max(xg.shape[1] - 1, 0))  # noqa: E731  (the reference reads padding)

    def fast(xg, w_hh, w_proj, h0, c0):
        return ops.lstm_layer(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0, token_index=index)

    def ref(xg, w_hh, w_proj, h0, c0):
        return lstm_layer_pair_ref(xg[:, U_safe(xg)], lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0)

    return fast, ref


@needs_extension
@poisoned
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


@needs_extension
@poisoned
@pytest.mark.slow
def test_lstm_layer_token_index_gradcheck():
    case = layer_case(5, 6, 3, 4, torch.float64, seed=23, lengths=[6, 0, 3, 1, 5], junk=1e30)
    xg, lengths, w_hh, w_proj, h0, c0, index = indexed_case(case, "repeated", seed=24)
    fast, _ = indexed_fns(lengths, index, 1.0, 0.7)
    assert torch.autograd.gradcheck(fast, leaves([xg, w_hh, w_proj, h0, c0]))


@needs_extension
@poisoned
def test_lstm_layer_dense_little_padding():
    # Dense xg with <= 25% padding: dW_hh comes from grad_xg's rows directly (no packed dgates).
    case = layer_case(8, 10, 6, 7, torch.float32, seed=25, lengths=[10, 9, 10, 8, 10, 10, 7, 10])
    fast, ref = layer_fns(case[1], 3.0, 3.0, True)
    check_grads(fast, ref, differentiable(case), "lstm_layer little padding")


@needs_extension
@poisoned
def test_lstm_layer_values_and_padding():
    case = layer_case(6, 9, 5, 7, torch.float32, seed=4, lengths=[9, 0, 4, 1, 9, 2])
    xg, lengths, w_hh, w_proj, h0, c0 = case
    y, h, c = ops.lstm_layer(xg, lengths, w_hh, w_proj, 3.0, 3.0, h0, c0)
    want = lstm_layer_pair_ref(
        *[t.double() for t in (xg.nan_to_num(), lengths, w_hh, w_proj)], 3.0, 3.0, h0.double(), c0.double()
    )
    for name, g, w in zip("yhc", (y, h, c), want):
        assert_close(g, w, what=f"lstm_layer {name}")
    padding = torch.arange(9)[None, :] >= lengths[:, None]
    assert torch.all(y[:, padding] == 0)
    assert torch.equal(h[:, 1], h0[:, 1]) and torch.equal(c[:, 1], c0[:, 1])  # length 0: initial state


# poisoned_allocations sets global state once for all examples
@needs_extension
@poisoned
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    B=st.integers(1, 6),
    T=st.integers(1, 9),
    P=st.integers(1, 11),
    C=st.integers(1, 13),
    seed=st.integers(0, 2**31 - 1),
    clips=st.sampled_from([(None, None), (1.0, 0.5), (0.0, 2.0)]),
)
def test_lstm_layer_random_shapes_float64(B, T, P, C, seed, clips):
    case = layer_case(B, T, P, C, torch.float64, seed=seed)
    fast, ref = layer_fns(case[1], *clips, True)
    check_grads(fast, ref, differentiable(case), f"lstm_layer B={B} T={T} P={P} C={C} clips={clips}", seed=seed)


@needs_extension
@poisoned
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
    with pytest.raises(
        RuntimeError,
        match=r"lstm_layer_forward: token_index\[1, 0\] = 4 is out of range for xg "
        r"with 4 rows",
    ):
        ops.lstm_layer(rows, lengths, w_hh, w_proj, None, None, token_index=torch.arange(12).view(3, 4) % 5)
    with pytest.raises(RuntimeError, match=r"lstm_layer_forward: xg with token_index expected shape \[2, U, 4C\]"):
        ops.lstm_layer(xg, lengths, w_hh, w_proj, None, None, token_index=torch.zeros(3, 4, dtype=torch.long))


@needs_extension
@poisoned
@pytest.mark.parametrize(
    "B,T,P,C,lengths,clip,state,dtype",
    [
        (0, 3, 3, 5, [], None, False, torch.float32),
        (1, 1, 3, 5, [1], 1.0, True, torch.float32),
        (5, 7, 3, 5, [7, 0, 3, 1, 5], 1.0, True, torch.float32),
        (3, 4, 16, 24, [2, 4, 3], None, False, torch.float64),
    ],
)
@pytest.mark.slow
def test_lstm_layer_opcheck(B, T, P, C, lengths, clip, state, dtype):
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(
        B, T, P, C, dtype, seed=B + T, lengths=lengths, state=state, junk=0.0
    )
    args = [xg, lengths, w_hh, w_proj, clip, clip, h0, c0]
    grad_args = [a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_forward.default, grad_args)
    y, h, c, saved = torch.ops.elmo_fast.lstm_layer_forward.default(
        *[a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    )
    torch.library.opcheck(
        torch.ops.elmo_fast.lstm_layer_backward.default,
        (
            torch.randn_like(y),
            torch.randn_like(h),
            None,
            saved,
            lengths,
            None,
            list(xg.shape),
            w_hh.detach(),
            w_proj.detach(),
            clip,
            clip,
            None if h0 is None else h0.detach(),
            None,
        ),
    )
    rows, *_, index = indexed_case((xg.detach(), lengths, w_hh, w_proj, h0, c0), "repeated", seed=B)
    if B:
        indexed = [rows.requires_grad_(), *grad_args[1:], index]
        torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_forward.default, indexed)


# --- bilstm_train: the training stack (dropout, skip connections) on lstm_layer -------------------


def stack_fns(lengths, masks, clip):
    def run(fn):
        def call(x, h0, c0, *w):
            return fn(x, lengths, list(w), clip, clip, h0, c0, 0.1, True, [m.to(x.dtype) for m in masks])

        return call

    return run(ops.bilstm_train), run(bilstm_train_ref)


@needs_extension
@poisoned
@pytest.mark.slow
def test_bilstm_train_gradcheck():
    x, lengths, weights, h0, c0, masks = stack_case(
        4, 5, 2, 3, 4, torch.float64, seed=1, lengths=[5, 0, 2, 3], dropout=0.3
    )
    fast, _ = stack_fns(lengths, masks, 1.0)
    assert torch.autograd.gradcheck(fast, leaves([x, h0, c0, *weights]))


@needs_extension
@poisoned
@pytest.mark.parametrize(
    "B,T,L,P,C,clip",
    [
        (7, 11, 2, 16, 64, 3.0),  # 'tiny' shapes
        (5, 9, 3, 3, 5, 1.0),  # three layers, odd sizes
        (16, 25, 2, 128, 1024, 3.0),  # 'small' shapes
    ],
)
@pytest.mark.slow
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


@needs_extension
@poisoned
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


@needs_extension
@poisoned
@pytest.mark.slow
def test_bilstm_train_without_dropout_is_bilstm():
    # training=False (or no dropout): the inference op's stack, layer 0's gates from the same x.
    x, lengths, weights, h0, c0, masks = stack_case(9, 13, 2, 16, 64, torch.float32, seed=4)
    B, T, P = x.shape
    for kwargs in (dict(dropout=0.1, training=False, masks=masks), dict(dropout=0.0)):
        got = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, **kwargs)
        want = ops.bilstm(
            layer0_gates_ref(x.view(B * T, P), weights),
            torch.arange(B * T).view(B, T),
            lengths,
            weights,
            3.0,
            3.0,
            h0,
            c0,
        )
        for g, w in zip(got, want):
            assert_close(g, w, what=f"bilstm_train {kwargs} vs bilstm")
    ref = bilstm_ref(
        layer0_gates_ref(x.double().view(B * T, P), [w.double() for w in weights]),
        torch.arange(B * T).view(B, T),
        lengths,
        [w.double() for w in weights],
        3.0,
        3.0,
        h0.double(),
        c0.double(),
    )
    assert_close(got[0], ref[0], what="bilstm_train vs bilstm_ref")


@needs_extension
@poisoned
def test_bilstm_train_fresh_dropout():
    x, lengths, weights, h0, c0, _ = stack_case(8, 10, 2, 16, 64, torch.float32, seed=5, lengths=[10] * 8)
    torch.manual_seed(0)
    a = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, dropout=0.1)
    b = ops.bilstm_train(x, lengths, weights, 3.0, 3.0, h0, c0, dropout=0.1)
    assert not torch.equal(a[0], b[0]), "each call draws its own masks"
    masks = ops.dropout_masks((2, 8, 10, 16), 2, 0.1, generator=torch.Generator().manual_seed(1))
    zeros = torch.cat([(m == 0).flatten() for m in masks]).double().mean().item()
    assert 0.07 < zeros < 0.13 and all(torch.all((m == 0) | (m == 1 / 0.9)) for m in masks)


@needs_extension
@poisoned
def test_bilstm_train_per_direction_inputs():
    x, lengths, weights, h0, c0, masks = stack_case(5, 6, 2, 4, 6, torch.float64, seed=6)
    x2 = torch.stack([x, x.flip(-1)])
    fast, ref = stack_fns(lengths, masks, 1.0)
    check_grads(fast, ref, [x2, h0, c0, *weights], "bilstm_train [2, B, T, P] input")


# --- the reference's own gradients, under gradcheck in float64 ------------------------------------


@pytest.mark.slow
def test_gradcheck_bilstm_with_clips(mini):
    torch.manual_seed(1)
    B, T, P, C = 3, 5, MINI.projection_dim, MINI.cell_dim
    lengths = torch.tensor([5, 1, 3])
    token_index = torch.randint(0, 6, (B, T))
    flat = leaves(flat_lstm_weights(mini.lstm))
    xg0 = (3 * torch.randn(6, 2, 4 * C, dtype=torch.float64)).requires_grad_()
    h0 = (0.3 * torch.randn(2, B, 2 * P, dtype=torch.float64)).requires_grad_()
    c0 = (0.3 * torch.randn(2, B, 2 * C, dtype=torch.float64)).requires_grad_()

    def f(xg0, h0, c0, *w):
        return bilstm_ref(xg0, token_index, lengths, list(w), MINI.cell_clip, MINI.proj_clip, h0, c0)

    with torch.no_grad():
        outputs, _, c = f(xg0, h0, c0, *flat)
    # the clips are exercised: layer 0's outputs (no skip connection) and final cells sit on them
    assert bool((outputs[0].abs() == MINI.proj_clip).any()) and bool((c.abs() == MINI.cell_clip).any())
    assert torch.autograd.gradcheck(f, (xg0, h0, c0, *flat))
