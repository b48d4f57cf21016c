"""The whole biLM on the CUDA targets: the ops chained as a fast model chains them, and ElmoBiLm on a
GPU (host-planned forward, CUDA graphs, each precision's bound, bilm-tf's golden outputs), against
the reference; a whole biLM's gradients through the training ops.

Two targets run each test (tests/support/cuda_targets.py): "cuda", the kernels on a GPU (skips, saying
why, without one), and "emulated", the same kernels and bindings compiled for the CPU emulator (a default
subset; every case with ELMO_FAST_CUDA_EMULATION=1). Outputs come from a poisoned allocator; the backward
passes run with @poisoned (tests/support/grad_checks.py); TF32 is off (exact_fp32)."""

import numpy as np
import pytest
import torch
from bilm_cases import bilm_fast_train, expected_top_layers, rebuild, sentences
from cuda_targets import (
    emulated_by_default,
    exact_fp32,  # noqa: F401  (autouse: TF32 off)
    needs_cpu_ops,
    no_nan,
    poison,
    ran_ops,
)
from grad_checks import poisoned
from rounding_model import modeled_error
from tolerances import MODEL_BF16, MODEL_BOUNDS, TOL, assert_close, assert_grad_close, fp32_model_bound, max_abs_error

from elmo_fast import ElmoBiLm, batch_to_ids, load_options, load_weights
from elmo_fast.bilm import model as model_module
from elmo_fast.bilm import ops, reference
from elmo_fast.bilm.reference import add_sentence_boundaries, bilm_ref, flat_lstm_weights, layer0_gates_ref


def ops_bilm(target, char_ids, w, h0=None, c0=None):
    """bilm_ref's computation through the target's ops: char CNN and highway once per distinct
    token, layer-0 gates per distinct token, the biLSTM over token indices (as a fast model does)."""
    o = w.options
    ids, mask = add_sentence_boundaries(char_ids)
    B, T2, W = ids.shape
    uniq, inverse = torch.unique(ids.reshape(B * T2, W), dim=0, return_inverse=True)
    tokens = target.op("char_cnn")(uniq, w.char_embedding, list(w.conv_weights), list(w.conv_biases), o.activation)
    tokens = target.op("highway")(tokens, list(w.highway_weights), list(w.highway_biases), w.proj_weight, w.proj_bias)
    lstm = flat_lstm_weights(w.lstm)
    outputs, h, c = target.op("bilstm")(
        layer0_gates_ref(tokens, lstm), inverse.view(B, T2), mask.sum(dim=1), lstm, o.cell_clip, o.proj_clip, h0, c0
    )
    token_vectors = tokens[inverse].view(B, T2, -1) * mask.unsqueeze(-1).to(tokens.dtype)
    return [torch.cat([token_vectors, token_vectors], dim=-1), *outputs.unbind(0)], mask, h, c


def bilm_outputs_ref(ids, weights) -> list:
    """bilm_ref's activations, h and c, in the weights' dtype (float64: the oracle of the fp32 bound)."""
    activations, _, h, c = bilm_ref(ids, weights)
    return [*activations, h, c]


_MODELED: dict = {}  # (preset, ids, fma) -> the rounding model's error: float64 runs of 'original' take a while


def modeled_bilm_error(preset, ids, w64, fma: bool) -> float:
    key = (preset, ids.numpy().tobytes(), tuple(ids.shape), fma)
    if key not in _MODELED:
        _MODELED[key] = modeled_error(lambda: bilm_outputs_ref(ids, w64), reference, fma=fma)
    return _MODELED[key]


def fp32_bilm_bound(target, preset, ids, w64) -> float:
    """The fp32 bound of a whole biLM on the target: the 1e-5 bar on the CPU emulator (its GEMMs are the
    CPU's) and for the tiny preset; on a GPU, for larger presets, the rounding-error model's bound
    (tests/support/tolerances.py: recursive FMA sums of 512 and 4096 terms, as cuBLAS makes them)."""
    if not target.is_cuda or preset == "tiny":
        return TOL[torch.float32]["atol"]
    return fp32_model_bound(modeled_bilm_error(preset, ids, w64, fma=True))


