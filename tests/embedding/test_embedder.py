"""ElmoEmbedder and embed_file: allennlp's API and HDF5 layout."""

import json

import h5py
import numpy as np
import pytest

from elmo_fast import ElmoEmbedder, ElmoFastError, InputError

SENTENCES = [
    "The cat sat on the mat .",
    "Hello !",
    "A much longer sentence , with commas , runs on and on here .",
    "über 東京 👨\u200d👩\u200d👧",
]


@pytest.fixture(scope="module")
def embedder(random_models):
    return ElmoEmbedder(*random_models("tiny", exercise_clips=True), batch_size=2)


def test_embed_sentence_shape_and_dtype(embedder):
    out = embedder.embed_sentence(SENTENCES[0].split())
    assert out.shape == (3, 7, 32) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0, :, :16], out[0, :, 16:])  # layer 0 duplicated, as allennlp


def test_embed_batch_and_sentences_keep_order(embedder):
    toks = [s.split() for s in SENTENCES]
    one_by_one = [embedder.embed_sentence(t) for t in toks]
    for got, want in zip(embedder.embed_batch(toks), one_by_one):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    got = list(embedder.embed_sentences(iter(toks), batch_size=3))
    assert [g.shape[1] for g in got] == [len(t) for t in toks]
    for g, want in zip(got, one_by_one):
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)


def test_empty_inputs(embedder):
    assert embedder.embed_batch([]) == []
    assert embedder.embed_sentence([]).shape == (3, 0, 32)
    out = embedder.embed_batch([["a", "b"], [], ["c"]])
    assert [o.shape for o in out] == [(3, 2, 32), (3, 0, 32), (3, 1, 32)]
    assert list(embedder.embed_sentences([])) == []


def test_string_instead_of_tokens_is_refused(embedder):
    with pytest.raises(InputError, match="split it first"):
        embedder.embed_sentence("The cat sat")
    with pytest.raises(ValueError):
        embedder.embed_batch(["The cat", ["ok"]])


