"""Gradients of the whole biLM: the reference under gradcheck in float64, the fast ops' backward passes
against it, and which path Elmo takes to train (each stage's own gradients: its room's file).

Calls that need gradients of the biLM's weights run the reference path (its autograd is the
oracle); everything else, training a frozen biLM's scalar mixes included, runs the fast ops.
"""

import numpy as np
import pytest
import torch
from bilm_cases import MINI, MINI_WORDS, _sentences, bilm_fast_train, rebuild
from grad_checks import leaves

from elmo_fast import Elmo, batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops, reference
from elmo_fast.bilm.reference import bilm_ref, remove_sentence_boundaries, scalar_mix_ref

HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
GRAD_RTOL = 1e-4  # fast vs reference gradients: max |difference| <= 1e-4 * max |reference gradient|


@pytest.mark.slow
def test_gradcheck_whole_bilm(mini):
    ids = batch_to_ids(MINI_WORDS)
    tensors = leaves(mini.tensors())

    def f(*t):
        layers, _, h, c = bilm_ref(ids, rebuild(MINI, t))
        return (*layers, h, c)

    # fast_mode: one random direction per input: every weight is covered, in a few seconds
    assert torch.autograd.gradcheck(f, tensors, fast_mode=True)


# --- the whole biLM on the fast ops' backward passes ----------------------------------------------


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
@pytest.mark.slow
def test_gradcheck_whole_bilm_on_the_fast_ops(mini):
    ids = batch_to_ids(MINI_WORDS)
    tensors = leaves(mini.tensors())

    def f(*t):
        layers, _, h, c = bilm_fast_train(ids, rebuild(MINI, t))
        return (*layers, h, c)

    assert torch.autograd.gradcheck(f, tensors, fast_mode=True)


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
@pytest.mark.parametrize("preset", ["mini", "tiny"])
@pytest.mark.slow
def test_whole_bilm_fast_training_equals_the_reference(preset, mini, random_models):
    # float64: the fast path's gradients of every biLM weight match bilm_ref's autograd to rounding.
    if preset == "mini":
        options, weights = MINI, mini
        sentences = MINI_WORDS
    else:
        options_file, weight_file = random_models("tiny", exercise_clips=True)
        weights = load_weights(weight_file, load_options(options_file)).to(dtype=torch.float64)
        options = weights.options
        sentences = _sentences(np.random.default_rng(7), 6, 1, 11)
    ids = batch_to_ids(sentences)
    fast_t, ref_t = leaves(weights.tensors()), leaves(weights.tensors())
    fast = bilm_fast_train(ids, rebuild(options, fast_t))
    ref = bilm_ref(ids, rebuild(options, ref_t))
    gen = torch.Generator().manual_seed(3)
    outs_fast = [*fast[0], fast[2], fast[3]]
    outs_ref = [*ref[0], ref[2], ref[3]]
    projections = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs_ref]
    for a, b in zip(outs_fast, outs_ref):
        assert (a - b).abs().max().item() <= 1e-12
    got = torch.autograd.grad(sum((o * p).sum() for o, p in zip(outs_fast, projections)), fast_t)
    want = torch.autograd.grad(sum((o * p).sum() for o, p in zip(outs_ref, projections)), ref_t)
    for i, (g, w) in enumerate(zip(got, want)):
        scale = w.abs().max().item()
        assert (g - w).abs().max().item() <= 1e-10 * max(scale, 1e-30), f"{preset}: gradient {i}"
    assert all(g.abs().sum() > 0 for g in got)  # every weight trains


# --- Elmo: which path, and the gradients it gives --------------------------------------------------


@pytest.fixture
def spies(monkeypatch):
    """Counts calls of the fast ops, of the reference biLM and of the reference biLSTM (which every
    autograd path runs: bilm_ref, and the deduplicating one fine-tuning takes), as the model makes them."""
    calls = {"char_cnn": 0, "highway": 0, "bilstm": 0, "bilstm_train": 0, "bilm_ref": 0, "bilstm_ref": 0}

    def spy(module, name):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    for name in ("char_cnn", "highway", "bilstm", "bilstm_train"):
        spy(ops, name)
    spy(reference, "bilm_ref")
    spy(reference, "bilstm_ref")
    return calls


MIXES = [([0.3, -1.2, 0.9], 0.7), ([-0.5, 0.4, 1.1], 1.6)]


def _elmo(files, backend="auto", **kwargs):
    elmo = Elmo(*files, 2, dropout=0.0, backend=backend, **kwargs).train()
    for k, (w, g) in enumerate(MIXES):
        mix = getattr(elmo, f"scalar_mix_{k}")
        with torch.no_grad():
            for p, v in zip(mix.scalar_parameters, w):
                p.fill_(v)
            mix.gamma.fill_(g)
    return elmo


def _projections(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in MIXES]


def _loss(representations, projections):
    return sum((r * p).sum() for r, p in zip(representations, projections))


def _reference_grads(options, bilm_tensors, ids, projections, layer_norm):
    """The whole computation from scratch: bilm_ref + scalar_mix_ref + boundaries removed."""
    tensors = leaves(bilm_tensors)
    mix_leaves = [(torch.tensor(w, requires_grad=True), torch.tensor([g], requires_grad=True)) for w, g in MIXES]
    layers, mask, _, _ = bilm_ref(ids, rebuild(options, tensors))
    reps = [remove_sentence_boundaries(scalar_mix_ref(layers, w, g, mask, layer_norm), mask)[0] for w, g in mix_leaves]
    loss = _loss(reps, projections)
    flat_mix = [t for pair in mix_leaves for t in pair]
    grads = torch.autograd.grad(loss, tensors + flat_mix)
    return grads[: len(tensors)], grads[len(tensors) :]