@emulated_by_default(lambda preset: preset == "tiny")
@pytest.mark.parametrize("preset", ["tiny", "small", "original"])
def test_ops_bilm_matches_reference(target, random_models, preset):
    options, weight_file = random_models(preset, exercise_clips=True)
    w_cpu = load_weights(weight_file, load_options(options))
    w = w_cpu.to(target.device)
    rng = np.random.default_rng(0)
    batch = sentences(rng, 5) + [["one"], []]
    ids = batch_to_ids(batch)
    poison(target)
    got, mask, h, c = ops_bilm(target, ids.to(target.device), w)
    # The float64 reference on the same weights: the bound is the fast path's own error
    # (the fp32 reference itself is ~4e-6 from it on the small and original presets).
    w64 = w_cpu.to(dtype=torch.float64)
    want_cpu, mask_cpu, h_cpu, c_cpu = bilm_ref(ids, w64)
    bound = fp32_bilm_bound(target, preset, ids, w64)
    what = f"{target.name} biLM {preset}"
    assert torch.equal(mask.cpu(), mask_cpu)
    for k, (g, e) in enumerate(zip(got + [h, c], want_cpu + [h_cpu, c_cpu])):
        no_nan(g, f"{what}, output {k}")
        assert max_abs_error(g, e) <= bound, f"{what} vs float64 CPU reference, output {k}: > {bound:.3g}"
    if target.is_cuda:  # and against the reference on the same device (itself fp32: twice the bound)
        want_dev = bilm_ref(ids.to(target.device), w)
        for k, (g, e) in enumerate(zip(got + [h, c], list(want_dev[0]) + list(want_dev[2:]))):
            assert max_abs_error(g, e) <= 2 * bound, f"{what} vs CUDA reference, output {k}"


