"""``elmo_fast.simple_elmo.ElmoModel`` against simple_elmo 0.9.2 on TensorFlow 2.21.

The comparison CI runs needs no TensorFlow: simple_elmo's outputs for every case of
simple_elmo_models.CASES (batch sizes smaller than the number of texts, warm-up on and off, every
``layers``, texts of length 0, 1 and 12 in one batch, ``limit``, a zip, vocab.txt.gz, no
vocabulary, a vocabulary without its specials on top, sentence averages, an all-empty batch,
substitutes) were recorded once by tests/fixtures/recorders/record_simple_elmo.py into
tests/fixtures/simple_elmo_0.9.2.npz, with the digests of the random-weight archives they were run
on; the archives are rebuilt here, checked against those digests, and embedded. A live comparison
on fresh weights runs when simple_elmo's side environment is there. Then the quirks one by one,
their clean alternatives, the NLPL format's corners, errors, and bilm-tf's own tiny biLM.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from simple_elmo_models import (
    CASES,
    FIXTURE,
    KINDS,
    PEER_PYTHON,
    TEXTS,
    WORDS,
    call_arguments,
    run_peer,
    weights_digest,
    write_archive,
)
from tolerances import TOL

from elmo_fast import ElmoBiLm
from elmo_fast.errors import ElmoFastError, InputError, ModelFileError
from elmo_fast.simple_elmo import Batcher, ElmoModel, SimpleElmoExit, UnicodeCharsVocabulary, Vocabulary, open_nlpl

ATOL = TOL[torch.float32]["atol"]


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """The recorded archives, by kind, built on first use."""
    cache: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = write_archive(kind, tmp_path_factory.mktemp(kind))
        return cache[kind]

    return get


@pytest.fixture(scope="module")
def recorded():
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def _load(path, load: dict, backend: str = "auto") -> ElmoModel:
    model = ElmoModel()
    assert model.load(path, backend=backend, **load) == "The model is now loaded."
    return model


def assert_same_result(ours, theirs: np.ndarray, where: str) -> None:
    """One recorded call's result: an array (to 1e-5, NaN where simple_elmo has NaN), substitutes
    (JSON: the same sentences, words and candidates in the same order, scores to their rounding),
    or an error (simple_elmo's exception type, caught here as ``ours``)."""
    if theirs.dtype.kind == "U" and str(theirs).startswith("ERROR: "):
        kind = str(theirs)[len("ERROR: ") :].split(":")[0]
        names = [c.__name__ for c in type(ours).__mro__] if isinstance(ours, BaseException) else []
        assert kind in names, (where, ours, theirs)
        return
    assert not isinstance(ours, BaseException), (where, ours)
    if theirs.dtype.kind == "U":
        expected = json.loads(str(theirs))
        assert len(ours) == len(expected), where
        for i, (s_ours, s_theirs) in enumerate(zip(ours, expected)):
            assert [w["word"] for w in s_ours] == [w["word"] for w in s_theirs], (where, i)
            for w_ours, w_theirs in zip(s_ours, s_theirs):
                for side in ("forward", "backward"):
                    a, b = w_ours[side], w_theirs[side]
                    assert a["candidates"] == b["candidates"], (where, i, side, a, b)
                    assert a["candidate_words"] == b["candidate_words"], (where, i, side)
                    # 4-decimal rounding of values that agree to ~1e-6 can land one step apart
                    np.testing.assert_allclose(a["logp"], b["logp"], atol=1.5e-4, rtol=0, err_msg=where)
        return
    assert isinstance(ours, np.ndarray) and ours.dtype == np.float64, (where, type(ours), getattr(ours, "dtype", None))
    assert ours.shape == theirs.shape, (where, ours.shape, theirs.shape)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs)), where
    err = np.nanmax(np.abs(ours - theirs)) if ours.size and not np.isnan(theirs).all() else 0.0
    assert err <= ATOL, f"{where}: max |elmo-fast - simple_elmo| = {err:.3g}"


def _run_case(model: ElmoModel, case: dict) -> list:
    out = []
    for method, kwargs in case["calls"]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an all-empty batch's 0 / 0, as in simple_elmo
                out.append(getattr(model, method)(**call_arguments(kwargs)))
        except Exception as e:
            out.append(e)
    return out


# ---------------------------------------------------------------------------------------------
# against simple_elmo: the recorded cases


