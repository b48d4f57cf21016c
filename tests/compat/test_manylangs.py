"""ELMoForManyLangs models on elmo-fast, against ELMoForManyLangs itself (``elmoformanylangs``, run on
the CPU): its input pipeline id for id, and ``sents2elmo`` for every ``output_layer`` within 1e-5,
on both backends, for random-weight model directories of every variant (manylangs_models.VARIANTS).

ELMoForManyLangs carries LSTM states from batch to batch in an order it shuffles at random, so it
is run one sentence per batch with its encoder's stateful flag off: every sentence from a zero
state, which is what elmo-fast computes (and what makes its vectors reproducible). One test checks
that this equals resetting its states before each batch of one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from manylangs_models import VARIANTS, sentences, write_variant
from peers import manylangs, manylangs_embedder
from tolerances import MODEL_BF16, TOL, assert_close, assert_grad_close, max_abs_error

from elmo_fast import Elmo, ElmoBiLm, ElmoEmbedder
from elmo_fast.bilm import ops
from elmo_fast.bilm.stages import WordCharTokenEmbedder
from elmo_fast.bilm.word_char_ids import ManyLangsIds
from elmo_fast.formats.manylangs_dir import WORD_SPECIALS, load_manylangs, read_dictionary
from elmo_fast.manylangs import Embedder

needs_ext = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C is not built")
BACKENDS = [pytest.param("fast", marks=needs_ext), "reference"]
ATOL = TOL[torch.float32]["atol"]


@pytest.fixture(scope="module")
def variant_dirs(tmp_path_factory):
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = write_variant(name, tmp_path_factory.mktemp(name.replace(" ", "_").replace(",", "")))
        return cache[name]

    return get


def _words(model_dir) -> list[str]:
    path = model_dir / "word.dic"
    if not path.exists():
        return []
    return [w for w in read_dictionary(path) if w not in WORD_SPECIALS + ("<bos>", "<eos>")]


@pytest.fixture(scope="module")
def theirs(variant_dirs):
    """Per variant: the sentences, and ELMoForManyLangs' outputs for each output_layer, one sentence per
    batch from a fresh state."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            d = variant_dirs(name)
            sents = sentences(_words(d))
            ref = manylangs_embedder(d, batch_size=1)
            # one sentence per batch, each from a zero state: its _EncoderBase then ignores the states
            # it keeps (as reset_states() before each batch would)
            ref.model.encoder.stateful = False
            layers = VARIANTS[name]["config"].n_layers + 1
            outputs = {}
            for k in (-2, -1, *range(layers)):
                if k == -1:
                    # np.average over an empty sentence's (L + 1, 0, 2P) divides by zero there: it raises;
                    # elmo-fast gives the (0, 2P) mean of no tokens
                    full = [s for s in sents if s]
                    got = iter(ref.sents2elmo(full, output_layer=k))
                    empty = np.zeros((0, 2 * VARIANTS[name]["config"].projection_dim), np.float32)
                    outputs[k] = [next(got) if s else empty for s in sents]
                else:
                    outputs[k] = ref.sents2elmo(sents, output_layer=k)
            cache[name] = (sents, outputs)
        return cache[name]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.peers
def test_sents2elmo_equals_elmoformanylangs(variant, backend, variant_dirs, theirs):
    sents, expected = theirs(variant)
    ours = Embedder(variant_dirs(variant), backend=backend)
    for k, want in expected.items():
        got = ours.sents2elmo(sents, output_layer=k)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert isinstance(g, np.ndarray) and g.dtype == np.float32, (variant, k, i)
            assert g.shape == w.shape, f"{variant} output_layer={k} sentence {i}: shape {g.shape} != {w.shape}"
            err = float(np.abs(g - w).max()) if g.size else 0.0
            assert err <= ATOL, f"{variant} {backend} output_layer={k} sentence {i}: max abs error {err:.3e}"


