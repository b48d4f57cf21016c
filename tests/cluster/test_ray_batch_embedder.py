"""elmo_fast.ray.ElmoBatchEmbedder called as Ray Data calls it (a batch in, the batch with its vectors out),
without Ray: every row equals ElmoEmbedder's vectors of its sentence alone (stateless) whatever the
batches, each output's column and shape, the model as `embed` takes it, and every bad row a one-line
error naming it. (tests/cluster/test_ray_data.py runs it under Ray.)"""

from __future__ import annotations

import random

import numpy as np
import pytest

pd = None
try:
    import pandas as pd  # noqa: F811  (Ray Data's batch_format="pandas"; pandas comes with ray[data])
except ImportError:
    pass

from elmo_fast import ElmoEmbedder, InputError
from elmo_fast.errors import ElmoFastError
from elmo_fast.output_shapes import shape_output
from elmo_fast.ray import ElmoBatchEmbedder

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    ".",
    "ELMo",
    "gives",
    "every",
    "token",
    "vector",
    "Москва",
    "—",
    "isn't",
    "3.14",
    ",",
    "(",
    ")",
    "naïve",
    "bank",
    "river",
    "money",
]


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lengths = [1, 2, 3, 7, 17, 40] + [rng.randint(1, 30) for _ in range(n - 6)]
    return [" ".join(rng.choice(WORDS) for _ in range(k)) for k in lengths]


@pytest.fixture(scope="module")
def tiny(random_models):
    return random_models("tiny", seed=3)


@pytest.fixture(scope="module")
def reference(tiny):
    options, weights = tiny
    return ElmoEmbedder(options, weights)


@pytest.fixture(scope="module")
def alone(reference):
    """Each sentence's activations, embedded alone (cached: several outputs check the same sentences)."""
    cache: dict[str, np.ndarray] = {}

    def get(text: str) -> np.ndarray:
        if text not in cache:
            cache[text] = reference.embed_sentence(text.split())
        return cache[text]

    return get


@pytest.mark.parametrize("output", ["mean", "average", "top", "all", "sum"])
@pytest.mark.slow
def test_every_row_equals_its_sentence_alone_whatever_the_batches(output, tiny, reference, alone):
    options, weights = tiny
    texts = _sentences(19, seed=5)
    # model batches of 1..5 sentences and few tokens: the rows are cut up differently from the reference's
    embedder = ElmoBatchEmbedder(
        options_file=str(options), weight_file=str(weights), output=output, max_batch_size=5, max_batch_tokens=60
    )
    column = "embedding" if output == "mean" else "embeddings"
    rng = random.Random(len(output))  # a partition of its own for each output
    start = 0
    while start < len(texts):  # Ray's batches: any partition of the rows
        size = rng.randint(1, 9)
        chunk = texts[start : start + size]
        batch = {"text": np.array(chunk, dtype=object), "id": np.arange(start, start + len(chunk))}
        out = embedder(batch)
        assert list(out) == ["text", "id", column]
        assert out["id"].tolist() == list(range(start, start + len(chunk)))  # the other columns pass through
        for text, got in zip(chunk, out[column]):
            want = shape_output(alone(text), output)
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        if output == "mean":
            assert out[column].shape == (len(chunk), reference.output_dim)
        start += size


