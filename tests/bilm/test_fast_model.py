"""The whole model on the fast path against the reference: random presets, the bilm-tf fixture."""

import numpy as np
import pytest
import torch
from bilm_cases import _sentences, expected_top_layers
from tolerances import MODEL_BF16, TOL, max_abs_error

from elmo_fast import ElmoBiLm, ElmoEmbedder, batch_to_ids
from elmo_fast.bilm import ops
from elmo_fast.bilm.model import resolve_backend

FP32 = TOL[torch.float32]["atol"]
HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
pytestmark = pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")


def _batch(seed, n, lo=1, hi=30):
    sents = _sentences(np.random.default_rng(seed), n, lo, hi)
    sents[0] = ["x" * 60, "<S>", "ü" * 30] + sents[0]  # a cut multibyte token, a literal boundary token
    if n > 2:
        sents[1] = ["one"]  # a one-token sentence among long ones: heavy padding
        sents[2] = []  # an empty sentence
    return sents


def _compare(files, batches, stateful=False):
    ref = ElmoBiLm(*files, backend="reference", stateful=stateful)
    fast = ElmoBiLm(*files, backend="fast", stateful=stateful)
    worst = 0.0
    with torch.inference_mode():
        for batch in batches:
            ids = batch_to_ids(batch)
            a, f = ref(ids), fast(ids)
            assert torch.equal(a["mask"], f["mask"])
            for x, y in zip(a["activations"], f["activations"]):
                assert x.shape == y.shape
                worst = max(worst, max_abs_error(y, x))
    return worst


@pytest.mark.parametrize("preset,n", [("tiny", 9), ("small", 9), ("original", 3)])
@pytest.mark.slow
def test_fast_matches_reference_with_clips(random_models, preset, n):
    worst = _compare(random_models(preset, exercise_clips=True), [_batch(n, n)])
    assert worst <= FP32, f"{preset}: max abs error {worst:.3g}"


@pytest.mark.slow
def test_the_calibrated_fast_path_is_as_near_float64_as_the_fp32_reference(random_models, tmp_path, monkeypatch):
    """Two fp32 computations of a long stateful run differ by both of their roundings: against the float64
    reference, the fast path (its kernels as this machine's calibration chooses them: a user's default)
    errs no more than the fp32 reference does, sentence after sentence with the states carried."""
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))  # a fresh calibration, measured here
    files = random_models("small", exercise_clips=True)
    sentences = sorted(_batch(11, 8, 1, 60), key=len)
    models = {
        "fast": ElmoBiLm(*files, backend="fast", stateful=True),
        "ref32": ElmoBiLm(*files, backend="reference", stateful=True),
        "ref64": ElmoBiLm(*files, backend="reference", stateful=True).double(),
    }
    worst = {"fast": 0.0, "ref32": 0.0}
    with torch.inference_mode():
        for sentence in sentences:
            ids = batch_to_ids([sentence])
            out = {name: model(ids)["activations"] for name, model in models.items()}
            for name in worst:
                for x, y in zip(out[name], out["ref64"]):
                    worst[name] = max(worst[name], float((x.double() - y).abs().max()))
    assert worst["fast"] <= max(1.5 * worst["ref32"], FP32 / 10), worst


@pytest.mark.slow
def test_fast_matches_reference_stateful_across_batches(random_models):
    files = random_models("tiny", exercise_clips=True)
    s = _batch(5, 12)
    # growing and shrinking batches: allennlp's rules for the carried states
    assert _compare(files, [s[:3], s[3:8], s[8:10], s[10:12] + s[:3]], stateful=True) <= FP32


@pytest.mark.slow
def test_fast_golden_bilm_tf_stateful(bilm_tf_tiny, tiny_files, fixture_sentences):
    expected = expected_top_layers(bilm_tf_tiny)
    emb = ElmoEmbedder(*tiny_files, batch_size=3, stateful=True, backend="fast")
    order = [fixture_sentences[k][i].split() for i in range(10) for k in range(3)]
    worst = 0.0
    for n, got in enumerate(emb.embed_sentences(order)):
        i, k = divmod(n, 3)
        worst = max(worst, float(np.abs(got[2] - expected[k][i]).max()))
    assert worst <= FP32, worst