@pytest.mark.slow
def test_the_variants_are_what_they_say(variant_dirs):
    """Clips that bite, word embeddings present or not, legacy pickles tagged cuda:0."""
    w = load_manylangs(variant_dirs("words+chars"))
    assert w.word_embedding is not None and w.char_embedding is not None
    assert load_manylangs(variant_dirs("chars only, cuda-tagged")).word_embedding is None
    assert load_manylangs(variant_dirs("words only")).char_embedding is None
    for variant, legacy in (("legacy pickles, cuda-tagged", True), ("chars only, cuda-tagged", False)):
        for name in ("token_embedder.pkl", "encoder.pkl"):
            raw = (variant_dirs(variant) / name).read_bytes()
            assert (raw[:2] != b"PK") == legacy, (variant, name)  # a zip archive, or torch's legacy pickle
            assert b"cuda:0" in raw, (variant, name)  # storages recorded as on cuda:0
    assert b"cuda:0" not in (variant_dirs("words+chars") / "encoder.pkl").read_bytes()
    # the projection clip bites: layer 1 (the first LSTM layer's h) reaches +-3 exactly
    bilm = ElmoBiLm(variant_dirs("words+chars"), backend="reference")
    sents = sentences(_words(variant_dirs("words+chars")))
    out = bilm(bilm.batch_to_ids(sents))
    assert bool((out["activations"][1].abs() == 3.0).any())
    # and so does the cell clip: without it the outputs move
    unclipped = ElmoBiLm.from_weights(
        dataclasses.replace(bilm.weights(), options=dataclasses.replace(bilm.options, cell_clip=None)),
        backend="reference",
    )
    assert max_abs_error(unclipped(bilm.batch_to_ids(sents))["activations"][2], out["activations"][2]) > 1e-3


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.peers
def test_ids_equal_create_one_batch(variant, variant_dirs):
    """The front end's rows are ELMoForManyLangs' read_list + create_one_batch, id for id (each + 1)."""
    manylangs()
    from elmoformanylangs.elmo import read_list
    from elmoformanylangs.frontend import create_one_batch

    d = variant_dirs(variant)
    ref = manylangs_embedder(d, batch_size=1)
    bilm = ElmoBiLm(d, backend="reference")
    fe = bilm.front_end
    assert isinstance(fe, ManyLangsIds)
    max_chars = ref.config["token_embedder"]["max_characters_per_token"]
    for s in sentences(_words(d)):
        data, _ = read_list([s], max_chars)
        w, c, lens, _ = create_one_batch(data, ref.word_lexicon, ref.char_lexicon, ref.config)
        theirs = [part[0] for part in (w, c) if part is not None]
        rows = torch.tensor([fe.bos, *(fe.token_ids(t) for t in s), fe.eos]) - 1
        if w is not None:
            assert torch.equal(rows[:, 0], theirs[0]), s
        if c is not None:
            assert torch.equal(rows[:, -max_chars:], theirs[-1]), s
        assert lens == [len(s) + 2]


@pytest.mark.parametrize("variant", ["words+chars", "20 chars, tanh, 3 layers"])
def test_stateless_whatever_the_batching(variant, variant_dirs):
    """A sentence's vectors do not depend on batch size, order or batch-mates (beyond fp32 rounding: the
    rows of a batch decide which of the calibrated kernels runs a GEMM, hence its summation order; the
    bound of batch invariance is the fp32 bar, as in tests/bilm/test_properties.py)."""
    d = variant_dirs(variant)
    sents = sentences(_words(d))
    one = Embedder(d, batch_size=1).sents2elmo(sents, output_layer=-2)
    many = Embedder(d, batch_size=64).sents2elmo(sents[::-1], output_layer=-2)[::-1]
    for a, b in zip(one, many):
        assert a.shape == b.shape and (a.size == 0 or np.abs(a - b).max() <= TOL[torch.float32]["atol"])


@pytest.mark.peers
def test_reset_before_each_batch_is_the_same_comparison(variant_dirs, theirs):
    sents, expected = theirs("words+chars")
    ref = manylangs_embedder(variant_dirs("words+chars"), batch_size=1)
    for i in (0, 3, 7):
        ref.model.encoder.reset_states()
        assert np.array_equal(ref.sents2elmo([sents[i]], output_layer=-2)[0], expected[-2][i])


