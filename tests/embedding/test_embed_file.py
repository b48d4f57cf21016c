"""embed_file at corpus scale: streaming, length bucketing, resume after kills, out-of-memory, bad input."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import cli_process
import h5py
import numpy as np
import pytest
import torch
from embed_runs import Killed, _kill_at, _no_cleanup, assert_same_output, contents, random_sentences, write_lines

from elmo_fast import ElmoEmbedder, ElmoFastError, InputError, durable
from elmo_fast.embedding import leftovers, work_area, writers
from elmo_fast.embedding import progress as progress_bars
from elmo_fast.errors import ExtensionNotBuiltError


def cli_flags() -> dict[str, str]:
    """How `elmo-fast embed` names the library's parameters in its messages."""
    from elmo_fast.cli import build_parser

    return build_parser().parse_args(["embed", "in.txt", "out.h5", "--all"]).flags


@pytest.fixture(scope="module")
def tiny(random_models):
    return random_models("tiny", exercise_clips=True)


@pytest.fixture(scope="module")
def embedder(tiny):
    return ElmoEmbedder(*tiny, batch_size=5)


@pytest.mark.slow
def test_bucketing_gives_the_unbucketed_vectors(embedder, tmp_path, monkeypatch):
    rng = random.Random(11)
    sentences = random_sentences(rng, 67)
    sentences[5] = sentences[9]  # a repeated sentence: sentence_to_index keeps its last key, as allennlp
    inp = write_lines(tmp_path / "in.txt", sentences)
    batches = []
    real = ElmoEmbedder.embed_batch

    def spy(self, batch):
        batches.append([len(s) for s in batch])
        return real(self, batch)

    monkeypatch.setattr(ElmoEmbedder, "embed_batch", spy)
    embedder.embed_file(inp, tmp_path / "plain.h5", "all", bucketing=False, progress=False)
    assert [len(b) for b in batches] == [5] * 13 + [2]  # input order, batch_size each
    batches.clear()
    stats = embedder.embed_file(inp, tmp_path / "bucket.h5", "all", window=23, max_tokens_per_batch=40, progress=False)
    assert stats["sentences"] == 67 and stats["tokens"] == sum(len(s.split()) for s in sentences)
    # sorted within each window of 23, cut under 40 padded tokens (one over-long sentence alone)
    assert sum(len(b) for b in batches) == 67
    for b in batches:
        assert len(b) <= 5 and (len(b) == 1 or len(b) * max(b) <= 40) and b == sorted(b)
    assert len(batches) > 14
    assert_same_output(tmp_path / "bucket.h5", tmp_path / "plain.h5", "bucketed vs input order")
    data, mapping = contents(tmp_path / "bucket.h5")
    assert json.loads(mapping) == {s: str(i) for i, s in enumerate(sentences) if i != 5}
    for i in (0, 13, 66):  # and the same as one sentence at a time
        np.testing.assert_allclose(data[str(i)], embedder.embed_sentence(sentences[i].split()), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["top", "average"])
def test_formats_and_keys_when_bucketed(embedder, tmp_path, fmt):
    sentences = random_sentences(random.Random(fmt), 9)
    inp = write_lines(tmp_path / "in.txt", sentences)
    embedder.embed_file(inp, tmp_path / "o.h5", fmt, window=4, progress=False, forget_sentences=True)
    data, mapping = contents(tmp_path / "o.h5")
    assert mapping is None and sorted(data) == sorted(map(str, range(9)))
    for i, s in enumerate(sentences):
        full = embedder.embed_sentence(s.split())
        want = full[-1] if fmt == "top" else np.average(full, axis=0)
        np.testing.assert_allclose(data[str(i)], want, atol=1e-5, rtol=0)
    embedder.embed_file(inp, tmp_path / "k.h5", fmt, window=4, progress=False, use_sentence_keys=True)
    data, mapping = contents(tmp_path / "k.h5")
    assert mapping is None and sorted(data) == sorted(sentences)


@pytest.mark.parametrize("resume", [False, True])
def test_sentence_keys_with_slashes(embedder, tmp_path, resume):
    """As allennlp (h5py's create_dataset): a sentence key "and / or" is a path, read back by the
    sentence itself; a sentence HDF5 cannot name is one clear error, and nothing is left."""
    sentences = ["cats and / or dogs", "1/2 of it", "plain one"]
    inp = write_lines(tmp_path / "in.txt", sentences)
    embedder.embed_file(inp, tmp_path / "k.h5", "top", progress=False, use_sentence_keys=True, resume=resume)
    with h5py.File(tmp_path / "k.h5", "r") as f:
        for s in sentences:
            np.testing.assert_allclose(f[s][()], embedder.embed_sentence(s.split())[-1], atol=1e-5, rtol=0)
    bad = write_lines(tmp_path / "bad.txt", ["fine one", "a b/"])
    with pytest.raises(InputError, match=r"the sentence 'a b/' cannot be a dataset name in HDF5"):
        embedder.embed_file(bad, tmp_path / "bad.h5", "top", progress=False, use_sentence_keys=True, resume=resume)
    assert not (tmp_path / "bad.h5").exists()