def test_fixture_was_recorded_from_simple_elmo_0_9_2(recorded):
    about = json.loads(str(recorded["about"]))
    assert about["simple_elmo"] == "0.9.2" and about["tensorflow_cpu"].startswith("2.21")
    assert {k.split("/")[0] for k in recorded if "/" in k and not k.startswith("digest/")} == set(CASES)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_archives_are_the_recorded_ones(archives, recorded, kind):
    assert weights_digest(archives(kind)) == str(recorded[f"digest/{kind}"]), (
        f"the {kind} archive's weights changed since the fixture was recorded: rerun "
        "tests/fixtures/recorders/record_simple_elmo.py"
    )


# every case on the default backend (the fast path when built); the reference path on a few
# (it is slow, and tested against the fast path op by op elsewhere)
PARITY = [(name, "auto") for name in sorted(CASES)] + [
    pytest.param(name, "reference", id=f"{name}-reference") for name in ("novocab_b5", "substitutes_b3")
]


@pytest.mark.parametrize("name,backend", PARITY)
def test_same_outputs_as_simple_elmo(archives, recorded, name, backend):
    case = CASES[name]
    model = _load(archives(case["kind"]), case["load"], backend)
    for i, ours in enumerate(_run_case(model, case)):
        assert_same_result(ours, recorded[f"{name}/{i}"], f"{name}/{i} {case['calls'][i]}")


@pytest.mark.skipif(
    not PEER_PYTHON.exists(),
    reason=f"simple_elmo's side environment is not at {PEER_PYTHON} "
    "(see tests/fixtures/recorders/simple_elmo_peer.py); the recorded fixture covers the same cases",
)
def test_same_outputs_as_live_simple_elmo_on_fresh_weights(tmp_path):
    seed = secrets.randbelow(10**6)
    names = ["avg_b4_warm", "gz_b3", "substitutes_b3"]
    theirs, archives_ = run_peer(names, tmp_path, seed=seed)
    for name in names:
        case = CASES[name]
        model = _load(archives_[case["kind"]], case["load"])
        for i, ours in enumerate(_run_case(model, case)):
            assert_same_result(ours, theirs[f"{name}/{i}"], f"{name}/{i} seed={seed}")


# ---------------------------------------------------------------------------------------------
# bilm-tf's own tiny biLM, as simple_elmo sees it (an NLPL folder of links to the fixture's files)


@pytest.mark.slow
def test_bilm_tf_tiny_fixture_through_simple_elmos_batching(bilm_tf_tiny, fixture_sentences, tmp_path):
    """The fixture's outputs were made by bilm-tf, stateful, in batches of 3 (sentences[0][i],
    sentences[1][i], sentences[2][i]): get_elmo_vectors in batches of 3 without warm-up is that run."""
    import h5py

    (tmp_path / "options.json").symlink_to(bilm_tf_tiny / "options.json")
    (tmp_path / "model.hdf5").symlink_to(bilm_tf_tiny / "lm_weights.hdf5")
    texts = [fixture_sentences[k][i].split() for i in range(10) for k in range(3)]
    model = _load(tmp_path, dict(max_batch_size=3))
    top = model.get_elmo_vectors(texts, warmup=False, layers="all")[:, 2]
    err = 0.0
    for k in range(3):
        with h5py.File(bilm_tf_tiny / f"lm_embeddings_{k}.hdf5", "r") as f:
            for i in range(10):
                expected = np.concatenate(list(f[str(i)][...]), axis=-1)
                err = max(err, np.abs(top[3 * i + k, : len(expected)] - expected).max())
    assert err <= ATOL, err


# ---------------------------------------------------------------------------------------------
# the quirks, one by one, and their clean alternatives


@pytest.fixture(scope="module")
def folder_model(archives):
    return _load(archives("folder"), dict(max_batch_size=3))


def _fresh_texts(n: int, rng: np.random.Generator, lengths=(1, 13)) -> list[list[str]]:
    return [[WORDS[j] for j in rng.integers(0, len(WORDS), rng.integers(*lengths))] for _ in range(n)]


