"""flair 0.15.1's ``ELMoEmbeddings``, unchanged, on elmo-fast (``import elmo_fast.as_allennlp``): its vectors
equal flair's on allennlp 0.9.0 itself (tests/support/allennlp09_peer.py), a tagger over it trains, is saved with
flair's ``save`` and loads with flair's ``load`` in a fresh process; and a flair model saved before flair
0.12 with allennlp 0.9 (its ElmoEmbedder pickled whole) loads and predicts what it predicted there.

flair runs in child processes (the import path is per process); it is installed by
tests/install_peers.sh, and the tests skip, saying so, without it."""

from __future__ import annotations

import json
import sys

import cli_process
import numpy as np
import pytest
from peers import PEERS
from repo_paths import SUPPORT
from shim_runs import child_env, last_json, require, require_no_real_allennlp, run_python

pytestmark = pytest.mark.peers  # flair on elmo-fast's allennlp import path, against allennlp 0.9
TOL = 1e-5
_FLAIR_MODULES = "flair,flair.data,flair.embeddings,flair.models"


def run_forked(code: str, **kwargs):
    """A child forked from an interpreter of this run that imported torch and flair (tests/support/cli_process.py):
    what these tests check is flair's behaviour on elmo-fast, not which modules a fresh interpreter starts with
    (tests/compat/test_as_allennlp.py's); flair's import, ~7 s after torch's, is paid once instead of per child.
    flair reads allennlp only when an ELMoEmbeddings is made, after the child's ``import elmo_fast.as_allennlp``."""
    env = kwargs.pop("env", None) or child_env()
    return run_python(code, fresh=False, env={**env, "ELMO_FAST_TEST_PREIMPORT": _FLAIR_MODULES}, **kwargs)


SENTENCES = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["Dogs", "bark"],
    ["a"],
    ["Zürich", "'s", "lake", "is", "cold", ",", "isn't", "it", "?"],
]


@pytest.fixture(scope="module", autouse=True)
def flair_on_elmo_fast():
    require_no_real_allennlp()
    require("flair", "bash tests/install_peers.sh (pip install flair==0.15.1)")


def _peer(tmp_path, job: dict) -> dict:
    if not (PEERS / "allennlp-0.9" / "allennlp").is_dir():
        pytest.skip("allennlp 0.9 is not in .peers/allennlp-0.9: bash tests/install_peers.sh")
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = cli_process.run(
        [sys.executable, str(SUPPORT / "allennlp09_peer.py"), str(tmp_path / "job.json"), str(tmp_path / "peer.npz")],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(tmp_path / "peer.npz"))


@pytest.mark.slow
def test_elmo_embeddings_give_flair_on_allennlp_09s_vectors(tmp_path, random_models):
    """All three modes, each a new ELMoEmbeddings (its constructor's dummy sentence included), the sentences
    embedded as one call: the same token vectors as flair gives on allennlp 0.9."""
    options, weights = random_models("small", exercise_clips=True)
    steps = [["flair", mode, SENTENCES] for mode in ("all", "top", "average")]
    theirs = _peer(tmp_path, {"options": str(options), "weights": str(weights), "steps": steps})
    out = tmp_path / "ours.npz"
    run_forked(f"""
        import elmo_fast.as_allennlp
        import numpy as np, torch
        from flair.data import Sentence
        from flair.embeddings import ELMoEmbeddings
        arrays = {{}}
        for i, mode in enumerate(("all", "top", "average")):
            e = ELMoEmbeddings(options_file={str(options)!r}, weight_file={str(weights)!r}, embedding_mode=mode)
            assert e.name == f"elmo-original-{{mode}}" and e.embedding_length == (768 if mode == "all" else 256)
            sentences = [Sentence(tokens) for tokens in {SENTENCES!r}]
            e.embed(sentences)
            for k, s in enumerate(sentences):
                arrays[f"s{{i}}_{{k}}"] = torch.stack([t.get_embedding() for t in s]).numpy()
        np.savez({str(out)!r}, **arrays)
    """)
    ours = dict(np.load(out))
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        assert ours[key].shape == theirs[key].shape and np.abs(ours[key] - theirs[key]).max() <= TOL, key


_TAGGED = [
    ("The cat sat on the mat .", "D N V P D N X"),
    ("Dogs bark loudly .", "N V R X"),
    ("A dog sat .", "D N V X"),
    ("The mat is red .", "D N V J X"),
    ("Cats sleep .", "N V X"),
    ("The red dog barks .", "D J N V X"),
]