def test_bad_arguments(random_models):
    files = random_models("tiny")
    with pytest.raises(ElmoFastError, match="batch_size"):
        ElmoEmbedder(*files, batch_size=0)
    with pytest.raises(ElmoFastError, match="backend"):
        ElmoEmbedder(*files, backend="nope")
    with pytest.raises(ElmoFastError, match="device"):
        ElmoEmbedder(*files, device="tpu")


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["all", "top", "average"])
def test_embed_file_layout(embedder, tmp_path, fmt):
    inp = _write_lines(tmp_path / "in.txt", ["  " + SENTENCES[0] + "  "] + SENTENCES[1:])
    out = tmp_path / "out.hdf5"
    stats = embedder.embed_file(str(inp), out, output_format=fmt, progress=False)
    assert stats["sentences"] == len(SENTENCES)
    with h5py.File(out, "r") as f:
        assert set(f.keys()) == {str(i) for i in range(len(SENTENCES))} | {"sentence_to_index"}
        mapping = json.loads(f["sentence_to_index"][0])
        assert mapping == {s: str(i) for i, s in enumerate(SENTENCES)}
        for i, s in enumerate(SENTENCES):
            full = embedder.embed_sentence(s.split())
            want = {"all": full, "top": full[-1], "average": full.mean(axis=0)}[fmt]
            assert f[str(i)].dtype == np.float32
            assert f[str(i)].shape == want.shape
            np.testing.assert_allclose(f[str(i)][...], want, atol=1e-5, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5"]


def test_embed_file_sentence_keys(embedder, tmp_path):
    inp = _write_lines(tmp_path / "in.txt", SENTENCES[:2])
    out = tmp_path / "out.hdf5"
    embedder.embed_file(inp, out, output_format="top", use_sentence_keys=True, progress=False)
    with h5py.File(out, "r") as f:
        assert set(f.keys()) == set(SENTENCES[:2])
    dup = _write_lines(tmp_path / "dup.txt", [SENTENCES[0], SENTENCES[1], SENTENCES[0]])
    with pytest.raises(InputError, match="line 3"):
        embedder.embed_file(dup, tmp_path / "dup.hdf5", use_sentence_keys=True, progress=False)
    assert not (tmp_path / "dup.hdf5").exists()


def test_embed_file_errors_leave_no_output(embedder, tmp_path):
    inp = _write_lines(tmp_path / "in.txt", ["one", "two", "   ", "four"])
    with pytest.raises(InputError, match="line 3 is empty"):
        embedder.embed_file(inp, tmp_path / "out.hdf5", progress=False)
    with pytest.raises(InputError, match="no sentences"):
        embedder.embed_file(_write_lines(tmp_path / "empty.txt", []), tmp_path / "out.hdf5", progress=False)
    with pytest.raises(ElmoFastError, match="does not exist"):
        embedder.embed_file(_write_lines(tmp_path / "ok.txt", ["ok"]), tmp_path / "nodir" / "out.hdf5", progress=False)
    with pytest.raises(ElmoFastError, match="output_format"):
        embedder.embed_file(tmp_path / "ok.txt", tmp_path / "out.hdf5", output_format="median", progress=False)
    with pytest.raises(InputError, match="not found"):
        embedder.embed_file(tmp_path / "missing.txt", tmp_path / "out.hdf5", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "in.txt", "ok.txt"]


def test_interrupted_embed_file_leaves_nothing(embedder, tmp_path, monkeypatch):
    inp = _write_lines(tmp_path / "in.txt", SENTENCES)
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"previous run")
    real = ElmoEmbedder.embed_batch
    calls = []

    def dying(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:  # after one batch was written
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(ElmoEmbedder, "embed_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        embedder.embed_file(inp, out, progress=False)
    assert calls == [2, 2]
    assert out.read_bytes() == b"previous run"  # untouched: the new file never replaced it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5"]


def test_allennlp_device_conventions(random_models):
    """allennlp 0.9's ElmoEmbedder(options, weights, cuda_device=-1), the int also as the third positional
    argument and as device=: -1 is the CPU, N >= 0 is cuda:N; the same ints work for Elmo and HubElmo."""
    import torch

    from elmo_fast import Elmo, HubElmo
    from elmo_fast.devices import resolve_device

    files = random_models("tiny")
    want = ElmoEmbedder(*files, device="cpu").embed_sentence(["a", "b"])
    for embedder in (ElmoEmbedder(*files, -1), ElmoEmbedder(*files, cuda_device=-1), ElmoEmbedder(*files, device=-1)):
        assert embedder.device == torch.device("cpu")
        np.testing.assert_array_equal(embedder.embed_sentence(["a", "b"]), want)
    assert Elmo(*files, 1, device=-1)._elmo_lstm.device == torch.device("cpu")
    assert HubElmo(*files, device=-1).elmo_bilm.device == torch.device("cpu")
    if torch.cuda.is_available():
        assert ElmoEmbedder(*files, 0).device == ElmoEmbedder(*files, cuda_device=0).device == torch.device("cuda:0")
    else:
        for make in (
            lambda: ElmoEmbedder(*files, 0),
            lambda: ElmoEmbedder(*files, cuda_device=1),
            lambda: Elmo(*files, 1, device=0),
        ):
            with pytest.raises(ElmoFastError, match=r"device 'cuda:[01]' requested, but torch sees no CUDA GPU"):
                make()
    with pytest.raises(ElmoFastError, match=r"invalid device -2: as an int, -1 is the CPU and N >= 0 the GPU cuda:N"):
        ElmoEmbedder(*files, -2)
    with pytest.raises(ElmoFastError, match=r"give device or cuda_device, not both \(got 'cuda:3' and -1\)"):
        ElmoEmbedder(*files, "cuda:3", cuda_device=-1)
    with pytest.raises(ElmoFastError, match="invalid device"):
        resolve_device(True)  # a bool is no device index