def test_stateful_keeps_input_order_and_refuses_bucketing(tiny, tmp_path):
    stateful = ElmoEmbedder(*tiny, batch_size=3, stateful=True)
    sentences = random_sentences(random.Random(5), 14)
    inp = write_lines(tmp_path / "in.txt", sentences)
    for kwargs in ({"max_tokens_per_batch": 100}, {"bucketing": True}):
        with pytest.raises(ElmoFastError, match="stateful mode keeps input order"):
            stateful.embed_file(inp, tmp_path / "no.h5", progress=False, **kwargs)
    # a window of 4 is rounded up to whole batches (6): batches stay 3 consecutive sentences
    stateful.embed_file(inp, tmp_path / "s.h5", window=4, progress=False)
    stateful.elmo_bilm.reset_states()
    want = [x for k in range(0, 14, 3) for x in stateful.embed_batch([s.split() for s in sentences[k : k + 3]])]
    data, _ = contents(tmp_path / "s.h5")
    for i, w in enumerate(want):
        np.testing.assert_array_equal(data[str(i)], w)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "s.h5"]


def _oom_above(limit, error=None):
    """embed_batch that fails like an allocator when a batch has more than `limit` padded tokens."""
    if error is None:
        error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    real = ElmoEmbedder.embed_batch
    seen = []

    def embed_batch(self, batch):
        padded = len(batch) * max(len(s) for s in batch)
        seen.append(padded)
        if padded > limit:
            raise error
        return real(self, batch)

    return embed_batch, seen


def test_out_of_memory_halves_the_batch(embedder, tmp_path, monkeypatch):
    sentences = random_sentences(random.Random(3), 31, lengths=(2, 3, 9, 17))
    inp = write_lines(tmp_path / "in.txt", sentences)
    embedder.embed_file(inp, tmp_path / "ok.h5", "all", progress=False)
    for error in (
        torch.OutOfMemoryError("CUDA out of memory."),
        RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory"),
    ):
        fake, seen = _oom_above(30, error)
        monkeypatch.setattr(ElmoEmbedder, "embed_batch", fake)
        stats = embedder.embed_file(inp, tmp_path / "split.h5", "all", progress=False, bucketing=False)
        assert stats["oom_splits"] > 0 and max(seen) > 30
        # once a batch failed, later ones are cut under half its size instead of failing again
        first_fail = next(i for i, p in enumerate(seen) if p > 30)
        assert sum(p > 30 for p in seen[first_fail + 1 :]) < sum(p <= 30 for p in seen[first_fail + 1 :])
        assert_same_output(tmp_path / "split.h5", tmp_path / "ok.h5", f"split on {type(error).__name__}")