def test_padding_holds_bilm_tfs_token_layer_of_the_empty_row(folder_model):
    texts = _fresh_texts(7, np.random.default_rng(1))
    texts[4] = texts[4][:1]
    v = folder_model.get_elmo_vectors(texts, layers="all")
    pad = folder_model.padding_vector().numpy()
    assert np.abs(pad).max() > 0.05  # not zero: the char CNN's biases through the highways and projection
    for b in range(0, len(texts), 3):
        batch = texts[b : b + 3]
        longest = max(map(len, batch))
        for i, t in enumerate(batch, start=b):
            n = len(t)
            np.testing.assert_allclose(
                v[i, 0, n:longest], np.tile(np.concatenate([pad, pad]), (longest - n, 1)), atol=1e-6
            )
            assert not v[i, 1:, n:].any() and not v[i, :, longest:].any()
    avg = folder_model.get_elmo_vectors(texts)
    np.testing.assert_allclose(avg, v.mean(axis=1), atol=1e-6)  # "average": an even mix, padding included
    np.testing.assert_array_equal(folder_model.get_elmo_vectors(texts, layers="top"), v[:, -1])
    clean = folder_model.get_elmo_vectors(texts, layers="all", quirks=False)
    for i, t in enumerate(texts):
        assert not clean[i, :, len(t) :].any()
        np.testing.assert_array_equal(clean[i, :, : len(t)], v[i, :, : len(t)])


@pytest.mark.slow
def test_states_carry_from_batch_to_batch_and_warmup_replays_the_first_batch(archives):
    texts = _fresh_texts(7, np.random.default_rng(2))
    stateful = _load(archives("folder"), dict(max_batch_size=3))
    stateless = _load(
        archives("folder"),
        dict(max_batch_size=3),
    )
    stateless.elmo_bilm.stateful = False
    cold = stateful.get_elmo_vectors(texts, warmup=False, layers="all")
    warm = stateful.get_elmo_vectors(texts, warmup=True, layers="all")
    alone = [stateless.get_elmo_vectors([t], layers="all")[0] for t in texts]
    # the first batch without warm-up starts from zero states: each text as if alone (padding aside)
    for i in range(3):
        n = len(texts[i])
        np.testing.assert_allclose(cold[i, :, :n], alone[i], atol=ATOL)
    # later batches, and the warmed-up first batch, start from other states
    for v, i in ((cold, 3), (warm, 0)):
        assert np.abs(v[i, 1:, : len(texts[i])] - alone[i][1:]).max() > 1e-3
    # warm-up = the first batch run twice: batches of 3 of [first batch] + texts, from the second on
    replay = stateful.get_elmo_vectors(texts[:3] + texts, warmup=False, layers="all")
    np.testing.assert_allclose(warm[:, :, :], replay[3:, :, : warm.shape[2]], atol=ATOL)
    # each call starts afresh
    np.testing.assert_array_equal(stateful.get_elmo_vectors(texts, warmup=False, layers="all"), cold)


def test_stateless_loading_makes_vectors_independent_of_batching(archives):
    texts = _fresh_texts(8, np.random.default_rng(3))
    a = _load(archives("folder"), dict(max_batch_size=3, stateful=False)).get_elmo_vectors(texts, quirks=False)
    b = _load(archives("folder"), dict(max_batch_size=8, stateful=False)).get_elmo_vectors(texts[::-1], quirks=False)
    np.testing.assert_allclose(a, b[::-1], atol=ATOL)


def test_sentence_average_includes_padding_and_the_all_layers_reshape(folder_model):
    texts = _fresh_texts(5, np.random.default_rng(4))
    texts[1] = texts[1][:2]
    for layers in ("average", "top", "all"):
        v = folder_model.get_elmo_vectors(texts, layers=layers)
        avg = folder_model.get_elmo_vector_average(texts, layers=layers)
        for b in range(0, len(texts), 3):
            longest = max(len(t) for t in texts[b : b + 3])
            for i in range(b, min(b + 3, len(texts))):
                block = v[i, ..., :longest, :]
                if layers == "all":
                    block = block.reshape(longest, block.shape[0], -1)  # simple_elmo's reshape, not a transpose
                s = block.sum(axis=0)
                np.testing.assert_allclose(avg[i], s / np.linalg.norm(s), atol=1e-6)
        clean = folder_model.get_elmo_vector_average(texts, layers=layers, quirks=False)
        for i, t in enumerate(texts):
            mean = v[i, ..., : len(t), :].mean(axis=-2)
            np.testing.assert_allclose(clean[i], mean / np.linalg.norm(mean, axis=-1, keepdims=True), atol=1e-6)


def test_strings_are_sequences_of_character_tokens(folder_model):
    a = folder_model.get_elmo_vectors(["ab c", "xyz"], layers="all")
    b = folder_model.get_elmo_vectors([list("ab c"), list("xyz")], layers="all")
    np.testing.assert_array_equal(a, b)
    assert a.shape == (2, 3, 4, 32)