@pytest.mark.slow
def test_tokens_column_and_the_tokenizer(tiny, reference):
    from elmo_fast.tokenizer import tokenize

    options, weights = tiny
    kwargs = dict(options_file=str(options), weight_file=str(weights), output="top")
    texts = ["It's 3.14, isn't it?", "Mail me at jane.doe@example.com."]
    tokenized = ElmoBatchEmbedder(**kwargs, tokenize=True)({"text": np.array(texts, dtype=object)})
    whitespace = ElmoBatchEmbedder(**kwargs)({"text": np.array(texts, dtype=object)})
    token_lists = np.empty(2, dtype=object)
    token_lists[0], token_lists[1] = np.array(tokenize(texts[0])), list(tokenize(texts[1]))
    tokens = ElmoBatchEmbedder(**kwargs, tokens_column="tokens")({"tokens": token_lists})
    for i, text in enumerate(texts):
        want = reference.embed_sentence(tokenize(text))[-1]
        np.testing.assert_allclose(tokenized["embeddings"][i], want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(tokens["embeddings"][i], want, atol=1e-5, rtol=0)
        assert whitespace["embeddings"][i].shape[0] == len(text.split()) != len(tokenize(text))


@pytest.mark.skipif(pd is None, reason="pandas is not installed (it comes with Ray Data: pip install 'elmo-fast[ray]')")
def test_pandas_batches(tiny, reference):
    options, weights = tiny
    embedder = ElmoBatchEmbedder(options_file=str(options), weight_file=str(weights))
    frame = pd.DataFrame({"text": ["a b c", "river bank"], "n": [1, 2]})
    out = embedder(frame)
    assert list(out.columns) == ["text", "n", "embedding"] and list(frame.columns) == ["text", "n"]
    for text, got in zip(frame["text"], out["embedding"]):
        np.testing.assert_allclose(got, reference.embed_sentence(text.split()).mean(axis=(0, 1)), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_model_as_embed_takes_it(tiny, tmp_path):
    options, weights = tiny
    from_files = ElmoBatchEmbedder(options_file=str(options), weight_file=str(weights), output="all")
    from_dir = ElmoBatchEmbedder(model_dir=str(options.parent), output="all")
    batch = {"text": np.array(["The river bank ."], dtype=object)}
    np.testing.assert_array_equal(from_files(batch)["embeddings"][0], from_dir(batch)["embeddings"][0])
    bundled = ElmoBatchEmbedder()(batch)["embedding"]  # no model named: the bundled one
    named = ElmoBatchEmbedder(model="default")(batch)["embedding"]
    np.testing.assert_array_equal(bundled, named)
    np.testing.assert_allclose(
        bundled[0], ElmoEmbedder().embed_sentence("The river bank .".split()).mean(axis=(0, 1)), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(model="nope"), "model: unknown model 'nope'; valid names: default"),
        (dict(model="default", model_dir="x"), "give one of model (a name), model_dir or options_file + weight_file"),
        (dict(options_file="o.json"), "give options_file and weight_file"),
        (dict(model_format="bilm-tf"), "model_format picks the model of a model_dir"),
        (dict(output="first"), "output must be one of 'all', 'top', 'average', 'sum', 'mean', got 'first'"),
        (dict(text_column="a", tokens_column="b"), "give text_column (raw text) or tokens_column"),
        (dict(tokens_column="b", tokenize=True), "tokenize splits the text of text_column"),
        (dict(max_batch_size=0), "max_batch_size must be an integer >= 1, got 0"),
        (dict(max_batch_tokens=-1), "max_batch_tokens must be an integer >= 1 or None, got -1"),
        (dict(max_line_length=0), "max_line_length must be an integer >= 1"),
        (dict(device="cpu", precision="fp16"), "fp16"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ElmoFastError) as info:
        ElmoBatchEmbedder(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def _objects(*values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


@pytest.mark.parametrize(
    "column,values,message",
    [
        (
            "text",
            _objects("fine", "   "),
            "column 'text', row 2 of 2 in the batch (id=1): the text '   ' is empty or all whitespace",
        ),
        ("text", _objects("fine", None), "column 'text', row 2 of 2 in the batch (id=1): expected a str, found None"),
        ("text", _objects(7, "fine"), "column 'text', row 1 of 2 in the batch (id=0): expected a str, found int 7"),
        ("text", _objects(b"bytes", "fine"), "expected a str, found bytes b'bytes' (bytes: decode them first)"),
        (
            "text",
            _objects("fine", "x " * 30),
            "column 'text', row 2 of 2 in the batch (id=1): its text has 60 characters, over max_line_length=50",
        ),
        ("tokens", _objects(["a"], []), "column 'tokens', row 2 of 2 in the batch (id=1): the list of tokens is empty"),
        (
            "tokens",
            _objects(["a"], "a b"),
            "column 'tokens', row 2 of 2 in the batch (id=1): expected a sequence of tokens",
        ),
        (
            "tokens",
            _objects(["a", 3], ["b"]),
            "column 'tokens', row 1 of 2 in the batch (id=0)[1]: expected a str, found int 3",
        ),
        ("tokens", _objects(["a"], None), "row 2 of 2 in the batch (id=1): expected a list of tokens, found None"),
        ("tokens", _objects(["abc"] * 20, ["b"]), "its 20 tokens hold 79 characters, over max_line_length=50"),
    ],
)
def test_bad_rows_are_one_line_errors_naming_the_row(column, values, message, tiny):
    options, weights = tiny
    kwargs = dict(options_file=str(options), weight_file=str(weights), max_line_length=50)
    if column == "tokens":
        kwargs["tokens_column"] = "tokens"
    embedder = ElmoBatchEmbedder(**kwargs)
    with pytest.raises(InputError) as info:
        embedder({column: values, "id": np.arange(len(values))})
    text = str(info.value)
    assert text.startswith("ElmoBatchEmbedder: ") and message in text and "\n" not in text


def test_a_missing_column_and_an_unknown_batch_format(tiny):
    options, weights = tiny
    embedder = ElmoBatchEmbedder(options_file=str(options), weight_file=str(weights))
    with pytest.raises(
        InputError,
        match=r"the batch has no column 'text' \(its columns: 'sentence', 'id'\); name "
        r"the column with text_column=",
    ):
        embedder({"sentence": np.array(["a"]), "id": np.arange(1)})
    with pytest.raises(InputError, match="got a batch of type list; give map_batches batch_format='numpy'"):
        embedder([["a"]])


def test_an_empty_batch(tiny):
    options, weights = tiny
    out = ElmoBatchEmbedder(options_file=str(options), weight_file=str(weights))({"text": np.array([], dtype=object)})
    assert out["embedding"].shape == (0, ElmoEmbedder(options, weights).output_dim)