@pytest.mark.slow
def test_a_tagger_over_elmo_trains_saves_and_loads_in_a_fresh_process(tmp_path, random_models):
    """A SequenceTagger over StackedEmbeddings([ELMoEmbeddings, OneHotEmbeddings]) trains for a few steps, is
    saved with flair's save, loads with flair's load in a fresh process and predicts the same tags, with the
    same scores, as the saving process right after the save (the embedder's LSTM states travel with it)."""
    options, weights = random_models("small")
    model = tmp_path / "tagger.pt"
    train = f"""
        import elmo_fast.as_allennlp
        import json, flair, torch
        from flair.data import Dictionary, Sentence
        from flair.embeddings import ELMoEmbeddings, OneHotEmbeddings, StackedEmbeddings
        from flair.models import SequenceTagger
        from flair.training_utils import store_embeddings
        flair.set_seed(7)
        data = {_TAGGED!r}
        sentences = []
        for text, tags in data:
            s = Sentence(text.split())
            for token, tag in zip(s, tags.split()):
                token.add_label("pos", tag)
            sentences.append(s)
        words, tags = Dictionary(), Dictionary(add_unk=False)
        for s in sentences:
            for t in s:
                words.add_item(t.text)
                tags.add_item(t.get_label("pos").value)
        elmo = ELMoEmbeddings(options_file={str(options)!r}, weight_file={str(weights)!r}, embedding_mode="top")
        stack = StackedEmbeddings([elmo, OneHotEmbeddings(vocab_dictionary=words, embedding_length=8)])
        tagger = SequenceTagger(hidden_size=32, embeddings=stack, tag_dictionary=tags, tag_type="pos", use_crf=False)
        optimizer = torch.optim.Adam(tagger.parameters(), lr=0.02)
        losses = []
        for step in range(30):
            tagger.train()
            optimizer.zero_grad()
            loss, count = tagger.forward_loss(sentences)
            (loss / count).backward()
            optimizer.step()
            losses.append(float(loss) / count)
            store_embeddings(sentences, "cpu")  # as flair's trainer: static vectors kept, the others dropped
        tagger.save({str(model)!r})
        tagger.eval()
        test = [Sentence(text.split()) for text, _ in data]
        tagger.predict(test)
        print(json.dumps([losses[0], losses[-1], [[t.get_label("pos").value for t in s] for s in test],
                          [[t.get_label("pos").score for t in s] for s in test]]))
    """
    first, last, predicted, scores = last_json(run_forked(train))
    assert last < 0.9 * first  # it trained: the loss went down
    load = f"""
        import elmo_fast.as_allennlp
        import json
        from flair.data import Sentence
        from flair.models import SequenceTagger
        tagger = SequenceTagger.load({str(model)!r})
        test = [Sentence(text.split()) for text, _ in {_TAGGED!r}]
        tagger.predict(test)
        print(json.dumps([str(tagger.embeddings), [[t.get_label("pos").value for t in s] for s in test],
                          [[t.get_label("pos").score for t in s] for s in test]]))
    """
    names, reloaded, reloaded_scores = last_json(run_forked(load))
    assert "elmo-original-top" in names
    assert reloaded == predicted
    assert np.abs(np.concatenate(reloaded_scores) - np.concatenate(scores)).max() <= 1e-5


@pytest.mark.slow
def test_a_flair_model_saved_with_allennlp_09_loads_and_predicts_as_there(tmp_path, random_models):
    """flair up to 0.11 pickled a model's embeddings whole: an ELMoEmbeddings holding allennlp 0.9's
    ElmoEmbedder (its weights and carried states). flair 0.15.1's load on elmo-fast unpickles it into
    elmo-fast's (flair's __setstate__ moving it to flair's device) and predicts what it predicted there."""
    options, weights = random_models("small", exercise_clips=True)
    path = tmp_path / "legacy.pt"
    test = [s for s in SENTENCES]
    theirs = _peer(
        tmp_path,
        {"options": str(options), "weights": str(weights), "steps": [["flair_legacy", str(path), test, "pos"]]},
    )
    tags, scores = last_json(
        run_forked(f"""
        import elmo_fast.as_allennlp
        import json
        from flair.data import Sentence
        from flair.models import SequenceTagger
        tagger = SequenceTagger.load({str(path)!r})
        ee = tagger.embeddings.ee
        assert type(ee).__module__ == "elmo_fast.compat.allennlp09.commands_elmo", type(ee)
        batch = [Sentence(tokens) for tokens in {test!r}]
        tagger.predict(batch, mini_batch_size=len(batch))
        labels = [t.get_label("pos") for s in batch for t in s]
        print(json.dumps([[l.value for l in labels], [l.score for l in labels]]))
    """)
    )
    assert tags == theirs["s0_tags"].tolist()
    assert np.abs(np.array(scores) - theirs["s0_scores"]).max() <= TOL


_PROBE = [["The", "cat", "sat", "on", "the", "mat", "."], ["Dogs", "bark"]]