@pytest.mark.parametrize("preset", ["tiny", "small", "original"])
def test_fp32_error_within_the_rounding_model(target, random_models, preset):
    """The kernels built as a GPU builds them (the emulator with FMA contraction; a GPU) stay within the
    rounding-error model's bound (tests/support/tolerances.py), which contraction does not move: the model with
    FMA and without differ by less than 5%. (Slow in the emulator: the full set only.)"""
    options, weight_file = random_models(preset, exercise_clips=True)
    w_cpu = load_weights(weight_file, load_options(options))
    ids = batch_to_ids(sentences(np.random.default_rng(0), 5) + [["one"], []])
    got, _, h, c = ops_bilm(target, ids.to(target.device), w_cpu.to(target.device))
    w64 = w_cpu.to(dtype=torch.float64)
    with_fma, without = (modeled_bilm_error(preset, ids, w64, fma) for fma in (True, False))
    assert abs(with_fma - without) <= 0.05 * without, f"model with FMA {with_fma:.3g}, without {without:.3g}"
    bound = fp32_model_bound(with_fma)
    err = max(max_abs_error(g, e) for g, e in zip(got + [h, c], bilm_outputs_ref(ids, w64)))
    assert err <= bound, f"{target.name} {preset}: max abs error {err:.3g} > the model's bound {bound:.3g}"


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
@pytest.mark.parametrize("preset", ["tiny", "small", "original"])
def test_fast_model_on_cuda_matches_reference(cuda_target, random_models, preset):
    options, weight_file = random_models(preset, exercise_clips=True)
    fast = ElmoBiLm(options, weight_file, backend="fast").to("cuda")
    ref = ElmoBiLm(options, weight_file)
    w64 = load_weights(weight_file, load_options(options)).to(dtype=torch.float64)
    rng = np.random.default_rng(1)
    for batch in (sentences(rng, 6), [["a"]], sentences(rng, 3, 20, 40)):
        ids = batch_to_ids(batch)
        poison(cuda_target)
        got = fast(ids.cuda())
        want = ref(ids)
        assert torch.equal(got["mask"].cpu(), want["mask"])
        # both sides fp32: twice the model's bound (tiny: the bar)
        bound = fp32_bilm_bound(cuda_target, preset, ids, w64) * (1 if preset == "tiny" else 2)
        for k, (g, e) in enumerate(zip(got["activations"], want["activations"])):
            assert max_abs_error(g, e) <= bound, f"fast model {preset} layer {k}: > {bound:.3g}"


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cache", [0, 10_000], ids=["no_cache", "token_cache"])
def test_fast_model_forward_from_host_inputs_never_waits_for_the_gpu(cuda_target, random_models, dtype, cache):
    """Char ids on the CPU, model on the GPU: the distinct tokens, lengths and the bilstm schedule are
    made on the host and copied from pinned memory, so the forward queues work without one device
    sync (torch's sync debug mode raises on any) and gives the reference's vectors."""
    files = random_models("small", exercise_clips=True)
    fast = ElmoBiLm(*files, backend="fast", dtype=dtype, token_cache_size=cache).to("cuda")
    ref = ElmoBiLm(*files, backend="reference")
    rng = np.random.default_rng(7)
    batches = [sentences(rng, 6) + [[]], sentences(rng, 3, 20, 40)]
    with torch.inference_mode():
        fast(batch_to_ids(batches[0]))  # warm-up: cuBLAS handles, the stacked weights, pinned blocks
        torch.cuda.synchronize()
        for batch in batches:
            ids = batch_to_ids(batch)
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = fast(ids)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            want = ref(ids)
            assert torch.equal(got["mask"].cpu(), want["mask"])
            for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
                if dtype == torch.float32:
                    assert_close(g, w, dtype=torch.float32, what=f"host-planned forward layer {k}")
                else:
                    m = want["mask"]
                    err = (g.cpu()[m].double() - w[m].double()).abs().max()
                    assert err <= MODEL_BF16["max_rel"] * w[m].abs().max(), f"layer {k}: bf16 error {err:.3g}"
    weights = fast._flat_lstm()
    assert fast._flat_lstm() is weights and all(w.dtype == dtype and w.is_cuda for w in weights)
    assert weights[1].untyped_storage().data_ptr() == weights[5].untyped_storage().data_ptr()  # stacked


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_graphs_replay_the_eager_forward(cuda_target, random_models, dtype):
    """ElmoBiLm(cuda_graphs=N): buckets captured on their second batch and replayed after, with other
    tokens of the same lengths and interleaved with other buckets (each graph's memory is its own),
    give the eager forward's vectors; a replay never waits for the GPU."""
    files = random_models("small", exercise_clips=True)
    graphed = ElmoBiLm(*files, backend="fast", dtype=dtype, cuda_graphs=2).to("cuda")
    eager = ElmoBiLm(*files, backend="fast", dtype=dtype).to("cuda")
    rng = np.random.default_rng(9)
    one = sentences(rng, 1, 20, 21)  # one sentence of 20 tokens: the latency case
    one_other = [[w[::-1] for w in one[0]]]  # the same length, other tokens
    four = sentences(rng, 4, 1, 12)
    four_other = [[w + "s" for w in s] for s in four]
    third = sentences(rng, 3, 5, 9)
    steps = [one, one, one_other, four, four, one, four_other, third, third, four, one_other]
    captures = {1, 4, 8, 10}  # a bucket's second batch; at 8 `one` goes (2 kept), at 10 it comes back
    with torch.inference_mode():
        for i, batch in enumerate(steps):
            ids = batch_to_ids(batch)
            if i not in captures:  # replays, and first batches run eagerly: no sync either way
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                got = graphed(ids)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            want = eager(ids)
            assert torch.equal(got["mask"].cpu(), want["mask"].cpu()), i
            for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
                err = max_abs_error(g, w)
                bound = TOL[torch.float32]["atol"] if dtype == torch.float32 else 1e-2 * w.abs().max().item()
                assert err <= bound, f"step {i}, layer {k}: {err:.3g}"
    assert 0 < len(graphed._graphs) <= 2


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_bf16_fast_model_on_cuda_error_bound(cuda_target, random_models, preset):
    """dtype=bfloat16 on CUDA: the same stated bound as on CPU (tests/bilm/test_fast_model.py), though
    the CUDA bilstm rounds its layer-0 gates and biases to bf16 too."""
    files = random_models(preset, exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(2), 9))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        low = ElmoBiLm(*files, backend="fast", dtype=torch.bfloat16).to("cuda")(ids.cuda())
    mask = ref["mask"]
    for k, (r, x) in enumerate(zip(ref["activations"], low["activations"])):
        assert x.dtype == torch.float32
        r, x = r[mask].double(), x.cpu()[mask].double()
        err = (x - r).abs()
        assert err.max() <= MODEL_BF16["max_rel"] * r.abs().max(), f"layer {k}: max err {err.max():.3g}"
        assert err.pow(2).mean().sqrt() <= MODEL_BF16["rms_rel"] * r.pow(2).mean().sqrt(), f"layer {k}: RMS err"


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_low_precision_on_cuda_within_the_stated_bound(cuda_target, random_models, preset, precision):
    """Each precision's bound (elmo_fast.bilm.precision, MODEL_BOUNDS) on a GPU, against the fp32
    CPU reference, per output layer; and fp32 stays within the fp32 bar while the process has TF32
    on for itself (fp32 turns it off for the forward)."""
    files = random_models(preset, exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(3), 9))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        low = ElmoBiLm(*files, backend="fast", precision=precision).to("cuda")(ids.cuda())
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            exact = ElmoBiLm(*files, backend="fast").to("cuda")(ids.cuda())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    mask = ref["mask"]
    bound = MODEL_BOUNDS[precision]
    # fp32 on both sides: the bar for tiny, twice the rounding model's GPU bound beyond (tests/support/tolerances.py)
    w64 = load_weights(files[1], load_options(files[0])).to(dtype=torch.float64)
    fp32_bound = fp32_bilm_bound(cuda_target, preset, ids, w64) * (1 if preset == "tiny" else 2)
    for k, (r, x, e) in enumerate(zip(ref["activations"], low["activations"], exact["activations"])):
        assert x.dtype == torch.float32
        assert max_abs_error(e.cpu(), r) <= fp32_bound, f"fp32 under a process's TF32, layer {k}"
        r, x = r[mask].double(), x.cpu()[mask].double()
        err = (x - r).abs()
        assert err.max() <= bound["max_rel"] * r.abs().max(), f"{precision} layer {k}: max err {err.max():.3g}"
        assert err.pow(2).mean().sqrt() <= bound["rms_rel"] * r.pow(2).mean().sqrt(), f"{precision} layer {k}: RMS"