def _mix_grads(elmo):
    out = []
    for k in range(len(MIXES)):
        mix = getattr(elmo, f"scalar_mix_{k}")
        out += [torch.cat([p.grad for p in mix.scalar_parameters]), mix.gamma.grad]
    return out


def _assert_grads_close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None, f"{what}: gradient {i} missing"
        scale = w.abs().max().item()
        err = (g - w).abs().max().item()
        assert err <= GRAD_RTOL * max(scale, 1e-30), f"{what}: gradient {i}: max err {err:.3g}, scale {scale:.3g}"


@pytest.mark.parametrize(
    "backend",
    [pytest.param("fast", marks=pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")), "reference"],
)
@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.slow
def test_fine_tuning_gradients_equal_the_reference(random_models, spies, layer_norm, backend):
    files = random_models("tiny", exercise_clips=True)
    elmo = _elmo(files, requires_grad=True, do_layer_norm=layer_norm, backend=backend)
    sentences = _sentences(np.random.default_rng(2), 4, 1, 9)
    sentences[1] = ["one"]
    ids = batch_to_ids(sentences)
    out = elmo(ids)
    projections = _projections(out["elmo_representations"][0].shape, 0)
    _loss(out["elmo_representations"], projections).backward()
    # with grad on and the biLM trainable: each distinct token once through the char CNN and highway,
    # then the biLSTM, under autograd: on the fast backend the fused ops with their backward passes
    # (bilstm_train, not the inference-only bilstm), else the reference stages (not bilm_ref itself,
    # which stays the independent oracle below)
    if backend == "fast":
        assert spies["char_cnn"] == spies["highway"] == spies["bilstm_train"] == 1
        assert spies["bilstm_ref"] == spies["bilstm"] == 0
    else:
        assert spies["bilstm_ref"] == 1 and spies["bilstm"] == spies["char_cnn"] == spies["bilstm_train"] == 0
    bilm_params = elmo._elmo_lstm.weights().tensors()  # the module's own Parameters, in ElmoWeights' order
    want_bilm, want_mix = _reference_grads(
        elmo._elmo_lstm.options, [p.detach() for p in bilm_params], ids, projections, layer_norm
    )
    _assert_grads_close([p.grad for p in bilm_params], want_bilm, "biLM weights")
    _assert_grads_close(_mix_grads(elmo), want_mix, "scalar mixes")
    assert all(p.grad.abs().sum() > 0 for p in bilm_params)  # every weight trains


@pytest.mark.slow
def test_fine_tuning_through_the_vocab_cache(random_models):
    """requires_grad with word_inputs: the cached words' char ids run through the reference, so the
    char CNN still gets its gradients, equal to the char path's."""
    files = random_models("tiny", exercise_clips=True)
    vocab = ["@@PADDING@@"] + "the a cat sat on mat".split()
    sentences = [["the", "cat", "sat"], ["a", "mat"]]
    word_ids = torch.tensor([[1, 3, 4], [2, 6, 0]])
    grads = []
    for args in [(batch_to_ids(sentences),), (None, word_ids)]:
        elmo = _elmo(files, requires_grad=True, vocab_to_cache=vocab)
        out = elmo(*args)
        _loss(out["elmo_representations"], _projections(out["elmo_representations"][0].shape, 1)).backward()
        grads.append([p.grad for p in elmo.parameters()])
        assert elmo._elmo_lstm.token_embedder.char_cnn.convs[0].weight.grad.abs().sum() > 0  # the char CNN trains
    _assert_grads_close(grads[1], grads[0], "word_inputs vs char_ids")


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.slow
def test_frozen_bilm_trains_its_mixes_on_the_fast_path(random_models, spies, layer_norm):
    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(_sentences(np.random.default_rng(3), 5, 1, 12))
    grads = {}
    for backend in ("fast", "reference"):
        elmo = _elmo(files, backend=backend, do_layer_norm=layer_norm)
        assert elmo.training and torch.is_grad_enabled()
        out = elmo(ids)
        _loss(out["elmo_representations"], _projections(out["elmo_representations"][0].shape, 2)).backward()
        grads[backend] = _mix_grads(elmo)
        assert all(p.grad is None for p in elmo._elmo_lstm.parameters())
        if backend == "fast":  # train mode, grad on, but nothing in the biLM to train: fast ops only
            assert spies["bilstm_ref"] == 0 and spies["char_cnn"] == spies["highway"] == spies["bilstm"] == 1
    assert spies["bilm_ref"] == 1
    _assert_grads_close(grads["fast"], grads["reference"], "scalar mixes, fast vs reference")


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
def test_inference_takes_the_fast_path_even_when_fine_tuning(random_models, spies):
    files = random_models("tiny", exercise_clips=True)
    elmo = _elmo(files, requires_grad=True)
    ids = batch_to_ids([["a", "b"], ["c"]])
    with torch.no_grad():
        elmo(ids)
    with torch.inference_mode():
        elmo.eval()(ids)
    assert spies["bilstm_ref"] == 0 and spies["bilstm"] == 2
    out = elmo.eval()(ids)  # eval() with grad on: still the fast path; the mixes still get gradients
    assert spies["bilstm_ref"] == 0 and spies["bilstm"] == 3
    out["elmo_representations"][0].sum().backward()
    assert all(p.grad is None for p in elmo._elmo_lstm.parameters())
    assert elmo.scalar_mix_0.gamma.grad is not None
    elmo.train()(ids)  # train mode, grad on: the fast backward ops where built, else the reference under autograd
    assert spies["bilstm"] == 3
    if ops.HAS_BACKWARD:
        assert spies["bilstm_train"] == 1 and spies["bilstm_ref"] == 0
    else:
        assert spies["bilstm_train"] == 0 and spies["bilstm_ref"] == 1