def _embed_probe(model_path: str, load: bool, before: list | None = None, files: tuple = ()) -> str:
    """Child code: (load the tagger at ``model_path``, or build one over ELMoEmbeddings, embed ``before`` in
    batches of growing and shrinking size, and save it there), then embed _PROBE at once and print its
    token vectors (and the largest batch the embedder's states cover)."""
    head = (
        f"""
        tagger = SequenceTagger.load({model_path!r})
        elmo = tagger.embeddings
        """
        if load
        else f"""
        elmo = ELMoEmbeddings(options_file={files[0]!r}, weight_file={files[1]!r}, embedding_mode="all")
        tags = Dictionary(add_unk=False)
        for tag in ("A", "B"):
            tags.add_item(tag)
        tagger = SequenceTagger(hidden_size=8, embeddings=elmo, tag_dictionary=tags, tag_type="pos", use_crf=False)
        for batch in {before!r}:
            elmo.embed([Sentence(tokens) for tokens in batch])
        tagger.save({model_path!r})
        """
    )
    return (
        """
        import elmo_fast.as_allennlp
        import json, torch
        from flair.data import Dictionary, Sentence
        from flair.embeddings import ELMoEmbeddings
        from flair.models import SequenceTagger
        """
        + head
        + f"""
        probe = [Sentence(tokens) for tokens in {_PROBE!r}]
        elmo.embed(probe)
        rows = elmo.ee.elmo_bilm.get_states()[0].shape[1]
        print(json.dumps([rows, [torch.stack([t.get_embedding() for t in s]).tolist() for s in probe]]))
        """
    )


@pytest.fixture(scope="module")
def fresh_probe(tmp_path_factory, tiny_files):
    """A fresh tagger's probe vectors (the states its constructor's dummy sentence leaves), computed once."""
    options, weights = map(str, tiny_files)
    model = tmp_path_factory.mktemp("flair_fresh") / "fresh.pt"
    return last_json(run_forked(_embed_probe(str(model), load=False, before=[], files=(options, weights))))


@pytest.fixture(scope="module")
def saved_tagger(tmp_path_factory, tiny_files):
    """(path, rows of states, probe vectors): a tagger that embedded batches of 4, 2 and 1 sentences, then
    was saved, then embedded the probe in the same process."""
    options, weights = map(str, tiny_files)
    model = tmp_path_factory.mktemp("flair_saved") / "tagger.pt"
    before = [SENTENCES, SENTENCES[:2], [["Zürich", "is", "cold"]]]  # 4 rows of states, then fewer in use
    rows, vectors = last_json(run_forked(_embed_probe(str(model), load=False, before=before, files=(options, weights))))
    return model, rows, vectors


@pytest.mark.slow
def test_a_saved_elmo_model_continues_where_it_was_saved(saved_tagger, fresh_probe):
    """flair's pickles before 0.12 held allennlp 0.9's ElmoEmbedder whole, its LSTM states included, so a
    loaded model went on from where it was saved. The same now: ``to_params`` carries the states (for every
    batch row seen) and ``from_params`` puts them back after flair's dummy sentence, so the same call right
    after ``save`` and right after ``load`` in a fresh process gives the same vectors (a fresh embedder's
    states differ from the saved ones by up to 0.19 on this model)."""
    model, saved_rows, saved = saved_tagger
    loaded_rows, loaded = last_json(run_forked(_embed_probe(str(model), load=True)))
    assert saved_rows == loaded_rows == len(SENTENCES)
    for a, b in zip(saved, loaded):
        assert np.abs(np.array(a) - np.array(b)).max() <= 1e-6
    # what a loaded model gave before the states were saved (a fresh embedder's): the vectors differ
    fresh_rows, fresh = fresh_probe
    assert fresh_rows == len(_PROBE)
    assert max(np.abs(np.array(a) - np.array(b)).max() for a, b in zip(saved, fresh)) > 1e-3


@pytest.mark.slow
def test_a_model_saved_without_states_loads_as_before(tmp_path, tiny_files, saved_tagger, fresh_probe):
    """Parameters saved by an earlier elmo-fast hold no LSTM states: such a model loads, its embedder as a
    fresh one (the states its constructor's dummy sentence leaves); states that do not fit the model are a
    one-line error naming the model."""
    import torch

    options = str(tiny_files[0])
    _, fresh = fresh_probe
    state = torch.load(saved_tagger[0], weights_only=False)
    assert set(state["embeddings"]["lstm_states"]) == {"h", "c"}
    old, bad = dict(state), dict(state)
    old["embeddings"] = {k: v for k, v in state["embeddings"].items() if k != "lstm_states"}
    bad["embeddings"] = {**state["embeddings"], "lstm_states": {"h": torch.zeros(1, 2, 3), "c": torch.zeros(1, 2, 3)}}
    torch.save(old, tmp_path / "old.pt")
    torch.save(bad, tmp_path / "bad.pt")
    _, loaded = last_json(run_forked(_embed_probe(str(tmp_path / "old.pt"), load=True)))
    for a, b in zip(fresh, loaded):
        assert np.abs(np.array(a) - np.array(b)).max() <= 1e-6
    proc = run_forked(_embed_probe(str(tmp_path / "bad.pt"), load=True), check=False)
    assert proc.returncode != 0
    assert "LSTM states do not fit the model it names" in proc.stderr and options in proc.stderr