@emulated_by_default()
def test_golden_bilm_tf_stateful(target, bilm_tf_tiny, tiny_files, fixture_sentences):
    """bilm-tf's outputs of the real tiny model, batch after batch with carried states (see
    test_reference.test_golden_lm_embeddings_stateful), through the target's ops."""
    expected = expected_top_layers(bilm_tf_tiny)
    w = load_weights(tiny_files[1], load_options(tiny_files[0])).to(target.device)
    h = c = None
    worst = 0.0
    for i in range(10):
        batch = [fixture_sentences[k][i].split() for k in range(3)]
        poison(target)
        acts, mask, h, c = ops_bilm(target, batch_to_ids(batch).to(target.device), w, h, c)
        for k in range(3):
            n = len(batch[k])
            got = acts[2][k, 1 : n + 1].cpu().numpy()  # drop <S>
            worst = max(worst, float(np.abs(got - expected[k][i]).max()))
    assert worst <= TOL[torch.float32]["atol"], f"{target.name}: max abs error vs bilm-tf {worst:.3g}"


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
def test_golden_bilm_tf_stateful_fast_model(cuda_target, bilm_tf_tiny, tiny_files, fixture_sentences):
    expected = expected_top_layers(bilm_tf_tiny)
    bilm = ElmoBiLm(*tiny_files, stateful=True, backend="fast").to("cuda")
    worst = 0.0
    for i in range(10):
        batch = [fixture_sentences[k][i].split() for k in range(3)]
        top, _ = bilm.embed(batch_to_ids(batch).cuda())
        for k in range(3):
            worst = max(worst, float(np.abs(top[k, 2, : len(batch[k])].cpu().numpy() - expected[k][i]).max()))
    assert worst <= TOL[torch.float32]["atol"], f"max abs error vs bilm-tf {worst:.3g}"


# --- a whole biLM's gradients through ops.char_cnn, ops.highway and ops.bilstm_train --------------


@needs_cpu_ops
@poisoned
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
