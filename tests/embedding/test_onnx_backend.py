"""backend='onnx': an exported graph in ONNX Runtime in place of the biLM's forward, with the same
tokenization, batching and outputs (its HDF5 equal to the fast path's within 1e-5), through the API,
`elmo-fast embed` and `elmo-fast serve`; every bad combination refused in one line, exit status 2."""

import json
import os
import sys

import cli_process
import numpy as np
import pytest
import torch
from embed_runs import contents
from onnx_graphs import random_batch, require_onnx_extra

from elmo_fast import ElmoEmbedder
from elmo_fast.embedding.onnx_backend import OnnxBiLm, check_onnx_settings
from elmo_fast.errors import ElmoFastError

pytestmark = pytest.mark.usefixtures("_onnx_extra")

FP32_BOUND = 1e-5


@pytest.fixture(scope="module")
def _onnx_extra():
    require_onnx_extra()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Lines of 1..64 tokens (more than one batch, and a length that repeats) and an empty line."""
    rng = np.random.default_rng(11)
    lengths = [1, 64, *rng.integers(1, 65, 40), 3, 3, 0, 17]
    lines = [" ".join(s) for s in random_batch(rng, lengths)]
    path = tmp_path_factory.mktemp("corpus") / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_cli(*args):
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *map(str, args)], capture_output=True, text=True, timeout=600
    )


def assert_same_outputs(got_path, want_path) -> None:
    got, got_index = contents(got_path)
    want, want_index = contents(want_path)
    assert got_index == want_index and sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype == np.float32 and got[key].shape == want[key].shape, key
        assert np.abs(got[key] - want[key]).max() <= FP32_BOUND, key


@pytest.mark.parametrize("model", ["golden", "small"])
@pytest.mark.slow
def test_embed_file_equals_the_fast_path(model, tmp_path, corpus, tiny_files, random_models, onnx_graphs):
    files = tiny_files if model == "golden" else random_models("small", exercise_clips=True)
    graph = onnx_graphs(*files)
    onnx_embedder = ElmoEmbedder(backend="onnx", onnx_file=graph, batch_size=16)
    fast = ElmoEmbedder(*files, backend="fast", batch_size=16)
    assert (onnx_embedder.num_layers, onnx_embedder.output_dim) == (fast.num_layers, fast.output_dim)
    for output_format in ("all", "average"):
        got, want = tmp_path / f"onnx-{output_format}.h5", tmp_path / f"fast-{output_format}.h5"
        summary = onnx_embedder.embed_file(corpus, got, output_format, progress=False, skip_empty=True)
        fast.embed_file(corpus, want, output_format, progress=False, skip_empty=True)
        assert summary["backend"] == "onnx"
        assert_same_outputs(got, want)


def test_the_api_batches_as_the_biLM_does(tiny_files, onnx_graphs):
    """embed_sentence, embed_batch (an empty sentence among others; all-empty batches), embed_sentences."""
    embedder = ElmoEmbedder(onnx_file=onnx_graphs(*tiny_files))  # backend "auto" with a graph: onnx
    assert isinstance(embedder.elmo_bilm, OnnxBiLm) and embedder.model_files == {"onnx": onnx_graphs(*tiny_files)}
    reference = ElmoEmbedder(*tiny_files, backend="reference")
    batch = random_batch(np.random.default_rng(12), [5, 0, 1, 12])
    for got, want in zip(embedder.embed_batch(batch), reference.embed_batch(batch)):
        assert got.shape == want.shape and np.abs(got - want).max(initial=0.0) <= FP32_BOUND
    assert [a.shape for a in embedder.embed_batch([[], []])] == [(3, 0, 32), (3, 0, 32)]
    one = embedder.embed_sentence(batch[0])
    assert np.abs(one - reference.embed_sentence(batch[0])).max() <= FP32_BOUND
    assert len(list(embedder.embed_sentences(batch, batch_size=3))) == 4
    layers, mask = embedder.elmo_bilm.embed(torch.zeros(0, 4, 50, dtype=torch.long))
    assert layers.shape == (0, 3, 4, 32) and mask.shape == (0, 4)


@pytest.mark.slow
def test_int8_graph_runs_as_a_backend(tiny_files, onnx_graphs):
    embedder = ElmoEmbedder(backend="onnx", onnx_file=onnx_graphs(*tiny_files, quantize="int8"))
    assert embedder.elmo_bilm.quantization == "int8-dynamic-matmul-per-channel-u8u8"
    assert embedder.elmo_bilm.precision == "int8"
    assert embedder.embed_sentence(["An", "int8", "graph"]).shape == (3, 3, 32)


# --- refusals -------------------------------------------------------------------------------------------


def _refused(match: str, **kwargs) -> str:
    with pytest.raises(ElmoFastError) as e:
        ElmoEmbedder(**kwargs)
    message = str(e.value)
    assert "\n" not in message and match in message, message
    return message


def test_bad_combinations_are_refused_in_one_line(tmp_path, tiny_files, onnx_graphs):
    graph = onnx_graphs(*tiny_files)
    _refused("backend='onnx' needs onnx_file", backend="onnx")
    _refused("give it with backend='onnx', not 'fast'", backend="fast", onnx_file=graph)
    _refused("the ONNX file holds the model", backend="onnx", onnx_file=graph, options_file=tiny_files[0])
    _refused("the ONNX file holds the model", backend="onnx", onnx_file=graph, model_dir=tiny_files[0].parent)
    with pytest.raises(ElmoFastError, match=r"backend='onnx' runs on the CPU .*, not cuda:0"):  # needs no GPU
        check_onnx_settings(graph, False, torch.device("cuda:0"), False, "fp32")
    _refused("stateful needs the fast or reference backend", backend="onnx", onnx_file=graph, stateful=True)
    _refused("precision='bf16' is the fast path's arithmetic", backend="onnx", onnx_file=graph, precision="bf16")
    _refused(f"{tmp_path / 'none.onnx'}: ONNX file not found", backend="onnx", onnx_file=tmp_path / "none.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(os.urandom(1000))
    _refused(f"{garbage}: ONNX Runtime cannot load it", backend="onnx", onnx_file=garbage)
    with pytest.raises(ElmoFastError, match="holds no bilm-tf files"):
        ElmoEmbedder(onnx_file=graph).save_model(tmp_path / "saved")


def _graph(path, inputs, outputs):
    """A one-node ONNX graph (Identity or a Cast per output) with these (name, elem type, shape) values."""
    import onnx
    from onnx import TensorProto, helper

    types = {"int64": TensorProto.INT64, "float32": TensorProto.FLOAT}
    nodes = [
        helper.make_node("Cast", [inputs[0][0]], [name], to=types[elem], name=f"to_{name}") for name, elem, _ in outputs
    ]
    graph = helper.make_graph(
        nodes,
        "not-elmo",
        [helper.make_tensor_value_info(n, types[t], s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, types[t], s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    "inputs, outputs, why",
    [
        ([("x", "float32", ["b", "t"])], [("layers", "float32", ["b", 3, "t", 4])], "its inputs"),
        (
            [("char_ids", "int64", ["b", "t", 50])],
            [("layers", "float32", ["b", 3, "t", 4]), ("lengths", "int64", ["b"])],
            "its outputs",
        ),
        (
            # the only ELMo graph published before: batch 1, 8 tokens, fixed
            [("char_ids", "int64", [1, 8, 50])],
            [("layers", "float32", [1, 3, 8, 4]), ("mask", "int64", [1, 8])],
            "char_ids has a fixed batch or time",
        ),
        (
            [("char_ids", "int64", ["b", "t", 50])],
            [("layers", "float32", ["b", "l", "t", 4]), ("mask", "int64", ["b", "t"])],
            "layers",
        ),
    ],
)
def test_a_graph_that_breaks_the_contract_is_refused(tmp_path, inputs, outputs, why):
    path = _graph(tmp_path / "other.onnx", inputs, outputs)
    message = _refused(f"{path}: not an elmo-fast ONNX graph ({why})", backend="onnx", onnx_file=path)
    assert "expected input char_ids int64 [batch, time, 50]" in message and "found inputs" in message


# --- the command line -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_embed_command_with_the_onnx_backend(tmp_path, corpus, tiny_files, onnx_graphs):
    graph = onnx_graphs(*tiny_files)
    got, want = tmp_path / "onnx.h5", tmp_path / "fast.h5"
    r = run_cli("embed", corpus, got, "--all", "--skip-empty", "--backend", "onnx", "--onnx", graph)
    assert r.returncode == 0, r.stderr
    assert "backend onnx" in r.stderr and "bundled" not in r.stderr
    r = run_cli("embed", corpus, want, "--all", "--skip-empty", "--options", tiny_files[0], "--weights", tiny_files[1])
    assert r.returncode == 0, r.stderr
    assert_same_outputs(got, want)


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--backend", "onnx"], "--backend onnx needs --onnx FILE"),
        (["--backend", "fast", "--onnx", "{graph}"], "give it with --backend onnx, not --backend fast"),
        (["--onnx", "{graph}", "--model", "small"], "holds the model: give it without --model"),
        (["--onnx", "{graph}", "--precision", "bf16"], "--precision bf16 is the fast path's arithmetic"),
        (["--onnx", "{graph}", "--stateful"], "--stateful needs the fast or reference backend"),
        (["--onnx", "{missing}"], "ONNX file not found"),
    ],
)
def test_embed_command_refuses_bad_combinations(flags, expected, tmp_path, corpus, tiny_files, onnx_graphs):
    values = {"graph": onnx_graphs(*tiny_files), "missing": tmp_path / "missing.onnx"}
    flags = [f.format(**values) for f in flags]
    r = run_cli("embed", corpus, tmp_path / "out.h5", "--all", *flags)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], r.stderr
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.slow
def test_serve_with_the_onnx_backend(tiny_files, onnx_graphs):
    from serve_process import ServerProcess

    graph = onnx_graphs(*tiny_files)
    embedder = ElmoEmbedder(*tiny_files, backend="fast")
    server = ServerProcess(None, "--backend", "onnx", "--onnx", graph)
    try:
        status, _, body = server.request("GET", "/info")
        assert status == 200, body
        info = json.loads(body)
        assert (info["backend"], info["precision"], info["state_mode"]) == ("onnx", "fp32", "stateless"), info
        sentences = random_batch(np.random.default_rng(13), [7, 1, 30, 2])
        status, _, body = server.post("/embed", {"sentences": sentences, "output": "all"})
        assert status == 200, body
        answer = json.loads(body)
        for s, got in zip(sentences, answer["embeddings"]):
            want = embedder.embed_sentence(s)
            assert np.abs(np.array(got, dtype=np.float32) - want).max() <= FP32_BOUND
    finally:
        assert server.stop() == 0


@pytest.mark.slow
def test_serve_refuses_bad_combinations_before_listening(tiny_files, onnx_graphs):
    for flags, expected in [
        (["--backend", "onnx"], "--backend onnx needs --onnx FILE"),
        (["--onnx", onnx_graphs(*tiny_files), "--precision", "bf16"], "--precision bf16 is the fast path's"),
    ]:
        r = run_cli("serve", "--port", "0", *flags)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], r.stderr