def test_out_of_memory_for_one_sentence_names_its_line(embedder, tiny, tmp_path, monkeypatch):
    inp = write_lines(tmp_path / "in.txt", ["a b", "c", " ".join("w" * 3 for _ in range(40)), "d e f"])
    fake, _ = _oom_above(30)
    monkeypatch.setattr(ElmoEmbedder, "embed_batch", fake)
    with pytest.raises(
        InputError,
        match=r"line 3: its sentence of 40 tokens does not fit in memory on cpu even "
        r"alone \(CUDA out of memory",
    ):
        embedder.embed_file(inp, tmp_path / "o.h5", progress=False)
    stateful = ElmoEmbedder(*tiny, batch_size=4, stateful=True)
    with pytest.raises(
        InputError,
        match=r"lines 1\.\.4 .* stateful mode cannot split a batch: pass a smaller "
        r"batch_size$",
    ) as info:
        stateful.embed_file(inp, tmp_path / "o.h5", progress=False)
    assert info.value.render(cli_flags()).endswith("pass a smaller --batch-size")  # the CLI names its flag
    monkeypatch.setattr(ElmoEmbedder, "embed_batch", lambda self, b: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError, match="^bug$"):  # not memory: not retried, not reworded
        embedder.embed_file(inp, tmp_path / "o.h5", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_ten_thousand_token_sentence_on_cpu(embedder, tmp_path):
    rng = random.Random(7)
    long = [rng.choice(("the", "cat", "sat", "on", "a", "mat", ".", "Über", "x" * 60)) for _ in range(10_000)]
    inp = write_lines(tmp_path / "in.txt", [" ".join(long), "short one"])
    embedder.embed_file(inp, tmp_path / "o.h5", "all", progress=False)
    data, _ = contents(tmp_path / "o.h5")
    assert data["0"].shape == (3, 10_000, 32) and data["1"].shape == (3, 2, 32)
    assert np.isfinite(data["0"]).all()
    # a forward LSTM state only sees the past: the forward halves of a prefix match the prefix alone
    prefix = embedder.embed_sentence(long[:9])
    np.testing.assert_allclose(data["0"][1:, :9, :16], prefix[1:, :, :16], atol=1e-5, rtol=0)
    np.testing.assert_allclose(data["0"][0, :9], prefix[0], atol=1e-5, rtol=0)


def test_lines_are_read_lazily_and_checked_as_they_come(embedder, tmp_path, monkeypatch):
    lines = ["one two", "three", "\u00e9t\u00e9 ok", "four five six"]
    raw = ("\n".join(lines[:2]) + "\nbad \xff\xfe byte\n" + "\n".join(lines[2:]) + "\n").encode("latin-1")
    raw = raw.replace("\u00e9".encode("latin-1"), "\u00e9".encode("utf-8"))
    (tmp_path / "bad.txt").write_bytes(raw)
    with pytest.raises(
        InputError,
        match=r"bad.txt: line 3 is not valid UTF-8 \(invalid start byte at byte 4 of "
        r"the line\).*encoding_errors='replace'",
    ) as info:
        embedder.embed_file(tmp_path / "bad.txt", tmp_path / "o.h5", progress=False)
    assert "pass --encoding-errors replace to" in info.value.render(cli_flags())
    assert not (tmp_path / "o.h5").exists()
    embedder.embed_file(tmp_path / "bad.txt", tmp_path / "o.h5", progress=False, encoding_errors="replace")
    data, mapping = contents(tmp_path / "o.h5")
    assert json.loads(mapping) == {
        "one two": "0",
        "three": "1",
        "bad \ufffd\ufffd byte": "2",
        "\u00e9t\u00e9 ok": "3",
        "four five six": "4",
    }
    # a binary stream (stdin) gives the same; CRLF line ends too
    crlf = write_lines(tmp_path / "crlf.txt", ["one two", "three"], newline="\r\n")
    embedder.embed_file(io.BytesIO(crlf.read_bytes()), tmp_path / "b.h5", progress=False)
    assert json.loads(contents(tmp_path / "b.h5")[1]) == {"one two": "0", "three": "1"}
    # the reader runs ahead of the model by one window only: the bad line stops the run early
    calls = []
    real = ElmoEmbedder.embed_batch
    monkeypatch.setattr(ElmoEmbedder, "embed_batch", lambda self, b: calls.append(1) or real(self, b))
    many = ["word " * (i % 5 + 1) for i in range(40)] + ["", "after"]
    with pytest.raises(InputError, match="line 41 is empty"):
        embedder.embed_file(write_lines(tmp_path / "late.txt", many), tmp_path / "late.h5", window=8, progress=False)
    assert len(calls) == 10  # 5 windows of 8, 2 batches each, then the error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.h5", "bad.txt", "crlf.txt", "late.txt", "o.h5"]


def test_skip_empty_keeps_line_numbers(embedder, tmp_path):
    inp = write_lines(tmp_path / "in.txt", ["", "first line", "  \t ", "second", "", "third one ."])
    with pytest.raises(InputError, match=r"line 1 is empty.*\(skip_empty=True skips such lines\)") as info:
        embedder.embed_file(inp, tmp_path / "o.h5", progress=False)
    assert "(--skip-empty skips such lines)" in info.value.render(cli_flags())
    embedder.embed_file(inp, tmp_path / "o.h5", "top", progress=False, skip_empty=True)
    data, mapping = contents(tmp_path / "o.h5")
    assert json.loads(mapping) == {"first line": "1", "second": "3", "third one .": "5"}
    assert sorted(data) == ["1", "3", "5"]
    np.testing.assert_allclose(data["3"], embedder.embed_sentence(["second"])[-1], atol=1e-5, rtol=0)
    for lines, skip in (([], False), (["", " "], True)):
        with pytest.raises(InputError, match="holds no sentences"):
            embedder.embed_file(
                write_lines(tmp_path / "e.txt", lines), tmp_path / "e.h5", progress=False, skip_empty=skip
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.txt", "in.txt", "o.h5"]


def test_output_checks(embedder, tmp_path):
    inp = write_lines(tmp_path / "in.txt", ["a b"])
    (tmp_path / "o.h5").write_bytes(b"old")
    with pytest.raises(ElmoFastError, match=r"o.h5 already exists; pass overwrite=True") as info:
        embedder.embed_file(inp, tmp_path / "o.h5", progress=False, overwrite=False)
    assert info.value.render(cli_flags()).endswith("o.h5 already exists; pass --overwrite to replace it")
    assert (tmp_path / "o.h5").read_bytes() == b"old"
    embedder.embed_file(inp, tmp_path / "o.h5", progress=False)  # the API replaces by default, as it always did
    assert contents(tmp_path / "o.h5")[0]["0"].shape == (3, 2, 32)
    with pytest.raises(ElmoFastError, match="the output is a folder"):
        embedder.embed_file(inp, tmp_path, progress=False)
    with pytest.raises(ElmoFastError, match="its folder .* does not exist"):
        embedder.embed_file(inp, tmp_path / "none" / "o.h5", progress=False)
    for bad in ({"window": 0}, {"max_tokens_per_batch": 0}, {"batch_size": -1}, {"encoding_errors": "ignore"}):
        with pytest.raises(ElmoFastError, match=next(iter(bad))):
            embedder.embed_file(inp, tmp_path / "x.h5", progress=False, **bad)


def test_cuda_without_cuda_kernels_is_refused_before_any_output(tiny, tmp_path, monkeypatch):
    from elmo_fast.bilm import ops

    e = ElmoEmbedder(*tiny, backend="fast")
    e.device = torch.device("cuda")  # as if a GPU were there, with an extension built without CUDA
    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", False)
    with pytest.raises(ExtensionNotBuiltError, match="CUDA kernels are not available"):
        e.embed_file(write_lines(tmp_path / "in.txt", ["a"]), tmp_path / "o.h5", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize("point", ["3rd shard rename", "after complete, before rename", "after rename", "tearing down"])
@pytest.mark.slow
def test_resume_after_a_kill_at_each_step_of_the_end(embedder, tmp_path, monkeypatch, point):
    sentences = random_sentences(random.Random(point), 40)
    inp = write_lines(tmp_path / "in.txt", sentences)
    embedder.embed_file(inp, tmp_path / "want.h5", window=8, progress=False)
    out = tmp_path / "o.h5"
    work = tmp_path / "o.h5.partial"
    with monkeypatch.context() as m:
        if point == "3rd shard rename":
            _kill_at(
                m, os, "replace", 6
            )  # the manifest's, shard 0's and its record's, shard 1's and its record's, shard 2's
        elif point == "after complete, before rename":
            _no_cleanup(m)
            real_write = durable.write_json

            def write_then_die(path, obj, **kwargs):
                real_write(path, obj, **kwargs)
                if obj.get("complete"):
                    raise Killed

            m.setattr(durable, "write_json", write_then_die)
        elif point == "after rename":
            _kill_at(m, writers, "remove_work_dir", 1)
        else:  # shards 0 and 1 deleted, then killed: the manifest goes last, so it is still there
            _kill_at(m, os, "unlink", 3)
        with pytest.raises(Killed):
            embedder.embed_file(inp, out, window=8, progress=False, resume=True, overwrite=False)
    assert (work / work_area.MANIFEST).exists()
    assert out.exists() == (point in ("after rename", "tearing down"))
    with pytest.raises(ElmoFastError, match="holds an interrupted run .* pass resume=True") as info:
        embedder.embed_file(inp, out, window=8, progress=False)
    assert "pass --resume to continue it" in info.value.render(cli_flags())
    stats = embedder.embed_file(inp, out, window=8, progress=False, resume=True, overwrite=False)
    if point == "3rd shard rename":
        assert stats["resumed_sentences"] == 16 and stats["sentences"] == 24
    assert not work.exists()
    assert_same_output(out, tmp_path / "want.h5", point)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "o.h5", "want.h5"]


def test_resume_refuses_other_settings_or_input(embedder, tmp_path, monkeypatch):
    sentences = random_sentences(random.Random(2), 30)
    inp = write_lines(tmp_path / "in.txt", sentences)
    out = tmp_path / "o.h5"
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 3)
        with pytest.raises(Killed):
            embedder.embed_file(inp, out, "top", window=7, progress=False, resume=True)
    with pytest.raises(ElmoFastError, match=r"the interrupted run differs \(output_format: 'top' then, 'all' now\)"):
        embedder.embed_file(inp, out, "all", window=7, progress=False, resume=True)
    write_lines(inp, sentences[:3] + ["changed line"] + sentences[4:])
    with pytest.raises(
        InputError,
        match=r"in.txt: lines 1\.\.7 are not those the interrupted run embedded into "
        r"shard-000000.h5",
    ):
        embedder.embed_file(inp, out, "top", window=7, progress=False, resume=True)
    # a change after the completed windows is fine: that part was not embedded yet
    write_lines(inp, sentences[:20] + ["changed line"] + sentences[21:])
    embedder.embed_file(inp, out, "top", window=5, progress=False, resume=True)
    embedder.embed_file(inp, tmp_path / "want.h5", "top", window=7, progress=False)
    assert_same_output(out, tmp_path / "want.h5", "resumed after a change past the completed windows")


def test_resume_refuses_other_weights(random_models, tmp_path, monkeypatch):
    a = ElmoEmbedder(*random_models("tiny", seed=1))
    b = ElmoEmbedder(*random_models("tiny", seed=2))
    inp = write_lines(tmp_path / "in.txt", random_sentences(random.Random(9), 12))
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 2)
        with pytest.raises(Killed):
            a.embed_file(inp, tmp_path / "o.h5", window=4, progress=False, resume=True)
    with pytest.raises(ElmoFastError, match=r"the interrupted run differs \(weights: '[0-9a-f]+' then"):
        b.embed_file(inp, tmp_path / "o.h5", window=4, progress=False, resume=True)