@pytest.mark.peers
def test_elmoformanylangs_own_batches_carry_state(variant_dirs, theirs):
    """Why the comparison resets its states: ELMoForManyLangs run as users run it (batches of several
    sentences, states carried across them in a random order) gives other vectors."""
    sents, expected = theirs("words+chars")
    ref = manylangs_embedder(variant_dirs("words+chars"), batch_size=2)
    ref.sents2elmo(sents, output_layer=-2)  # a first call leaves states behind
    again = ref.sents2elmo(sents, output_layer=-2)
    assert max(float(np.abs(a - b).max()) for a, b in zip(again, expected[-2]) if a.size) > 1e-3


@pytest.mark.parametrize("variant", ["words+chars", "chars only, cuda-tagged", "words only"])
def test_stages_fast_equal_reference(variant, variant_dirs):
    if not ops.HAS_EXTENSION:
        pytest.skip("elmo_fast._C is not built")
    d = variant_dirs(variant)
    bilm = ElmoBiLm(d, backend="fast")
    emb = bilm.token_embedder
    assert isinstance(emb, WordCharTokenEmbedder)
    ids = bilm.batch_to_ids(sentences(_words(d))).flatten(0, 1)
    ids = torch.unique(ids, dim=0)
    with torch.no_grad():
        assert_close(emb.forward_fast(ids), emb.forward_reference(ids), torch.float32, what=f"{variant} tokens")
        sents = sentences(_words(d))
        fast = bilm(bilm.batch_to_ids(sents))["activations"]
        bilm.backend = "reference"
        ref = bilm(bilm.batch_to_ids(sents))["activations"]
    for k, (a, b) in enumerate(zip(fast, ref)):
        assert_close(a, b, torch.float32, what=f"{variant} layer {k}")