def test_token_cache_changes_nothing(random_models):
    files = random_models("tiny", exercise_clips=True)
    sentences = _sentences(np.random.default_rng(8), 40, 1, 20)
    cached = ElmoEmbedder(*files, batch_size=8, backend="fast", token_cache_mb=0.05)  # a few entries: evictions
    plain = ElmoEmbedder(*files, batch_size=8, backend="fast", token_cache_mb=0)
    assert plain.elmo_bilm.token_cache is None
    for a, b in zip(cached.embed_sentences(sentences), plain.embed_sentences(sentences)):
        np.testing.assert_array_equal(a, b)
    cache = cached.elmo_bilm.token_cache
    assert cache.hits > 0 and 0 < len(cache) <= cache.max_entries


@pytest.mark.slow
def test_empty_and_tiny_batches(random_models):
    files = random_models("tiny")
    fast = ElmoEmbedder(*files, backend="fast")
    ref = ElmoEmbedder(*files, backend="reference")
    for batch in ([], [[]], [["a"]], [[], ["b"], []]):
        for x, y in zip(fast.embed_batch(batch), ref.embed_batch(batch)):
            assert x.shape == y.shape
            np.testing.assert_allclose(x, y, atol=FP32, rtol=0)


@pytest.mark.slow
def test_whole_forward_compiles_fullgraph(random_models):
    files = random_models("tiny", exercise_clips=True)
    bilm = ElmoBiLm(*files, backend="fast").eval()
    ids = batch_to_ids(_batch(2, 4))
    with torch.inference_mode():
        eager = bilm(ids)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.inference_mode():
        compiled = torch.compile(bilm, fullgraph=True)(ids)
    for x, y in zip(eager["activations"], compiled["activations"]):
        assert max_abs_error(y, x) <= FP32


def test_auto_backend_is_fast_when_built():
    assert resolve_backend("auto") == "fast"
    assert resolve_backend("reference") == "reference"


# bf16 on CPU: GEMMs in bf16 with fp32 accumulation, char CNN / cell state / elementwise in fp32;
# the stated bound is MODEL_BF16 in tests/support/tolerances.py.
BF16_MAX_REL, BF16_RMS_REL = MODEL_BF16["max_rel"], MODEL_BF16["rms_rel"]


@pytest.mark.parametrize("preset,exercise_clips", [("tiny", True), ("small", False), ("small", True)])
@pytest.mark.slow
def test_bf16_error_bound(random_models, preset, exercise_clips):
    files = random_models(preset, exercise_clips=exercise_clips)
    ids = batch_to_ids(_batch(11, 8))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        low = ElmoBiLm(*files, backend="fast", dtype=torch.bfloat16)(ids)
    mask = ref["mask"]
    for k, (r, x) in enumerate(zip(ref["activations"], low["activations"])):
        assert x.dtype == torch.float32
        r, x = r[mask].double(), x[mask].double()
        err = (x - r).abs()
        assert err.max() <= BF16_MAX_REL * r.abs().max(), f"layer {k}: max err {err.max():.3g}"
        rms = err.pow(2).mean().sqrt() / r.pow(2).mean().sqrt()
        assert rms <= BF16_RMS_REL, f"layer {k}: relative RMS err {rms:.3g}"
        assert err.max() > 0  # it really ran in bf16


def test_bf16_needs_fast_backend(random_models):
    from elmo_fast import ElmoFastError

    with pytest.raises(ElmoFastError, match="fast backend"):
        ElmoBiLm(*random_models("tiny"), backend="reference", dtype=torch.bfloat16)
    with pytest.raises(ElmoFastError, match="dtype must be torch.float32, torch.bfloat16 or torch.float16"):
        ElmoBiLm(*random_models("tiny"), dtype=torch.float64)


def test_auto_falls_back_to_reference_once_with_a_build_hint(monkeypatch):
    import warnings

    import elmo_fast.bilm.backends as backends_module

    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    monkeypatch.setattr(backends_module, "_warned_fallback", False)
    with pytest.warns(RuntimeWarning, match="pip install --no-build-isolation -e ."):
        assert resolve_backend("auto") == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no warning
        assert resolve_backend("auto") == "reference"
    with pytest.raises(ValueError, match="pip install --no-build-isolation"):
        resolve_backend("fast")
