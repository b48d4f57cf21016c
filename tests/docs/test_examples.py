"""examples/: the tagger on top of Elmo trains (frozen and fine-tuned biLM), runs as a script, compiles."""

import importlib.util

import pytest
import torch
from repo_paths import REPO
from tolerances import TOL, max_abs_error

from elmo_fast.bilm import ops

HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def tagger_module():
    spec = importlib.util.spec_from_file_location("elmo_fast_example_tagger", EXAMPLES / "tagger.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mean(xs):
    return sum(xs) / len(xs)


def test_corpus_is_tagged_consistently(tagger_module):
    sentences, tags = tagger_module.make_corpus(50, seed=3)
    assert len(sentences) == len(tags) == 50
    for s, t in zip(sentences, tags):
        assert len(s) == len(t) and tagger_module.TAGS[t[-1]] == "PUNCT" and tagger_module.TAGS[t[0]] == "DET"
    # the ambiguous words really are both nouns and verbs: context decides
    seen = {
        (w, tagger_module.TAGS[x])
        for s, t in zip(sentences, tags)
        for w, x in zip(s, t)
        if w in tagger_module.AMBIGUOUS
    }
    assert any(w for w, tag in seen if tag == "NOUN") and any(w for w, tag in seen if tag == "VERB")


@pytest.mark.slow
def test_frozen_elmo_tagger_loss_goes_down(tagger_module, random_models):
    torch.manual_seed(0)
    tagger = tagger_module.Tagger(*map(str, random_models("tiny", exercise_clips=True)))
    bilm_before = [p.detach().clone() for p in tagger.elmo._elmo_lstm.parameters()]
    mix_before = [p.detach().clone() for p in tagger.elmo.scalar_mix_0.parameters()]
    sentences, tags = tagger_module.make_corpus(96, seed=1)
    losses = tagger_module.train(tagger, sentences, tags, steps=24, batch_size=16, lr=1e-2)
    assert _mean(losses[-6:]) < 0.8 * _mean(losses[:6]), losses
    # the scalar mix trained; the frozen biLM did not move
    assert any(not torch.equal(a, b) for a, b in zip(mix_before, tagger.elmo.scalar_mix_0.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(bilm_before, tagger.elmo._elmo_lstm.parameters()))


@pytest.mark.slow
def test_fine_tuned_elmo_tagger_loss_goes_down(tagger_module, random_models):
    torch.manual_seed(0)
    tagger = tagger_module.Tagger(*map(str, random_models("tiny", exercise_clips=True)), fine_tune=True)
    bilm_before = [p.detach().clone() for p in tagger.elmo._elmo_lstm.parameters()]
    sentences, tags = tagger_module.make_corpus(64, seed=2)
    losses = tagger_module.train(tagger, sentences, tags, steps=12, batch_size=16, lr=1e-2)
    assert _mean(losses[-3:]) < 0.8 * _mean(losses[:3]), losses
    assert all(not torch.equal(a, b) for a, b in zip(bilm_before, tagger.elmo._elmo_lstm.parameters()))


def test_script_prints_loss_per_epoch(tagger_module, capsys):
    assert tagger_module.main(["--sentences", "32", "--epochs", "2", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "epoch 1: loss" in out and "epoch 2: loss" in out and "held-out accuracy" in out


@pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built")
@pytest.mark.slow
def test_compiled_tagger_equals_eager_in_inference(tagger_module, random_models):
    tagger = tagger_module.Tagger(*map(str, random_models("tiny", exercise_clips=True)), backend="fast").eval()
    sentences, _ = tagger_module.make_corpus(6, seed=4)
    sentences[2] = ["Anna"]
    ids = tagger_module.batch_to_ids(sentences)
    with torch.no_grad():
        eager, eager_mask = tagger(ids)
    torch._dynamo.reset()
    compiled = torch.compile(tagger)
    with torch.no_grad():
        got, mask = compiled(ids)
        again, _ = compiled(tagger_module.batch_to_ids(sentences[:3]))  # another shape
        want, _ = tagger(tagger_module.batch_to_ids(sentences[:3]))
    assert torch.equal(mask, eager_mask)
    assert max_abs_error(got, eager) <= TOL[torch.float32]["atol"]
    assert max_abs_error(again, want) <= TOL[torch.float32]["atol"]