def test_stateful_resume_restores_the_states(tiny, tmp_path, monkeypatch):
    sentences = random_sentences(random.Random(4), 23)
    inp = write_lines(tmp_path / "in.txt", sentences)
    e = ElmoEmbedder(*tiny, batch_size=3, stateful=True)
    e.embed_file(inp, tmp_path / "want.h5", window=6, progress=False)
    e.elmo_bilm.reset_states()
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 3)
        with pytest.raises(Killed):
            e.embed_file(inp, tmp_path / "o.h5", window=6, progress=False, resume=True)
    e = ElmoEmbedder(*tiny, batch_size=3, stateful=True)  # a new process: zero states
    stats = e.embed_file(inp, tmp_path / "o.h5", window=6, progress=False, resume=True)
    assert stats["resumed_sentences"] == 12
    # the same batches from the same states (zero states instead differ by ~1 in the first resumed batch);
    # TOL, not bit for bit: the token cache was cold where the uninterrupted run's was warm
    assert_same_output(tmp_path / "o.h5", tmp_path / "want.h5", "stateful, resumed")


def test_a_work_area_left_by_an_earlier_build_resumes(embedder, tmp_path, monkeypatch):
    """Before durable writes, the work area's temporary files were SHARD.h5.tmp and manifest.json.tmp,
    its manifest had no final newline, and a killed assembly left assembling.h5 half-written: such a
    work area is taken up, its leftovers removed, its complete shards kept."""
    sentences = random_sentences(random.Random(31), 30)
    inp = write_lines(tmp_path / "in.txt", sentences)
    embedder.embed_file(inp, tmp_path / "want.h5", window=7, progress=False)
    out, work = tmp_path / "o.h5", tmp_path / "o.h5.partial"
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 3)
        with pytest.raises(Killed):
            embedder.embed_file(inp, out, window=7, progress=False, resume=True)
    for temp in work.glob(".*" + durable.TEMP_SUFFIX):
        temp.unlink()  # this build's leftover, made an earlier build's below
    manifest = work / work_area.MANIFEST
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=1, sort_keys=True))
    for name in ("shard-000014.h5.tmp", "manifest.json.tmp", "assembling.h5"):
        (work / name).write_bytes(b"half written")
    stats = embedder.embed_file(inp, out, window=7, progress=False, resume=True)
    assert stats["resumed_sentences"] == 14
    assert_same_output(out, tmp_path / "want.h5", "resumed from an earlier build's work area")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "o.h5", "want.h5"]


