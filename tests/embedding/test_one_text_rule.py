"""One rule for raw text and one set of outputs, across the fronts: ``embed_file`` (``elmo-fast embed``), the
Python API, Ray's ``ElmoBatchEmbedder`` (called as Ray Data calls it, without Ray) and the server's request
parsing. The same texts split by the same ``tokenize`` choice give the same tokens and vectors everywhere
(elmo_fast.tokenizer.split_text); each front accepts every output of elmo_fast.output_shapes.OUTPUTS, and
refuses any other with the same words."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from elmo_fast import ElmoEmbedder
from elmo_fast.errors import ElmoFastError
from elmo_fast.output_shapes import OUTPUTS, shape_output, unknown_output
from elmo_fast.ray import ElmoBatchEmbedder
from elmo_fast.tokenizer import split_text, tokenize

TEXTS = [
    "The cat sat on the mat.",
    "I don't think John's car costs $1,000.50 (e.g. in the U.S.)...",
    "Москва — столица России.",
    "  spaced \t out  ",
    "a",
]


@pytest.fixture(scope="module")
def model(random_models):
    return random_models("tiny", seed=4)


@pytest.fixture(scope="module")
def embedder(model):
    return ElmoEmbedder(*model)


def _server_protocol():
    return pytest.importorskip(
        "elmo_fast.serve.protocol", reason="the server needs the [serve] extra: pip install 'elmo-fast[serve]'"
    )


def test_split_text_is_the_tokenizer_or_whitespace():
    for text in TEXTS:
        assert split_text(text, tokenize=True) == tokenize(text)
        assert split_text(text, tokenize=False) == text.split()
    assert split_text("the mat.", tokenize=False) == ["the", "mat."]
    assert split_text("the mat.", tokenize=True) == ["the", "mat", "."]


@pytest.mark.parametrize("tokenize_text", [False, True])
def test_the_same_texts_give_the_same_vectors_on_every_front(tmp_path, model, embedder, tokenize_text):
    """embed_file (one text a line), Ray's text_column and the Python API (split_text, then embed_sentence) give
    each text the same tokens and vectors for the same ``tokenize``; the server's ``texts`` are tokenized."""
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out.h5"
    embedder.embed_file(corpus, out, "all", tokenize=tokenize_text, progress=False)
    ray = ElmoBatchEmbedder(options_file=str(model[0]), weight_file=str(model[1]), output="all", tokenize=tokenize_text)
    rows = ray({"text": np.array(TEXTS, dtype=object)})["embeddings"]
    with h5py.File(out, "r") as f:
        assert json.loads(f["sentence_to_index"][0]) == {t.strip(): str(i) for i, t in enumerate(TEXTS)}
        for i, text in enumerate(TEXTS):
            tokens = split_text(text, tokenize_text)
            alone = embedder.embed_sentence(tokens)  # the Python API
            assert f[str(i)].shape == rows[i].shape == alone.shape == (3, len(tokens), embedder.output_dim)
            assert np.abs(f[str(i)][...] - alone).max() <= 1e-5
            assert np.abs(rows[i] - alone).max() <= 1e-5
    protocol = _server_protocol()
    request = protocol.parse_embed(json.dumps({"texts": TEXTS}).encode(), protocol.RequestLimits())
    assert request.sentences == [split_text(t, tokenize=True) for t in TEXTS]


def test_every_front_takes_every_output_and_refuses_others_alike(tmp_path, model, embedder):
    from elmo_fast.embedding.options import EmbedOptions

    protocol = _server_protocol()
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    for output in OUTPUTS:
        out = tmp_path / f"{output}.h5"
        embedder.embed_file(corpus, out, output, progress=False)
        ray = ElmoBatchEmbedder(options_file=str(model[0]), weight_file=str(model[1]), output=output)
        column = ray({"text": np.array(TEXTS, dtype=object)})["embedding" if output == "mean" else "embeddings"]
        request = protocol.parse_embed(
            json.dumps({"texts": TEXTS, "output": output}).encode(), protocol.RequestLimits()
        )
        assert request.output == output
        with h5py.File(out, "r") as f:
            for i, text in enumerate(TEXTS):
                want = shape_output(embedder.embed_sentence(text.split()), output)
                assert np.abs(f[str(i)][...] - want).max() <= 1e-5 and f[str(i)].shape == want.shape
                assert np.abs(column[i] - want).max() <= 1e-5
    words = unknown_output("first")
    assert words == "must be one of 'all', 'top', 'average', 'sum', 'mean', got 'first'"
    with pytest.raises(ElmoFastError) as e:
        EmbedOptions(output_format="first")
    assert str(e.value) == f"output_format {words}"
    with pytest.raises(ElmoFastError) as e:
        ElmoBatchEmbedder(options_file=str(model[0]), weight_file=str(model[1]), output="first")
    assert str(e.value) == f"output {words}"
    with pytest.raises(protocol.RequestError) as e:
        protocol.parse_embed(b'{"texts": ["a"], "output": "first"}', protocol.RequestLimits())
    assert e.value.message == f"'output' {words}"


def test_embed_mean_on_the_command_line(tmp_path, model, embedder):
    from elmo_fast.cli import main

    corpus = tmp_path / "texts.txt"
    corpus.write_text("The cat sat .\nDogs bark\n", encoding="utf-8")
    out = tmp_path / "mean.h5"
    args = ["embed", str(corpus), str(out), "--mean", "--options", str(model[0]), "--weights", str(model[1])]
    assert main([*args, "--quiet"]) == 0
    with h5py.File(out, "r") as f:
        for i, text in enumerate(["The cat sat .", "Dogs bark"]):
            want = shape_output(embedder.embed_sentence(text.split()), "mean")
            assert f[str(i)].shape == (embedder.output_dim,) and np.abs(f[str(i)][...] - want).max() <= 1e-5