def test_output_layer_and_input_errors(variant_dirs):
    e = Embedder(variant_dirs("words+chars"))
    for bad in (3, -4, 1.0, True, "top"):
        with pytest.raises(ValueError, match="output_layer must be"):
            e.sents2elmo([["a"]], output_layer=bad)
    # -3 is layer 0 from the end, as numpy indexing gives ELMoForManyLangs
    assert np.array_equal(e.sents2elmo([["a", "b"]], output_layer=-3)[0], e.sents2elmo([["a", "b"]], output_layer=0)[0])
    with pytest.raises(ValueError, match="sents: expected a batch of sentences, .* found a str 'a b c'"):
        e.sents2elmo("a b c")
    with pytest.raises(ValueError, match=r"sents\[1\]: expected a sentence, a sequence of tokens, found a str 'b c'"):
        e.sents2elmo([["a"], "b c"])
    assert e.sents2elmo([]) == []
    assert e.sents2elmo([[]], output_layer=-1)[0].shape == (0, 32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_embedder_elmobilm_and_elmo_take_the_directory(backend, variant_dirs):
    """ElmoEmbedder, ElmoBiLm and Elmo take a model directory (first argument or model_dir=) and agree."""
    d = variant_dirs("words+chars")
    sents = sentences(_words(d))
    layers = Embedder(d, backend=backend).sents2elmo(sents, output_layer=-2)
    for embedder in (ElmoEmbedder(d, backend=backend), ElmoEmbedder(model_dir=d, backend=backend)):
        for got, want in zip(embedder.embed_batch(sents), layers):
            assert got.shape == want.shape and (got.size == 0 or np.abs(got - want).max() <= ATOL)
    assert ElmoEmbedder(d).model_files.keys() == {
        "config.json",
        "config_path",
        "char.dic",
        "word.dic",
        "token_embedder.pkl",
        "encoder.pkl",
    }
    bilm = ElmoBiLm(model_dir=d, backend=backend)
    assert bilm.token_width == 1 + 50 and bilm.num_layers == 3 and bilm.get_output_dim() == 32
    elmo = Elmo(d, num_output_representations=2, dropout=0.0, backend=backend, scalar_mix_parameters=[0.0, 1.0, -1.0])
    out = elmo(elmo.batch_to_ids(sents))
    w = torch.softmax(torch.tensor([0.0, 1.0, -1.0]), 0)
    for i, want in enumerate(layers):
        mixed = np.einsum("k,ktd->td", w.numpy(), want)
        n = want.shape[1]
        assert out["mask"][i].sum() == n
        assert np.abs(out["elmo_representations"][1][i, :n].detach().numpy() - mixed).max(initial=0.0) <= 1e-5


def test_downstream_training_on_a_manylangs_biLM(variant_dirs):
    """A few optimizer steps of scalar mixes and a probe on top of a frozen ELMoForManyLangs biLM (the
    fast path, which gives the biLM no gradient): the loss falls, the mixes move, the biLM does not."""
    d = variant_dirs("words+chars")
    sents = sentences(_words(d))
    torch.manual_seed(0)
    elmo = Elmo(model_dir=d, num_output_representations=1, dropout=0.0)
    probe = torch.nn.Linear(elmo.get_output_dim(), 1)
    ids = elmo.batch_to_ids(sents)
    target = torch.randn(ids.shape[:2])
    bilm_before = {k: v.clone() for k, v in elmo._elmo_lstm.state_dict().items()}
    mix_before = [p.detach().clone() for p in elmo.scalar_mix_0.parameters()]
    trainable = [p for p in [*elmo.parameters(), *probe.parameters()] if p.requires_grad]
    assert not any(p.requires_grad for p in elmo._elmo_lstm.parameters())
    opt = torch.optim.Adam(trainable, lr=0.05)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        out = elmo(ids)
        mask = out["mask"].float()
        loss = ((probe(out["elmo_representations"][0]).squeeze(-1) - target).square() * mask).sum() / mask.sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert any(not torch.equal(a, b) for a, b in zip(mix_before, elmo.scalar_mix_0.parameters()))
    assert all(torch.equal(v, elmo._elmo_lstm.state_dict()[k]) for k, v in bilm_before.items())


@pytest.mark.parametrize("variant", ["words+chars", "words only"])
@pytest.mark.slow
def test_fine_tuning_a_manylangs_biLM(variant, variant_dirs):
    """The biLM itself fine-tunes (train mode, requires_grad=True), its word embedding included: the
    fast backward ops where built give the reference stages' gradients under autograd."""
    d = variant_dirs(variant)
    sents = sentences(_words(d))
    grads = {}
    for backend in ("fast", "reference") if ops.HAS_BACKWARD else ("reference",):
        tuned = Elmo(
            model_dir=d,
            num_output_representations=1,
            dropout=0.0,
            requires_grad=True,
            backend=backend,
            scalar_mix_parameters=[0.0, 1.0, -1.0],
        )
        tuned.train()
        ids = tuned.batch_to_ids(sents)
        rep = tuned(ids)["elmo_representations"][0]
        rep.square().sum().backward()
        emb = tuned._elmo_lstm.token_embedder
        assert emb.word_embedding.grad is not None and emb.word_embedding.grad.abs().sum() > 0
        if emb.char_cnn is not None:
            assert emb.char_cnn.char_embedding.grad.abs().sum() > 0
        grads[backend] = {n: p.grad.clone() for n, p in tuned._elmo_lstm.named_parameters()}
        with torch.no_grad():
            tuned.eval()
            assert_close(
                tuned(ids)["elmo_representations"][0], rep.detach(), torch.float32, what=f"{backend} train vs eval"
            )
    if "fast" in grads:
        for name, g in grads["fast"].items():
            assert_grad_close(g, grads["reference"][name], what=f"{variant} {name}, fast vs reference")


@pytest.mark.peers
def test_save_writes_an_elmoformanylangs_directory(variant_dirs, tmp_path):
    """A (fine-tuned) ELMoForManyLangs biLM saves in its own layout, which both libraries load back."""
    d = variant_dirs("words+chars")
    sents = sentences(_words(d))
    bilm = ElmoBiLm(d)
    with torch.no_grad():
        bilm.encoder.forward_layers[0].state_projection.weight.mul_(0.5)  # a change to find again
    files = bilm.save(tmp_path / "tuned")
    assert [p.rsplit("/", 1)[-1] for p in files] == ["config.json", "encoder.pkl"]
    saved = Embedder(tmp_path / "tuned").sents2elmo(sents, output_layer=-2)
    with torch.no_grad():
        direct = [bilm.embed(bilm.batch_to_ids([s]))[0][0].numpy() for s in sents if s]
    for got, exp in zip([x for x in saved if x.size], direct):
        assert np.abs(got - exp).max() <= 1e-5
    theirs = manylangs_embedder(tmp_path / "tuned", batch_size=1)
    theirs.model.encoder.stateful = False
    for got, exp in zip(theirs.sents2elmo([s for s in sents if s], output_layer=-2), direct):
        assert np.abs(got - exp).max() <= ATOL


def test_ids_of_another_front_end_are_refused(variant_dirs):
    from elmo_fast import batch_to_ids

    bilm = ElmoBiLm(variant_dirs("words+chars"))
    with pytest.raises(ValueError, match=r"\[batch, tokens, 51\] \(this model's own ids: model.batch_to_ids"):
        bilm(batch_to_ids([["a", "b"]]))
    elmo = Elmo(variant_dirs("words+chars"), num_output_representations=1)
    with pytest.raises(ValueError, match=r"elmo.batch_to_ids"):
        elmo(batch_to_ids([["a", "b"]]))
    with pytest.raises(ValueError, match="num_output_representations by keyword"):
        Elmo(variant_dirs("words+chars"), 2)


def test_token_cache_and_vocab_cache(variant_dirs):
    """Distinct-token dedup and the token cache over rows [word id, char ids...] (word ids past int16),
    and vocab_to_cache, give the same vectors as the plain char path."""
    d = variant_dirs("words+chars")
    sents = sentences(_words(d))
    plain = ElmoBiLm(d)
    cached = ElmoBiLm(d, token_cache_size=10_000)
    assert cached._key_dtype == torch.int16  # a small model's ids fit
    ids = plain.batch_to_ids(sents)
    with torch.no_grad():
        want = plain(ids)["activations"]
        for _ in range(2):
            got = cached(ids)["activations"]
            for a, b in zip(got, want):
                assert_close(a, b, torch.float32)
    if ops.HAS_EXTENSION:
        assert cached.token_cache.hits > 0
    vocab = ["<padding>", *sorted({t for s in sents for t in s})]
    index = {t: i for i, t in enumerate(vocab)}
    with_vocab = ElmoBiLm(d, vocab_to_cache=vocab)
    word_inputs = torch.zeros(ids.shape[:2], dtype=torch.long)
    for i, s in enumerate(sents):
        word_inputs[i, : len(s)] = torch.tensor([index[t] for t in s], dtype=torch.long)
    with torch.no_grad():
        got = with_vocab(None, word_inputs)["activations"]
    for a, b in zip(got, want):
        assert_close(a, b, torch.float32)
    big = ManyLangsIds(
        {"<bos>": 0, "<eos>": 1, "<oov>": 2, "<pad>": 3, "<bow>": 4, "<eow>": 5},
        {"<oov>": 0, "<pad>": 1, "w": 70_000},
        50,
    )
    assert big.max_id == 70_001


@needs_ext
def test_bf16(variant_dirs):
    d = variant_dirs("words+chars")
    sents = sentences(_words(d))
    ref = Embedder(d).sents2elmo(sents, output_layer=-2)
    low = Embedder(d, dtype=torch.bfloat16).sents2elmo(sents, output_layer=-2)
    a = np.concatenate([x for x in low if x.size], axis=1)
    b = np.concatenate([x for x in ref if x.size], axis=1)
    for k in range(a.shape[0]):
        err = np.abs(a[k] - b[k])
        assert err.max() <= MODEL_BF16["max_rel"] * np.abs(b[k]).max()
        assert np.sqrt((err**2).mean()) <= MODEL_BF16["rms_rel"] * np.sqrt((b[k] ** 2).mean()) + 1e-6