def test_work_dir_leftovers(embedder, tmp_path):
    inp = write_lines(tmp_path / "in.txt", ["a b", "c"])
    work = tmp_path / "o.h5.partial"
    work.mkdir()
    (work / "shard-000000.h5.tmp").write_bytes(b"half written")  # void: no manifest, so removed
    embedder.embed_file(inp, tmp_path / "o.h5", progress=False, resume=True)
    assert not work.exists() and (tmp_path / "o.h5").exists()
    (tmp_path / "p.h5.partial").mkdir()
    (tmp_path / "p.h5.partial" / "notes.txt").write_text("mine")
    with pytest.raises(ElmoFastError, match="holds files elmo-fast did not write \\(notes.txt\\)"):
        embedder.embed_file(inp, tmp_path / "p.h5", progress=False, resume=True)
    assert (tmp_path / "p.h5.partial" / "notes.txt").exists()
    # a run that fails before finishing its first window leaves no work directory
    with pytest.raises(InputError, match="line 2 is empty"):
        embedder.embed_file(
            write_lines(tmp_path / "bad.txt", ["a", ""]), tmp_path / "q.h5", progress=False, resume=True
        )
    assert not (tmp_path / "q.h5.partial").exists()


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume(tiny, tmp_path):
    """The real thing: `elmo-fast embed --resume` SIGKILLed at random moments, then resumed to the end."""
    rng = random.Random()  # fresh moments every run; the seed is in the failure message
    seed = rng.randrange(10**6)
    rng.seed(seed)
    sentences = random_sentences(random.Random(seed), 300)
    inp = write_lines(tmp_path / "in.txt", sentences)
    out = tmp_path / "o.h5"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(
                None,
                [
                    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(writers.__file__)))),
                    os.environ.get("PYTHONPATH"),
                ],
            )
        ),
    }
    common = [
        sys.executable,
        "-m",
        "elmo_fast",
        "embed",
        str(inp),
        "--all",
        "--options",
        str(tiny[0]),
        "--weights",
        str(tiny[1]),
        "--batch-size",
        "4",
        "--window",
        "16",
        "--quiet",
    ]
    # the kill moments scale with a run's time: this environment's children are forked from an interpreter
    # started for it (tests/support/cli_process.py), so start that first, and time a run like the killed ones
    assert cli_process.run([sys.executable, "-c", "pass"], env=env, timeout=120).returncode == 0
    start = time.perf_counter()
    r = cli_process.run(
        common[:5] + [str(tmp_path / "want.h5")] + common[5:], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    whole = time.perf_counter() - start  # kill moments scale with it: the machine may be busy or idle
    args = common[:5] + [str(out)] + common[5:] + ["--resume"]
    kills, shards_seen = 0, []
    for round_ in range(4):
        proc = cli_process.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        time.sleep(whole * (rng.uniform(0.3, 0.8) if round_ == 0 else rng.uniform(0.2, 1.0)))
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.stderr.read().decode()
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        work = tmp_path / "o.h5.partial"
        shards_seen.append(len(list(work.glob("shard-*.h5"))) if work.exists() else -1)
    # to the end (or, if the last round finished, a no-op that recognises the finished run)
    r = cli_process.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, f"seed {seed}: {r.stderr}"
    assert kills >= 1, f"seed {seed}: the run finished before any kill"
    assert not (tmp_path / "o.h5.partial").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "o.h5", "want.h5"], f"seed {seed}"
    assert_same_output(out, tmp_path / "want.h5", f"seed {seed}, kills {kills}, shards kept {shards_seen}")