def test_session_and_other_tensorflow_arguments_are_ignored(folder_model):
    texts = _fresh_texts(4, np.random.default_rng(5))
    np.testing.assert_array_equal(
        folder_model.get_elmo_vectors(texts, session=object()), folder_model.get_elmo_vectors(texts)
    )
    np.testing.assert_array_equal(
        folder_model.get_elmo_vector_average(texts, True, "top", object()),
        folder_model.get_elmo_vector_average(texts, layers="top"),
    )
    folder_model.warmup(object(), texts)  # simple_elmo's public warmup(sess, texts)


def test_public_attributes(folder_model, archives):
    m = folder_model
    assert (m.batch_size, m.max_chars, m.vector_size, m.n_layers) == (3, 50, 32, 3)
    assert m.vocab is None and m.session is None and m.model is None and m.sentence_character_ids is None
    assert isinstance(m.batcher, Batcher) and m.archive.meta["algorithm"] == {"name": "ELMo"}
    ids = m.batcher.batch_sentences([["ab", "c"], []])
    assert ids.dtype == np.int64 and ids.shape == (2, 4, 50)
    bilm = ElmoBiLm.from_weights(m.archive.load_weights())
    ours = bilm.batch_to_ids([["ab", "c"], []]).numpy()
    np.testing.assert_array_equal(ids[0, 1:3], ours[0])  # allennlp's ids for ordinary words
    np.testing.assert_array_equal(ids[1, 0], ids[0, 0])
    assert (ids[1, 0, :3] == [259, 257, 260]).all() and (ids[1, 1, :3] == [259, 258, 260]).all()
    assert not ids[1, 2:].any()
    full = _load(archives("full"), dict(max_batch_size=3, full=True))
    assert isinstance(full.vocab, UnicodeCharsVocabulary) and full.vocab.size == len(WORDS) + 3
    assert (full.vocab.bos, full.vocab.eos, full.vocab.unk) == (1, 0, 2)


def test_vocabulary_limit_and_its_boundary_quirks():
    words = ["alpha", "beta", "<S>", "gamma", "!!!MAXTERMID", "</S>", "<UNK>", "delta"]
    v = Vocabulary(words, limit=4)
    assert v.size == 4 and (v.bos, v.eos, v.unk) == (2, -1, -1) and v.id_to_word(3) == "gamma"
    assert Vocabulary(words, limit=0).size == 7 == Vocabulary(words).size  # 0 never stops; MAXTERMID skipped
    assert Vocabulary(None).size == 3
    chars = UnicodeCharsVocabulary(words, 50, limit=4)
    # </S> is not among the first 4: index -1, the last cached word ("gamma"), gets its row
    np.testing.assert_array_equal(chars.word_to_char_ids("gamma"), chars.eos_chars)
    np.testing.assert_array_equal(chars.word_to_char_ids("<S>"), chars.bos_chars)
    np.testing.assert_array_equal(chars.word_to_char_ids("</S>")[:6], [258, 60, 47, 83, 62, 259])  # its bytes
    assert chars.encode_chars("x", reverse=True).tolist()[0] == chars.eos_chars.tolist()
    with pytest.raises(ModelFileError, match="lacks </S>, <UNK>"):
        Vocabulary(words, limit=4, validate=True, source="v.txt")
    long = UnicodeCharsVocabulary(None, 50).word_to_char_ids("é" * 30)
    assert long[0] == 258 and long[49] == 259 and (long[1:49:2] == 0xC3).all()  # 48 bytes kept, eow last


# ---------------------------------------------------------------------------------------------
# substitutes


def test_substitutes_without_quirks_are_the_language_model_in_context(archives):
    model = _load(archives("full"), dict(max_batch_size=3, full=True))
    data = [" ".join(t) for t in _fresh_texts(4, np.random.default_rng(6), lengths=(1, 7))]
    clean = model.get_elmo_substitutes(data, topn=4, nodelimiters=False, quirks=False)
    quirky = model.get_elmo_substitutes(data + data, topn=4, nodelimiters=False)
    assert [[w["word"] for w in s] for s in clean] == [
        [model.vocab.id_to_word(model.vocab.word_to_id(w)) for w in s.split()] for s in data
    ]
    for s in clean:
        for w in s:
            for side in ("forward", "backward"):
                logp = w[side]["logp"]
                assert logp == sorted(logp, reverse=True) and max(logp) <= 0
    # the first word's forward prediction reads <S> alone, with or without context: the same
    # candidates, scores apart by the log of the softmax's normalizer
    by_first = {s[0]["word"]: s[0]["forward"] for s in quirky if s}
    for s in clean:
        q = by_first.get(s[0]["word"])
        if q is not None:
            assert sorted(q["candidates"]) == sorted(s[0]["forward"]["candidates"])
            gap = np.subtract(sorted(q["logp"]), sorted(s[0]["forward"]["logp"]))
            assert np.ptp(gap) < 2e-4
    deep = [w for s in clean for w in s[1:-1]]
    assert deep, "no word with context on both sides"


