"""Elmo (allennlp's ``Elmo``): every option against the reference biLM and the mix written out by hand."""

import math

import numpy as np
import pytest
import torch
from bilm_cases import _sentences, expected_top_layers
from tolerances import MODEL_BF16, TOL, max_abs_error

from elmo_fast import Elmo, ElmoBiLm, ElmoFastError, batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import bilm_ref

FP32 = TOL[torch.float32]["atol"]
HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
BACKENDS = ["reference", pytest.param("fast", marks=pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built"))]


# --- the equations, written out in float64 ---------------------------------------------------------


def mix_by_hand(layers, mask, w, gamma, layer_norm):
    """gamma * sum_k softmax(w)_k * h_k; with layer_norm each h_k becomes (h_k - mean) / sqrt(var + 1e-13),
    mean and var over all unmasked elements of the batch (all features), applied at every position."""
    s = torch.softmax(torch.tensor(w, dtype=torch.float64), 0)
    out = 0
    for k, x in enumerate(layers):
        x = x.double()
        if layer_norm:
            values = x[mask.bool()]
            mean = values.mean()
            x = (x - mean) / torch.sqrt(((values - mean) ** 2).mean() + 1e-13)
        out = out + s[k] * x
    return gamma * out


def strip_boundaries(x, mask):
    """Row by row: drop <S> (position 0) and </S> (position n + 1); padding stays zero."""
    B, T2 = mask.shape
    out = x.new_zeros(B, T2 - 2, x.shape[-1])
    new_mask = torch.zeros(B, T2 - 2, dtype=torch.bool)
    for i in range(B):
        n = int(mask[i].sum()) - 2
        out[i, :n] = x[i, 1 : n + 1]
        new_mask[i, :n] = True
    return out, new_mask


def set_mix(elmo, k, w, gamma):
    mix = getattr(elmo, f"scalar_mix_{k}")
    with torch.no_grad():
        for p, v in zip(mix.scalar_parameters, w):
            p.fill_(v)
        mix.gamma.fill_(gamma)


SMALL_SENTENCES = _sentences(np.random.default_rng(3), 6, 1, 14)
SMALL_SENTENCES[1] = ["one"]
SMALL_SENTENCES[3] = []  # an empty sentence: boundaries only


@pytest.fixture(scope="module")
def small_clips(random_models):
    """The random `small` model with the clips exercised, and its reference activations on SMALL_SENTENCES."""
    files = random_models("small", exercise_clips=True)
    ids = batch_to_ids(SMALL_SENTENCES)
    with torch.no_grad():
        layers, mask, _, _ = bilm_ref(ids, load_weights(files[1], load_options(files[0])))
    return files, ids, layers, mask


MIXES = [([0.3, -1.2, 0.9], 0.7), ([-0.5, 0.4, 1.1], 1.6)]


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.slow
def test_small_with_clips_two_representations(small_clips, layer_norm, keep):
    files, ids, layers, mask = small_clips
    backend = "fast" if HAS_FAST else "reference"
    elmo = Elmo(*files, 2, do_layer_norm=layer_norm, dropout=0.0, keep_sentence_boundaries=keep, backend=backend).eval()
    for k, (w, g) in enumerate(MIXES):
        set_mix(elmo, k, w, g)
    with torch.no_grad():
        out = elmo(ids)
    assert len(out["elmo_representations"]) == 2
    for (w, g), got in zip(MIXES, out["elmo_representations"]):
        want = mix_by_hand(layers, mask, w, g, layer_norm)
        want_mask = mask
        if not keep:
            want, want_mask = strip_boundaries(want, mask)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert max_abs_error(got, want) <= FP32, f"max abs error {max_abs_error(got, want):.3g}"
        assert torch.equal(out["mask"], want_mask)
    if not keep:
        assert out["mask"].sum(dim=1).tolist() == [len(s) for s in SMALL_SENTENCES]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_fixed_scalar_mix_parameters(small_clips, backend):
    files, ids, layers, mask = small_clips
    w = [-9e10, 1.0, -9e10]  # allennlp's example: layer 1 alone
    elmo = Elmo(*files, 1, scalar_mix_parameters=w, dropout=0.0, backend=backend)
    assert not any(p.requires_grad for p in elmo.parameters())
    with torch.no_grad():
        got = elmo(ids)["elmo_representations"][0]
    want, _ = strip_boundaries(layers[1], mask)
    assert max_abs_error(got, want) <= FP32
    assert max_abs_error(got, strip_boundaries(mix_by_hand(layers, mask, w, 1.0, False), mask)[0]) <= FP32


def test_default_mix_is_even_and_trainable(random_models):
    files = random_models("tiny")
    elmo = Elmo(*files, 3, dropout=0.0)
    for k in range(3):
        mix = getattr(elmo, f"scalar_mix_{k}")
        assert [p.item() for p in mix.scalar_parameters] == [0.0, 0.0, 0.0] and mix.gamma.item() == 1.0
        assert all(p.requires_grad for p in mix.parameters())
    # the biLM itself is frozen unless requires_grad=True
    assert not any(p.requires_grad for p in elmo._elmo_lstm.parameters())
    assert all(p.requires_grad for p in Elmo(*files, 1, requires_grad=True)._elmo_lstm.parameters())


def test_allennlp_state_dict_names(random_models):
    elmo = Elmo(*random_models("tiny"), 2)
    keys = set(elmo.state_dict())
    for k in range(2):
        assert {f"scalar_mix_{k}.gamma"} | {f"scalar_mix_{k}.scalar_parameters.{j}" for j in range(3)} <= keys
    assert all(k.startswith(("_elmo_lstm.", "scalar_mix_")) for k in keys)
    assert elmo.get_output_dim() == 32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_golden_bilm_tf_mixed_by_hand_stateful(bilm_tf_tiny, tiny_files, fixture_sentences, backend):
    """The fixture's layer 0 (token embeddings) and top layer (stateful lm_embeddings) mixed by hand;
    layer 1, which bilm-tf did not dump, gets weight exp(-9e10) = 0. Once from char ids, once from
    cached word ids alone."""
    import h5py

    expected_top = expected_top_layers(bilm_tf_tiny)
    words = (bilm_tf_tiny / "vocab_test.txt").read_text().strip().split("\n")
    with h5py.File(bilm_tf_tiny / "elmo_token_embeddings.hdf5", "r") as f:
        token_vectors = dict(zip(words, f["embedding"][...]))
    w, gamma = [0.4, -9e10, 1.3], 0.8
    s = torch.softmax(torch.tensor(w, dtype=torch.float64), 0).numpy()
    vocab = ["@@PADDING@@"] + words  # id 0 is padding, as in an allennlp Vocabulary
    for use_words in (False, True):
        elmo = Elmo(
            *tiny_files, 1, dropout=0.0, stateful=True, backend=backend, vocab_to_cache=vocab if use_words else None
        )
        set_mix(elmo, 0, w, gamma)
        worst = 0.0
        for i in range(10):
            batch = [fixture_sentences[k][i].split() for k in range(3)]
            with torch.no_grad():
                if use_words:
                    word_ids = torch.zeros(3, max(map(len, batch)), dtype=torch.long)
                    for r, sentence in enumerate(batch):
                        word_ids[r, : len(sentence)] = torch.tensor([vocab.index(t) for t in sentence])
                    out = elmo(None, word_ids)
                else:
                    out = elmo(batch_to_ids(batch))
            rep = out["elmo_representations"][0].numpy()
            for k, sentence in enumerate(batch):
                layer0 = np.stack([token_vectors[t] for t in sentence])
                want = gamma * (s[0] * np.concatenate([layer0, layer0], -1) + s[2] * expected_top[k][i])
                worst = max(worst, float(np.abs(rep[k, : len(sentence)] - want).max()))
                assert not rep[k, len(sentence) :].any()
        assert worst <= FP32, f"words={use_words}: max abs error {worst:.3g}"


# --- dropout, shapes, awkward batches --------------------------------------------------------------


@pytest.mark.slow
def test_dropout_train_and_eval(random_models):
    p = 0.3
    elmo = Elmo(*random_models("tiny", exercise_clips=True), 2, dropout=p)
    ids = batch_to_ids(_sentences(np.random.default_rng(4), 16, 5, 30))
    with torch.no_grad():
        clean = elmo.eval()(ids)["elmo_representations"]
        torch.manual_seed(0)
        noisy = elmo.train()(ids)["elmo_representations"]
    mask = elmo.eval()(ids)["mask"]
    for x, y in zip(clean, noisy):
        x, y = x[mask], y[mask]
        dropped = y == 0
        kept = ~dropped
        torch.testing.assert_close(y[kept], x[kept] / (1 - p), atol=1e-6, rtol=1e-6)
        n = x.numel()
        assert abs(dropped.float().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n), dropped.float().mean()
    assert not torch.equal(noisy[0] == 0, noisy[1] == 0)  # each representation draws its own mask
    with torch.no_grad():  # eval mode: dropout is the identity, whatever p
        again = elmo.eval()(ids)["elmo_representations"]
    for x, y in zip(clean, again):
        assert torch.equal(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.slow
def test_rank4_inputs_equal_the_flattened_batch(random_models, backend, keep):
    files = random_models("tiny", exercise_clips=True)
    vocab = ["@@PADDING@@"] + "the a cat sat on mat dog ran quickly home , . ! über 東京".split()
    elmo = Elmo(*files, 2, dropout=0.0, keep_sentence_boundaries=keep, backend=backend, vocab_to_cache=vocab)
    sentences = _sentences(np.random.default_rng(5), 6, 1, 9)
    sentences[4] = []
    ids = batch_to_ids(sentences)  # [6, T, 50] -> [2, 3, T, 50]
    T = ids.shape[1]
    word_ids = torch.tensor([[vocab.index(t) for t in s] + [0] * (T - len(s)) for s in sentences])
    with torch.no_grad():
        flat = elmo(ids)
        for args in [
            (ids.view(2, 3, T, 50),),
            (None, word_ids.view(2, 3, T)),
            (ids.view(2, 3, T, 50), word_ids.view(2, 3, T)),
            (ids.view(1, 2, 3, T, 50),),
        ]:
            out = elmo(*args)
            lead = (args[0] if args[0] is not None else args[1].unsqueeze(-1)).shape[:-2]
            T_out = T + 2 if keep else T
            assert out["mask"].shape == (*lead, T_out)
            assert torch.equal(out["mask"].reshape(6, T_out), flat["mask"])
            for x, y in zip(out["elmo_representations"], flat["elmo_representations"]):
                assert x.shape == (*lead, T_out, 32)
                assert max_abs_error(x.reshape(6, T_out, 32), y) <= FP32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("keep", [False, True])
def test_awkward_batches(random_models, backend, keep):
    """One token, all-empty sentences, and an empty batch (allennlp raises on B = 0; we return empty outputs)."""
    files = random_models("tiny", exercise_clips=True)
    w = load_weights(files[1], load_options(files[0]))
    elmo = Elmo(*files, 1, do_layer_norm=True, dropout=0.0, keep_sentence_boundaries=keep, backend=backend)
    for batch in ([["x"]], [["x"], ["y"], ["z"]], [[], []], [["ab"], []]):
        ids = batch_to_ids(batch)
        with torch.no_grad():
            out = elmo(ids)
            layers, mask, _, _ = bilm_ref(ids, w)
        want = mix_by_hand(layers, mask, [0.0, 0.0, 0.0], 1.0, True)
        want_mask = mask
        if not keep:
            want, want_mask = strip_boundaries(want, mask)
        assert torch.equal(out["mask"], want_mask)
        assert max_abs_error(out["elmo_representations"][0], want) <= FP32, batch
    for T in (0, 4):
        with torch.no_grad():
            out = elmo(torch.zeros(0, T, 50, dtype=torch.long))
        T_out = T + 2 if keep else T
        assert out["elmo_representations"][0].shape == (0, T_out, 32) and out["mask"].shape == (0, T_out)
        with torch.no_grad():
            out = elmo(torch.zeros(2, 0, T, 50, dtype=torch.long))
        assert out["elmo_representations"][0].shape == (2, 0, T_out, 32) and out["mask"].shape == (2, 0, T_out)


# --- vocab_to_cache --------------------------------------------------------------------------------


VOCAB = ["@@PADDING@@", "@@UNKNOWN@@"] + "the a cat sat on mat dog ran quickly home , . ! über 東京".split()


def _word_ids(sentences, vocab=VOCAB):
    T = max((len(s) for s in sentences), default=0)
    return torch.tensor([[vocab.index(t) for t in s] + [0] * (T - len(s)) for s in sentences], dtype=torch.long)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vocab_cache_equals_char_path(random_models, backend):
    files = random_models("tiny", exercise_clips=True)
    elmo = Elmo(*files, 2, dropout=0.0, vocab_to_cache=VOCAB, backend=backend, do_layer_norm=True)
    plain = Elmo(*files, 2, dropout=0.0, backend=backend, do_layer_norm=True)
    sentences = _sentences(np.random.default_rng(6), 7, 1, 12)
    sentences[2] = ["über"]
    sentences[5] = []
    ids, word_ids = batch_to_ids(sentences), _word_ids(sentences)
    with torch.no_grad():
        want = plain(ids)
        for args in [(None, word_ids), (ids, word_ids), (ids,), (None, word_ids.int())]:
            out = elmo(*args)
            assert torch.equal(out["mask"], want["mask"])
            for x, y in zip(out["elmo_representations"], want["elmo_representations"]):
                assert max_abs_error(x, y) <= FP32, args
    if backend == "fast":
        assert elmo._elmo_lstm._derived.holds("vocab")  # the cache was used, not only the char path


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_vocab_cache_backs_off_to_chars_for_ids_outside(random_models, backend):
    files = random_models("tiny", exercise_clips=True)
    small_vocab = VOCAB[:6]  # "sat" and later words are outside
    elmo = Elmo(*files, 1, dropout=0.0, vocab_to_cache=small_vocab, backend=backend)
    plain = Elmo(*files, 1, dropout=0.0, backend=backend)
    sentences = [["the", "cat", "sat"], ["a"]]
    ids = batch_to_ids(sentences)
    word_ids = torch.tensor([[2, 4, len(small_vocab)], [3, 0, 0]])  # id 6: one past the vocabulary
    with torch.no_grad():
        want = plain(ids)["elmo_representations"][0]
        assert max_abs_error(elmo(ids, word_ids)["elmo_representations"][0], want) <= FP32
        assert max_abs_error(elmo(ids, torch.tensor([[2, 4, -1], [3, 0, 0]]))["elmo_representations"][0], want) <= FP32
        with pytest.raises(ElmoFastError, match=r"id 6, outside the cached vocabulary of 6 words; pass char_ids"):
            elmo(None, word_ids)


def test_vocab_cache_padding_and_misuse(random_models):
    files = random_models("tiny")
    elmo = Elmo(*files, 1, dropout=0.0, vocab_to_cache=VOCAB)
    with torch.no_grad():
        out = elmo(None, torch.tensor([[2, 3, 0, 0], [0, 0, 0, 0]]))
    assert out["mask"].tolist() == [[True, True, False, False], [False] * 4]
    assert not out["elmo_representations"][0][~out["mask"]].any()
    plain = Elmo(*files, 1, dropout=0.0)
    ids = batch_to_ids([["the", "cat"]])
    with pytest.warns(RuntimeWarning, match="without vocab_to_cache: they are ignored"):
        out = plain(ids, torch.tensor([[7, 7]]))
    assert torch.equal(out["elmo_representations"][0], plain(ids)["elmo_representations"][0])
    with pytest.raises(ElmoFastError, match="no vocab_to_cache"):
        plain(None, torch.tensor([[2, 3]]))
    with pytest.raises(ElmoFastError, match="must describe the same tokens"):
        elmo(ids, torch.tensor([[2, 3, 4]]))
    with pytest.raises(ElmoFastError, match="integer ids"):
        elmo(None, torch.tensor([[2.0, 3.0]]))
    with pytest.raises(ElmoFastError, match="list of words"):
        Elmo(*files, 1, vocab_to_cache="the cat")


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
def test_caches_follow_the_weights(random_models):
    """Fine-tuning changes the weights: the vocabulary table, the token cache and the bf16 copies
    must not serve vectors of the old weights."""
    files = random_models("tiny", exercise_clips=True)
    sentences = [["the", "cat", "sat"], ["a", "dog"]]
    ids, word_ids = batch_to_ids(sentences), _word_ids(sentences)
    elmo = Elmo(*files, 1, dropout=0.0, vocab_to_cache=VOCAB, backend="fast")
    bilm = elmo._elmo_lstm
    cached = ElmoBiLm(*files, backend="fast", token_cache_size=100)
    low = ElmoBiLm(*files, backend="fast", dtype=torch.bfloat16)
    with torch.no_grad():
        before = [
            elmo(None, word_ids)["elmo_representations"][0],
            cached(ids)["activations"][0],
            low(ids)["activations"][0],
        ]
        for m in (bilm, cached, low):  # an optimizer step on the highway, in place
            m.token_embedder.highways.layers[0].weight.mul_(1.5)
        after = [
            elmo(None, word_ids)["elmo_representations"][0],
            cached(ids)["activations"][0],
            low(ids)["activations"][0],
        ]
        want = [elmo(ids)["elmo_representations"][0], bilm_ref(ids, cached.weights())[0][0]]
    for x, y in zip(before, after):
        assert max_abs_error(x, y) > 1e-3  # the change is visible...
    assert max_abs_error(after[0], want[0]) <= FP32  # ...and equals the new weights' char path
    assert max_abs_error(after[1], want[1]) <= FP32
    assert max_abs_error(after[2], want[1]) <= MODEL_BF16["max_rel"] * want[1].abs().max()


# --- options: bf16, device, errors -----------------------------------------------------------------


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
def test_bf16_fast_path(random_models):
    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(_sentences(np.random.default_rng(7), 5, 1, 12))
    with torch.no_grad():
        want = Elmo(*files, 1, dropout=0.0)(ids)["elmo_representations"][0]
        got = Elmo(*files, 1, dropout=0.0, dtype=torch.bfloat16)(ids)["elmo_representations"][0]
    assert got.dtype == torch.float32
    err = max_abs_error(got, want)
    assert 0 < err <= MODEL_BF16["max_rel"] * want.abs().max()  # the stated bf16 bound


def test_device_argument(random_models):
    elmo = Elmo(*random_models("tiny"), 1, device="cpu")
    assert all(p.device.type == "cpu" for p in elmo.parameters())
    with pytest.raises(ElmoFastError, match="invalid device"):
        Elmo(*random_models("tiny"), 1, device="gpu0")


def test_errors(random_models):
    files = random_models("tiny")
    with pytest.raises(ElmoFastError, match="num_output_representations must be an integer >= 1"):
        Elmo(*files, 0)
    with pytest.raises(ElmoFastError, match="dropout must be in"):
        Elmo(*files, 1, dropout=1.5)
    with pytest.raises(ElmoFastError, match="scalar_mix_parameters has 2 weights, but this biLM has 3 layers"):
        Elmo(*files, 1, scalar_mix_parameters=[1.0, 2.0])
    elmo = Elmo(*files, 1)
    with pytest.raises(ElmoFastError, match="needs char_ids"):
        elmo()
    with pytest.raises(ElmoFastError, match=r"char_ids must have shape \[batch, \.\.\., tokens, 50\], got \[2, 50\]"):
        elmo(torch.zeros(2, 50, dtype=torch.long))
    with pytest.raises(ElmoFastError, match="got \\[1, 3, 49\\]"):
        elmo(torch.zeros(1, 3, 49, dtype=torch.long))
    assert isinstance(ElmoFastError("x"), ValueError)