def test_resume_after_the_run_finished(embedder, tmp_path, monkeypatch):
    """Killed after the work directory was removed (say, while the interpreter shut down): --resume
    recognises the finished run from the record in the output, and only that run."""
    sentences = random_sentences(random.Random(8), 20)
    inp = write_lines(tmp_path / "in.txt", sentences)
    out = tmp_path / "o.h5"
    embedder.embed_file(inp, out, window=6, progress=False, resume=True, overwrite=False)
    assert json.loads(h5py.File(out, "r").attrs[work_area.RUN_RECORD])["output_format"] == "all"
    stamp = out.stat().st_mtime_ns
    stats = embedder.embed_file(inp, out, window=9, progress=False, resume=True, overwrite=False)
    assert stats["sentences"] == 0 and out.stat().st_mtime_ns == stamp
    with pytest.raises(
        ElmoFastError,
        match=r"o.h5 already exists, made by another run \(output_format: 'all' then, "
        r"'top' now\); pass overwrite=True",
    ):
        embedder.embed_file(inp, out, "top", progress=False, resume=True, overwrite=False)
    write_lines(inp, sentences + ["one more"])
    with pytest.raises(ElmoFastError, match=r"in.txt has more lines than it was made from \(line 21\)"):
        embedder.embed_file(inp, out, progress=False, resume=True, overwrite=False)
    write_lines(inp, sentences[:7] + ["changed"] + sentences[8:])
    with pytest.raises(ElmoFastError, match=r"lines 7\.\.12 of .*in.txt are not those it was made from"):
        embedder.embed_file(inp, out, progress=False, resume=True, overwrite=False)
    stats = embedder.embed_file(inp, out, progress=False, resume=True, overwrite=True)  # so: embed it again
    assert stats["sentences"] == 20 and json.loads(contents(out)[1])["changed"] == "7"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "o.h5"]


# --- what the input may be: compressed, with a byte-order mark, or not text at all ----------------


def _compress(kind, data: bytes) -> bytes:
    import bz2
    import gzip
    import lzma

    return {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}[kind](data)


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz"])
@pytest.mark.slow
def test_compressed_input_gives_the_plain_files_output(embedder, tmp_path, kind):
    """Recognised by content: a .txt name, no name (a seekable stream, a pipe), --resume and the bar's count."""
    sentences = random_sentences(random.Random(kind), 37)
    plain = write_lines(tmp_path / "plain.txt", sentences)
    embedder.embed_file(plain, tmp_path / "want.h5", "top", window=8, progress=False)
    packed = tmp_path / "in.txt"  # a name that says nothing of the compression
    packed.write_bytes(_compress(kind, plain.read_bytes()))
    embedder.embed_file(packed, tmp_path / "by_name.h5", "top", window=8, progress=False)
    assert_same_output(tmp_path / "by_name.h5", tmp_path / "want.h5", f"{kind} file")
    embedder.embed_file(io.BytesIO(packed.read_bytes()), tmp_path / "seekable.h5", "top", window=8, progress=False)
    assert_same_output(tmp_path / "seekable.h5", tmp_path / "want.h5", f"{kind} seekable stream")
    r, w = os.pipe()
    with open(w, "wb") as f:
        f.write(packed.read_bytes()[:3])  # a pipe that gives the magic bytes one read at a time
    with open(r, "rb") as pipe:
        embedder.embed_file(
            _Trickle(pipe, packed.read_bytes()[3:]), tmp_path / "pipe.h5", "top", window=8, progress=False
        )
    assert_same_output(tmp_path / "pipe.h5", tmp_path / "want.h5", f"{kind} pipe")
    assert progress_bars.TokenCount(str(packed)).wait() == sum(len(s.split()) for s in sentences)


class _Trickle(io.RawIOBase):
    """A stream that cannot seek and hands out a few bytes per read (what a slow pipe does)."""

    def __init__(self, first, rest: bytes) -> None:
        self.first, self.rest = first, rest

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self.first.read(2) if self.first is not None else b""
        if not data:
            self.first = None
            data, self.rest = self.rest[:5], self.rest[5:]
        buffer[: len(data)] = data
        return len(data)


def test_resume_reads_compressed_input_again(embedder, tmp_path, monkeypatch):
    sentences = random_sentences(random.Random(21), 30)
    inp = tmp_path / "in.gz"
    inp.write_bytes(_compress("gzip", "".join(s + "\n" for s in sentences).encode()))
    embedder.embed_file(inp, tmp_path / "want.h5", window=7, progress=False)
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 3)
        with pytest.raises(Killed):
            embedder.embed_file(inp, tmp_path / "o.h5", window=7, progress=False, resume=True)
    stats = embedder.embed_file(inp, tmp_path / "o.h5", window=7, progress=False, resume=True)
    assert stats["resumed_sentences"] == 14
    assert_same_output(tmp_path / "o.h5", tmp_path / "want.h5", "resumed from gzip input")


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz"])
def test_damaged_compressed_input_is_named_never_decoded_as_text(embedder, tmp_path, kind):
    data = _compress(kind, "".join(s + "\n" for s in random_sentences(random.Random(4), 400)).encode())
    (tmp_path / "cut.txt").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=rf"cut.txt: the {kind} data is corrupt or truncated after line \d+ \(") as e:
        embedder.embed_file(tmp_path / "cut.txt", tmp_path / "o.h5", progress=False, encoding_errors="replace")
    assert "replace" not in str(e.value)
    damaged = bytearray(data)
    damaged[len(damaged) // 2 : len(damaged) // 2 + 8] = b"\x00" * 8
    (tmp_path / "bad.txt").write_bytes(bytes(damaged))
    # the checksum comes at the end: before it, damaged data may decompress into bytes that are no text
    for errors in ("strict", "replace"):
        with pytest.raises(
            InputError,
            match=rf"bad.txt: (the {kind} data is corrupt or truncated after line \d+|"
            rf"line \d+ \(after {kind} decompression\) (is not valid UTF-8|holds "
            rf"a NUL byte))",
        ) as e:
            embedder.embed_file(tmp_path / "bad.txt", tmp_path / "o.h5", progress=False, encoding_errors=errors)
        assert "replace" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "cut.txt"]


