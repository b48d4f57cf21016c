"""The Python API takes any sequence of str as a sentence (lists, tuples, numpy arrays of str, iterators)
and any sequence of those as a batch (2-D arrays of str included), at every entry point, through one
check (elmo_fast/sentences.py); anything else is a one-line error saying what was expected and found."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_fast import Elmo, ElmoBiLm, ElmoEmbedder, InputError, batch_to_ids
from elmo_fast.formats.random_models import random_manylangs_model
from elmo_fast.manylangs import Embedder
from elmo_fast.sentences import SentenceTypeError, as_batch, as_sentence

TOKENS = ["The", "bank", "É", "."]
OTHER = ["x", "y"]

SENTENCE_FORMS = {
    "list": lambda t: list(t),
    "tuple": lambda t: tuple(t),
    "numpy <U": lambda t: np.array(t),
    "numpy object": lambda t: np.array(t, dtype=object),
    "numpy.str_ tokens": lambda t: [np.str_(x) for x in t],
    "iterator": lambda t: iter(list(t)),
}
BATCH_FORMS = {
    "list of lists": lambda a, b: [list(a), list(b)],
    "tuple of tuples": lambda a, b: (tuple(a), tuple(b)),
    "list of arrays": lambda a, b: [np.array(a), np.array(b)],
    "object array of lists": lambda a, b: np.array([list(a), list(b)] + [None], dtype=object)[:2],
    "generator of arrays": lambda a, b: (np.array(s) for s in (a, b)),
}


@pytest.fixture(scope="module")
def embedder(random_models):
    return ElmoEmbedder(*random_models("tiny"), token_cache_mb=0)


@pytest.fixture(scope="module")
def manylangs_dir(tmp_path_factory):
    return random_manylangs_model("tiny", tmp_path_factory.mktemp("ml"))


@pytest.mark.parametrize("form", sorted(SENTENCE_FORMS))
def test_a_sentence_in_any_form(embedder, form):
    want = embedder.embed_sentence(TOKENS)
    np.testing.assert_array_equal(embedder.embed_sentence(SENTENCE_FORMS[form](TOKENS)), want)
    assert as_sentence(SENTENCE_FORMS[form](TOKENS)) == TOKENS
    assert all(type(t) is str for t in as_sentence(SENTENCE_FORMS[form](TOKENS)))
    got = list(embedder.embed_sentences([SENTENCE_FORMS[form](TOKENS), OTHER], batch_size=1))
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("form", sorted(BATCH_FORMS))
def test_a_batch_in_any_form_at_every_entry_point(embedder, random_models, manylangs_dir, form):
    batch = lambda: BATCH_FORMS[form](TOKENS, OTHER)  # noqa: E731  (a fresh one each time: generators run once)
    want_ids = batch_to_ids([TOKENS, OTHER])
    assert torch.equal(batch_to_ids(batch()), want_ids)
    assert torch.equal(embedder.elmo_bilm.batch_to_ids(batch()), want_ids)
    assert torch.equal(Elmo(*random_models("tiny"), num_output_representations=1).batch_to_ids(batch()), want_ids)
    for got, want in zip(embedder.embed_batch(batch()), embedder.embed_batch([TOKENS, OTHER])):
        np.testing.assert_array_equal(got, want)
    ml = Embedder(manylangs_dir)
    want_ml = ml.sents2elmo([TOKENS, OTHER])
    for got, want in zip(ml.sents2elmo(batch()), want_ml):
        np.testing.assert_array_equal(got, want)
    assert torch.equal(
        ElmoBiLm(model_dir=manylangs_dir).batch_to_ids(batch()),
        ElmoBiLm(model_dir=manylangs_dir).batch_to_ids([TOKENS, OTHER]),
    )


def test_a_rectangular_2d_array_is_a_batch_of_its_rows(embedder):
    rows = np.array([["a", "b", "c"], ["d", "e", "f"]])
    assert as_batch(rows) == [["a", "b", "c"], ["d", "e", "f"]]
    assert torch.equal(batch_to_ids(rows), batch_to_ids(rows.tolist()))
    assert as_batch(np.array([], dtype=str)) == [] and as_sentence(np.array([])) == []
    assert embedder.embed_sentence(np.array([], dtype=str)).shape[1] == 0


BAD_SENTENCES = {
    "a string": (
        "The cat sat.",
        r"^sentence: expected a sequence of tokens \(a list, a tuple or a 1-D numpy array of "
        r"str\), found a string 'The cat sat.'; split it first: elmo_fast.tokenizer.split_text\(text, "
        r"tokenize=True\) for raw text \(as embed --tokenize and the server split it\), or text.split\(\) for "
        r"text tokenized already$",
    ),
    "int tokens": ([1, 2], r"^sentence\[0\]: expected a str, found int 1$"),
    "None token": (["a", None], r"^sentence\[1\]: expected a str, found NoneType None$"),
    "bytes tokens": ([b"a"], r"^sentence\[0\]: expected a str, found a bytes b'a'$"),
    "2-D array": (
        np.array([["a", "b"], ["c", "d"]]),
        r"^sentence: expected a sequence of tokens .*, found a 2-D numpy array of <U1 \(shape \(2, 2\)\)$",
    ),
    "numbers array": (np.arange(3.0), r"found a 1-D numpy array of float64 \(shape \(3,\)\)$"),
    "bytes array": (np.array([b"a"]), r"^sentence\[0\]: expected a str, found a bytes b'a'$"),
    "a set": ({"a", "b"}, r"^sentence: expected a sequence of tokens .*, found set "),
    "a dict": ({"a": 1}, r"found dict \{'a': 1\}$"),
    "None": (None, r"^sentence: expected a sequence of tokens .*, found NoneType None$"),
    "0-d array": (np.array("a b"), r"found a 0-D numpy array of <U3 \(shape \(\)\)$"),
}


@pytest.mark.parametrize("case", sorted(BAD_SENTENCES))
def test_what_is_not_a_sentence_is_one_line_saying_so(embedder, case):
    value, message = BAD_SENTENCES[case]
    with pytest.raises(SentenceTypeError, match=message) as info:
        embedder.embed_sentence(value)
    assert (
        isinstance(info.value, InputError) and isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    )
    assert "\n" not in str(info.value)
    assert "truth value" not in str(info.value)


@pytest.mark.parametrize("call", ["batch_to_ids", "embed_batch", "sents2elmo", "Elmo.batch_to_ids"])
def test_what_is_not_a_batch_is_one_line_saying_so(embedder, random_models, manylangs_dir, call):
    f = {
        "batch_to_ids": batch_to_ids,
        "embed_batch": embedder.embed_batch,
        "sents2elmo": lambda b: Embedder(manylangs_dir).sents2elmo(b),
        "Elmo.batch_to_ids": Elmo(*random_models("tiny"), num_output_representations=1).batch_to_ids,
    }[call]
    with pytest.raises(
        SentenceTypeError,
        match=r": expected a batch of sentences, each a sequence of tokens "
        r"\(e.g. \[\['Hello', 'world'\]\]\), found a str 'a b'$",
    ):
        f("a b")
    with pytest.raises(
        SentenceTypeError,
        match=r"\[0\]: expected a sentence, a sequence of tokens, found a str 'a'; "
        r"a batch is a list of sentences, each a list of tokens",
    ):
        f(["a", "b"])  # one sentence where a batch was expected
    with pytest.raises(SentenceTypeError, match=r"\[1\]\[0\]: expected a str, found int 3$"):
        f([["a"], [3]])
    with pytest.raises(SentenceTypeError, match=r"found a 3-D numpy array"):
        f(np.array([[["a"]]]))


def test_embed_sentences_names_the_sentence_by_its_position(embedder):
    with pytest.raises(SentenceTypeError, match=r"^sentences\[3\]: expected a sequence of tokens .*found a string"):
        list(embedder.embed_sentences([["a"], ["b"], ["c"], "d e"], batch_size=2))
    with pytest.raises(SentenceTypeError, match="^sentences: expected a batch of sentences"):
        list(embedder.embed_sentences("a b c"))
