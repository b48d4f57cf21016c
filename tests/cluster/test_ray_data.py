"""ElmoBatchEmbedder on a local Ray (tests/support/ray_local.py: ray.init(num_cpus=2), once for the test run): text
files and parquet through ``map_batches`` with one and two actors and other partitionings, every row
equal to ElmoEmbedder's vectors of its sentence alone; vectors written to parquet and read back; a bad
row's one-line error reaching the driver. (tests/cluster/test_ray_batch_embedder.py checks the class without Ray.)"""

from __future__ import annotations

import numpy as np
import pytest

from elmo_fast import ElmoEmbedder
from elmo_fast.output_shapes import shape_output
from elmo_fast.ray import ElmoBatchEmbedder

TEXTS = [
    "The cat sat on the mat .",
    "A",
    "ELMo gives every token a vector that depends on its sentence .",
    "river bank",
    "money in the bank",
    "Москва — столица России .",
    "naïve isn't it ?",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
    "the the the",
    "( 3.14 , 2.71 )",
    "bank",
    "He sat by the river bank and watched the water .",
]


@pytest.fixture(scope="module")
def ray(ray_cluster):
    return ray_cluster


@pytest.fixture(scope="module")
def model(random_models):
    return random_models("tiny", seed=11)


@pytest.fixture(scope="module")
def alone(model):
    embedder = ElmoEmbedder(*model)
    return {text: embedder.embed_sentence(text.split()) for text in TEXTS}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray_corpus") / "corpus.txt"
    path.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    return path


def _check(rows, alone, output):
    column = "embedding" if output == "mean" else "embeddings"
    assert sorted(r["text"] for r in rows) == sorted(TEXTS)  # each row once (Ray may reorder them)
    for row in rows:
        want = shape_output(alone[row["text"]], output)
        got = np.asarray(row[column])
        assert got.dtype == np.float32 and got.shape == want.shape, (row["text"], got.shape)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("output,actors,batch_size,blocks", [("all", 1, 5, 1), ("mean", 2, 3, 4)])
@pytest.mark.slow
def test_read_text_map_batches_equals_each_sentence_alone(
    ray, model, alone, corpus, output, actors, batch_size, blocks
):
    options, weights = model
    ds = ray.data.read_text(str(corpus), override_num_blocks=blocks)
    # num_cpus=0.5: two actors leave a CPU of the two for Ray's read tasks (actors holding every CPU
    # would leave the read waiting for ever)
    out = ds.map_batches(
        ElmoBatchEmbedder,
        fn_constructor_kwargs=dict(
            options_file=str(options), weight_file=str(weights), output=output, max_batch_size=2
        ),
        concurrency=actors,
        batch_size=batch_size,
        num_cpus=0.5,
    )
    _check(out.take_all(), alone, output)


@pytest.mark.slow
def test_parquet_in_and_out(ray, model, alone, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    options, weights = model
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "sentence": TEXTS}), tmp_path / "in.parquet")
    ds = ray.data.read_parquet(str(tmp_path / "in.parquet"))
    ds = ds.map_batches(
        ElmoBatchEmbedder,
        fn_constructor_kwargs=dict(
            options_file=str(options), weight_file=str(weights), output="average", text_column="sentence"
        ),
        concurrency=1,
        batch_size=4,
        num_cpus=0.5,
    )
    ds.write_parquet(str(tmp_path / "out"))
    rows = ray.data.read_parquet(str(tmp_path / "out")).take_all()
    assert sorted(r["id"] for r in rows) == list(range(len(TEXTS)))
    _check([{"text": r["sentence"], "embeddings": r["embeddings"]} for r in rows], alone, "average")


@pytest.mark.slow
def test_a_bad_row_is_a_one_line_error_at_the_driver(ray, model):
    options, weights = model
    ds = ray.data.from_items([{"text": t, "id": i} for i, t in enumerate(["fine", "also fine", "   ", "ok"])])
    ds = ds.map_batches(
        ElmoBatchEmbedder,
        fn_constructor_kwargs=dict(options_file=str(options), weight_file=str(weights)),
        concurrency=1,
        batch_size=4,
        num_cpus=0.5,
    )
    with pytest.raises(Exception) as info:
        ds.take_all()
    expected = (
        "ElmoBatchEmbedder: column 'text', row 3 of 4 in the batch (id=2): the text '   ' is empty or all "
        "whitespace; every row needs at least one token (filter such rows out first)"
    )
    # Ray shows the actor's traceback; the error itself is its one line there
    assert any(line.endswith(f"InputError: {expected}") for line in str(info.value).splitlines()), str(info.value)