@pytest.mark.parametrize(
    "data,message",
    [
        (b"(\xb5/\xfd\x00\x00", r"x.txt is zstd-compressed, not text: .*\(zstd -d\)"),
        (b"PK\x03\x04rest", r"x.txt is a zip archive, not text"),
        (b"\x89HDF\r\n\x1a\n\x00\x00", r"x.txt is an HDF5 file, not text"),
        (b"a line\nnul \x00 inside\n", r"x.txt: line 2 holds a NUL byte: this is binary data, not text"),
    ],
)
def test_input_that_is_not_text_is_named(embedder, tmp_path, data, message):
    (tmp_path / "x.txt").write_bytes(data)
    for errors in ("strict", "replace"):  # never read as text, whatever the encoding errors say
        with pytest.raises(InputError, match=message):
            embedder.embed_file(tmp_path / "x.txt", tmp_path / "o.h5", progress=False, encoding_errors=errors)
    assert os.listdir(tmp_path) == ["x.txt"]


def test_text_inside_a_compressed_file_must_be_utf8(embedder, tmp_path):
    (tmp_path / "in.gz").write_bytes(_compress("gzip", b"fine\nlatin \xe9t\xe9\n"))
    with pytest.raises(InputError, match=r"in.gz: line 2 \(after gzip decompression\) is not valid UTF-8") as e:
        embedder.embed_file(tmp_path / "in.gz", tmp_path / "o.h5", progress=False)
    assert "replace" not in str(e.value)  # a tar.gz holds bytes, not text: U+FFFD would embed garbage


def test_a_leading_byte_order_mark_is_no_part_of_the_first_token(embedder, tmp_path):
    sentences = ["\ufeffstarts with a mark", "one \ufeff inside", "third"]
    bom = write_lines(tmp_path / "bom.txt", sentences)
    plain = write_lines(tmp_path / "plain.txt", [sentences[0][1:]] + sentences[1:])
    for keys in (False, True):
        embedder.embed_file(plain, tmp_path / "want.h5", progress=False, use_sentence_keys=keys)
        for source in (
            bom,
            io.BytesIO(bom.read_bytes()),
            io.StringIO(bom.read_text(encoding="utf-8")),
            tmp_path / "bom.gz",
        ):
            if source == tmp_path / "bom.gz":
                source.write_bytes(_compress("gzip", bom.read_bytes()))
            embedder.embed_file(source, tmp_path / "o.h5", progress=False, use_sentence_keys=keys)
            assert_same_output(tmp_path / "o.h5", tmp_path / "want.h5", f"BOM via {type(source).__name__}")
    data, mapping = contents(tmp_path / "o.h5")
    assert "starts with a mark" in data and "one \ufeff inside" in data  # only the leading one goes
    assert progress_bars.TokenCount(str(bom)).wait() == 4 + 3 + 1  # the inner mark is a token: it is no whitespace


# --- the progress bar counts tokens ---------------------------------------------------------------


def test_the_bar_counts_tokens_and_ends_at_its_total(embedder, tmp_path, monkeypatch):
    """Bucketing runs short sentences first: a bar of lines would run fast, then crawl. The total is
    counted in the background; the bar ends where its total says, skipped lines and resumed windows
    included."""
    bars = []
    real = progress_bars.progress_bar

    def spy(total, initial, progress):
        bar = real(total, initial, progress)
        bars.append(bar)
        return bar

    monkeypatch.setattr(progress_bars, "progress_bar", spy)
    sentences = random_sentences(random.Random(12), 50)
    sentences[7] = "   "
    sentences[20] = "spaces\u3000ideographic and\u00a0no-break\x1fseparator"  # whitespace to str.split
    inp = write_lines(tmp_path / "in.txt", ["\ufeff" + sentences[0]] + sentences[1:], newline="\r\n")
    tokens = sum(len(s.split()) for s in sentences)
    stats = embedder.embed_file(inp, tmp_path / "o.h5", window=8, skip_empty=True)
    assert stats["tokens"] == tokens
    assert bars[-1].total == bars[-1].n == tokens
    # resumed: the bar starts at the tokens done before
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 3)
        with pytest.raises(Killed):
            embedder.embed_file(inp, tmp_path / "r.h5", window=8, skip_empty=True, resume=True, progress=False)
    done = sum(len(s.split()) for s in sentences[:17])  # 2 windows of 8 sentences, the blank line skipped
    embedder.embed_file(inp, tmp_path / "r.h5", window=8, skip_empty=True, resume=True)
    assert bars[-1].initial == done and bars[-1].total == bars[-1].n == tokens