def test_substitutes_need_a_full_model_and_enough_sentences(folder_model, archives):
    with pytest.raises(ElmoFastError, match="full=True"):
        folder_model.get_elmo_substitutes(TEXTS["raw"])
    full = _load(archives("full"), dict(max_batch_size=20, full=True))
    with pytest.raises(SystemError, match="Batch size must be less than the number of input sentences"):
        full.get_elmo_substitutes(TEXTS["raw"])
    with pytest.raises(ElmoFastError, match="topn"):
        full.get_elmo_substitutes(TEXTS["raw"] * 2, topn=0)
    with pytest.raises(InputError, match="sentence 1: expected a string"):
        full.get_elmo_substitutes(["a b", ["a", "b"]], quirks=False)


def test_full_reads_a_bilm_tf_training_folder_as_simple_elmo_does(tmp_path, archives):
    """simple_elmo's full=True reads the latest TensorFlow checkpoint of a bilm-tf save folder (here
    without TensorFlow), even beside an HDF5 file; without full=True the folder needs the HDF5 file."""
    import shutil

    from simple_elmo_models import TF_RUN

    run = archives("tf_run")
    data = TEXTS["tf_raw"]
    expected = _load(run, dict(max_batch_size=2, full=True)).get_elmo_substitutes(data)
    # the checkpoint file of a real run names the checkpoints by the training machine's paths
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    shutil.copy(TF_RUN / "bilm_tf_run" / "checkpoint", moved / "checkpoint")
    assert "/tmp/bilm_tf_training_machine" in (moved / "checkpoint").read_text()
    assert _load(moved, dict(max_batch_size=2, full=True)).get_elmo_substitutes(data) == expected
    with pytest.raises(SimpleElmoExit, match="no HDF5 model files"):
        ElmoModel().load(moved)
    # an HDF5 file beside the checkpoint (the run's weights, altered): full=True still reads the
    # checkpoint, full=False the HDF5 file
    import h5py

    from elmo_fast.convert import convert
    from elmo_fast.durable import durable_hdf5

    convert(run, tmp_path / "converted")
    with h5py.File(tmp_path / "converted" / "weights.hdf5", "r") as src, durable_hdf5(moved / "model.hdf5") as dst:
        names: list[str] = []
        src.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            dst.create_dataset(name, data=src[name][...] * 0.5)
    full = _load(moved, dict(max_batch_size=2, full=True))
    assert full.get_elmo_substitutes(data) == expected
    texts = [t.split() for t in data]
    from_hdf5 = _load(moved, dict(max_batch_size=2)).get_elmo_vectors(texts)
    assert np.abs(from_hdf5 - full.get_elmo_vectors(texts)).max() > 1e-2
    assert not list(Path(tempfile.gettempdir()).glob("elmo_fast_checkpoint_*"))


# ---------------------------------------------------------------------------------------------
# the NLPL layout and errors


def test_folder_prefers_vocab_gz_and_a_zip_reads_only_vocab_txt(tmp_path):
    d = write_archive("folder", tmp_path / "f")
    with gzip.open(d / "vocab.txt.gz", "wt", encoding="utf-8") as f:
        f.write("<S>\n</S>\n<UNK>\nonly\n")
    archive = open_nlpl(d)
    assert archive.vocab.endswith("vocab.txt.gz") and [s.strip() for s in archive.vocab_lines()][-1] == "only"
    z = tmp_path / "m.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for name in ("options.json", "model.hdf5", "vocab.txt.gz", "meta.json"):
            zf.write(d / name, name)
    assert open_nlpl(z).vocab is None  # simple_elmo reads no vocab.txt.gz from a zip
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr("vocab.txt", "<S>\n</S>\n")
    assert list(open_nlpl(z).vocab_lines()) == ["<S>", "</S>", ""]  # split on "\n", as simple_elmo