def test_stale_temporary_files_only_ours_and_only_when_their_process_is_gone(embedder, tmp_path):
    """Files of our exact patterns for this output (today's durable names, and those of earlier builds),
    made on this host by a process that is gone, are removed; the others are named (those of live
    processes, other hosts, elmo-fast 0.1) or ignored."""

    host = durable.host_tag()
    gone = cli_process.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()  # a process that has exited: its id is free
    names = {
        "dead": f".o.h5.{host}-{gone}.0123abcd.elmo-tmp",
        "dead list": f".o.h5.{host}-{gone}.0123abcd.sentences.elmo-tmp",
        "dead, earlier build": f".o.h5.{host}-{gone}.0123abcd.partial",
        "dead list, earlier build": f".o.h5.{host}-{gone}.0123abcd.sentences",
        "alive": f".o.h5.{host}-{os.getppid()}.89abcdef.elmo-tmp",
        "elsewhere": f".o.h5.another-node-{gone}.0123abcd.partial",
        "0.1": ".o.h5.k2j_9x0a.partial",  # mkstemp's, without an owner
        "other output": f".o.h5.old.{host}-{gone}.0123abcd.elmo-tmp",
        "other output, earlier build": f".o.h5.old.{host}-{gone}.0123abcd.partial",
        "not ours": f".o.h5.{host}-{gone}.0123abcd.partial.bak",
    }
    for n in names.values():
        (tmp_path / n).write_bytes(b"x")
    inp = write_lines(tmp_path / "in.txt", ["a b"])
    r = cli_process.run(
        [sys.executable, "-c", "import os, sys; os.kill(int(sys.argv[1]), 0)", gone], capture_output=True
    )
    assert r.returncode != 0, "the exited process's id was taken again: rerun"
    removed, left = leftovers.stale_temp_files(str(tmp_path / "o.h5"), remove=False)
    assert removed == [] and len(left) == 7
    stats = embedder.embed_file(inp, tmp_path / "o.h5", progress=False)
    assert stats["sentences"] == 1
    remaining = {p.name for p in tmp_path.iterdir()}
    assert remaining == {"in.txt", "o.h5"} | {
        names[k] for k in ("alive", "elsewhere", "0.1", "other output", "other output, earlier build", "not ours")
    }
    _, left = leftovers.stale_temp_files(str(tmp_path / "o.h5"))
    assert sorted(w.split(" (", 1)[1] for w in left) == sorted(
        [
            f"left by elmo-fast 0.1, which does not name its process: remove it if no run is writing {tmp_path / 'o.h5'})",
            f"made on host another-node: remove it if no run there is writing {tmp_path / 'o.h5'})",
            f"process {os.getppid()} is running: another run writing {tmp_path / 'o.h5'}?)",
        ]
    )


RAW_TEXT = [
    "\ufeffI don't think John's car costs $1,000.50 (e.g. in the U.S.)...",
    "Hello, world!",
    'She said "state-of-the-art" -- see https://example.org/a?b=1.',
    "Can't stop; won't stop.",
    "x",
]


def test_tokenize_embeds_raw_text_as_its_tokenized_twin(embedder, tmp_path, monkeypatch):
    """tokenize=True: the vectors of the tokenizer's tokens, keys and sentence_to_index the raw lines
    (as written, BOM dropped), the bar's total the tokenizer's count."""
    from elmo_fast.tokenizer import tokenize_line

    raw = [line.lstrip("\ufeff") for line in RAW_TEXT]
    tokens = [tokenize_line(line) for line in raw]
    assert all(len(t) > len(line.split()) for t, line in zip(tokens[:4], raw))  # the test means something
    inp = write_lines(tmp_path / "raw.txt", RAW_TEXT)
    twin = write_lines(tmp_path / "tok.txt", [" ".join(t) for t in tokens])
    bars = []
    real = progress_bars.progress_bar
    monkeypatch.setattr(progress_bars, "progress_bar", lambda *a: bars.append(real(*a)) or bars[-1])
    stats = embedder.embed_file(inp, tmp_path / "raw.h5", window=2, tokenize=True)
    assert stats["tokens"] == bars[-1].total == bars[-1].n == sum(map(len, tokens))
    embedder.embed_file(twin, tmp_path / "tok.h5", window=2, progress=False)
    with h5py.File(tmp_path / "raw.h5", "r") as a, h5py.File(tmp_path / "tok.h5", "r") as b:
        for i, t in enumerate(tokens):
            assert a[str(i)].shape[1] == len(t)
            np.testing.assert_array_equal(a[str(i)][()], b[str(i)][()])
        assert json.loads(a["sentence_to_index"][0]) == {line: str(i) for i, line in enumerate(raw)}
    # without it, the same raw file is whitespace-split: other tokens
    embedder.embed_file(inp, tmp_path / "plain.h5", window=2, progress=False)
    with h5py.File(tmp_path / "plain.h5", "r") as f:
        assert f["0"].shape[1] == len(raw[0].split())


def test_resume_refuses_a_change_of_tokenize(embedder, tmp_path, monkeypatch):
    inp = write_lines(tmp_path / "raw.txt", RAW_TEXT * 3)
    out = tmp_path / "o.h5"
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 1)
        with pytest.raises(Killed):
            embedder.embed_file(inp, out, window=4, progress=False, resume=True, tokenize=True)
    with pytest.raises(ElmoFastError, match=r"the interrupted run differs \(tokenize: True then, False now\)"):
        embedder.embed_file(inp, out, window=4, progress=False, resume=True)
    embedder.embed_file(inp, out, window=4, progress=False, resume=True, tokenize=True)
    embedder.embed_file(inp, tmp_path / "want.h5", window=4, progress=False, tokenize=True)
    assert_same_output(out, tmp_path / "want.h5", "resumed with tokenize")
    with pytest.raises(ElmoFastError, match=r"made by another run \(tokenize: True then, False now\)"):
        embedder.embed_file(inp, out, window=4, progress=False, resume=True, overwrite=False)