def test_meta_json_is_optional_and_a_broken_one_only_warns(tmp_path):
    d = write_archive("folder", tmp_path / "f")
    (d / "meta.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="meta.json: not read"):
        model = _load(d, {})
    assert model.archive.meta is None
    (d / "meta.json").unlink()
    assert _load(d, {}).archive.meta is None


def test_weights_under_another_name_and_a_zip_with_nested_files(tmp_path):
    d = write_archive("gz", tmp_path / "g")
    assert open_nlpl(d).weights.endswith("elmo_2019.hdf5")
    (d / "elmo_2019.hdf5").unlink()
    with pytest.raises(SimpleElmoExit, match="no HDF5 model file"):
        ElmoModel().load(d)
    f = write_archive("folder", tmp_path / "f")
    z = tmp_path / "nested.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for name in ("options.json", "model.hdf5"):
            zf.write(f / name, "209/" + name)
    with pytest.raises(SimpleElmoExit, match="holds no options.json at its top level.*209/options.json"):
        ElmoModel().load(z)


def test_load_errors_exit_as_simple_elmo_but_can_be_caught(tmp_path):
    with pytest.raises(SystemExit) as caught:
        ElmoModel().load(tmp_path / "nowhere")
    assert isinstance(caught.value, ModelFileError) and "not found" in caught.value.code
    (tmp_path / "x.tar").write_bytes(b"")
    with pytest.raises(SimpleElmoExit, match="either provide a path to a directory"):
        ElmoModel().load(tmp_path / "x.tar")
    (tmp_path / "bad.zip").write_bytes(b"PK not really")
    with pytest.raises(SimpleElmoExit, match="not a readable zip"):
        ElmoModel().load(tmp_path / "bad.zip")
    d = write_archive("folder", tmp_path / "nosoftmax")
    with pytest.raises(SimpleElmoExit, match="needs the language model's softmax: a bilm-tf training checkpoint"):
        ElmoModel().load(d, full=True)
    (d / "vocab.txt").unlink()
    with pytest.raises(SimpleElmoExit, match="needs the language model's vocabulary"):
        ElmoModel().load(d, full=True)
    with pytest.raises(ElmoFastError, match="max_batch_size must be an integer >= 1"):
        ElmoModel().load(d, max_batch_size=0)


def test_bad_arguments_name_the_problem(folder_model):
    with pytest.raises(ElmoFastError, match="layers must be one of"):
        folder_model.get_elmo_vectors([["a"]], layers="middle")
    with pytest.raises(InputError, match="texts is empty"):
        folder_model.get_elmo_vectors([])
    with pytest.raises(InputError, match="text 1: every token must be a str"):
        folder_model.get_elmo_vector_average([["a"], ["b", 3]])
    # numpy arrays of str, as the other entry points take them (a text that is a string is its
    # characters, as simple_elmo reads it: recorded against simple_elmo itself)
    assert np.array_equal(
        folder_model.get_elmo_vectors([np.array(["a", "b"])]), folder_model.get_elmo_vectors([["a", "b"]])
    )
    with pytest.raises(ElmoFastError, match="no model loaded"):
        ElmoModel().get_elmo_vectors([["a"]])


def test_zip_weights_are_read_without_leaving_files(archives):
    tmp = tempfile.gettempdir()
    before = set(os.listdir(tmp))
    model = _load(archives("zip"), {})
    assert model.archive.is_zip and model.archive.vocab == "vocab.txt"
    assert not {n for n in set(os.listdir(tmp)) - before if n.startswith("elmo_fast_nlpl_")}


def test_precision_as_every_entry_point_takes_it(archives):
    from elmo_fast.bilm.ops import HAS_EXTENSION
    from elmo_fast.bilm.precision import BF16, FP32

    assert _load(archives("folder"), {}).elmo_bilm.precision is FP32
    if HAS_EXTENSION:
        model = _load(archives("folder"), dict(precision="bf16"))
        assert model.elmo_bilm.precision is BF16
        texts = _fresh_texts(3, np.random.default_rng(7))
        fp32 = _load(archives("folder"), {}).get_elmo_vectors(texts)
        assert np.abs(model.get_elmo_vectors(texts) - fp32).max() < 0.05 * np.abs(fp32).max()
    with pytest.raises(ElmoFastError, match="precision"):
        ElmoModel().load(archives("folder"), precision="fp16")  # CUDA only: refused before reading the model
