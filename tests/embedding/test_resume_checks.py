"""--resume trusts only what it verifies: each saved window (shard) has a completion record written
after it (size, SHA-256), the manifest and the records carry their own check, and the assembled output
is checked before its rename. Whatever is damaged is redone, with a note on stderr; the resumed output
equals a clean run's, dataset for dataset, bit for bit."""

from __future__ import annotations

import json
import os
import random

import h5py
import numpy as np
import pytest
from embed_runs import Killed, _kill_at, random_sentences, write_lines

from elmo_fast import ElmoEmbedder
from elmo_fast.embedding import shard_records, work_area, writers

WINDOW = 6
N_SENTENCES = 27  # windows of 6: shards at 0, 6, 12, 18, 24


@pytest.fixture(scope="module")
def embedder(random_models):
    # no token cache: a resumed run computes each window's tokens in the same batches as a clean run,
    # so the vectors are equal bit for bit (with the cache, a cached token's rounding may differ by ~1e-7)
    return ElmoEmbedder(*random_models("tiny", exercise_clips=True), batch_size=4, token_cache_mb=0)


@pytest.fixture(scope="module")
def clean(embedder, tmp_path_factory):
    d = tmp_path_factory.mktemp("clean")
    inp = write_lines(d / "in.txt", random_sentences(random.Random(5), N_SENTENCES))
    embedder.embed_file(inp, d / "want.h5", window=WINDOW, progress=False)
    return inp, d / "want.h5"


def datasets(path) -> dict:
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def assert_identical(path, want_path):
    got, want = datasets(path), datasets(want_path)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key


def interrupted(embedder, inp, out, monkeypatch, windows_done=4):
    """A resumable run stopped (as by kill -9) after ``windows_done`` windows were saved."""
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", windows_done + 1)
        with pytest.raises(Killed):
            embedder.embed_file(inp, out, window=WINDOW, progress=False, resume=True)
    work = out.parent / (out.name + ".partial")
    assert sorted(p.name for p in work.glob("shard-*.h5")) == [work_area.shard_name(6 * k) for k in range(windows_done)]
    return work


def flip_a_byte(path, where=0.5):
    data = bytearray(path.read_bytes())
    i = int(len(data) * where)
    data[i] ^= 0x5A
    path.write_bytes(bytes(data))


DAMAGE = {
    "shard truncated": lambda w: os.truncate(w / "shard-000006.h5", (w / "shard-000006.h5").stat().st_size // 2),
    "bytes flipped in a shard's vectors": lambda w: flip_a_byte(w / "shard-000012.h5", 0.6),
    "shard deleted": lambda w: (w / "shard-000000.h5").unlink(),
    "completion record deleted": lambda w: (w / "shard-000018.h5.done").unlink(),
    "completion record not JSON": lambda w: (w / "shard-000006.h5.done").write_text('{"shard": "shard-0'),
    "completion record edited": lambda w: (w / "shard-000012.h5.done").write_text(
        (w / "shard-000012.h5.done").read_text().replace('"n": 6', '"n": 5')
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_saved_window_is_redone_never_trusted(embedder, clean, tmp_path, monkeypatch, capsys, damage):
    inp, want = clean
    out = tmp_path / "o.h5"
    work = interrupted(embedder, inp, out, monkeypatch)
    DAMAGE[damage](work)
    capsys.readouterr()
    stats = embedder.embed_file(inp, out, window=WINDOW, progress=False, resume=True)
    err = capsys.readouterr().err
    assert stats["resumed_sentences"] == 3 * WINDOW, damage  # one window of four redone, the other three kept
    assert stats["sentences"] == N_SENTENCES - 3 * WINDOW
    notes = [line for line in err.splitlines() if line.startswith("elmo-fast: note: ")]
    assert len(notes) == 1 and "will be embedded again" in notes[0], err
    assert_identical(out, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.h5"]


@pytest.mark.parametrize("how", ["not JSON", "a value edited", "emptied"])
def test_a_damaged_manifest_starts_over(embedder, clean, tmp_path, monkeypatch, capsys, how):
    inp, want = clean
    out = tmp_path / "o.h5"
    work = interrupted(embedder, inp, out, monkeypatch)
    manifest = work / work_area.MANIFEST
    if how == "not JSON":
        flip_a_byte(manifest, 0.0)
    elif how == "a value edited":  # still JSON, still the same keys: only its check tells
        manifest.write_text(manifest.read_text().replace('"output_format": "all"', '"output_format": "top"'))
    else:
        manifest.write_text("")
    capsys.readouterr()
    stats = embedder.embed_file(inp, out, window=WINDOW, progress=False, resume=True)
    err = capsys.readouterr().err
    assert "manifest.json is damaged, so nothing in" in err and "starting over" in err, err
    assert stats["resumed_sentences"] == 0 and stats["sentences"] == N_SENTENCES
    assert_identical(out, want)


def test_without_resume_a_damaged_work_area_is_still_refused(embedder, clean, tmp_path, monkeypatch):
    inp, _ = clean
    out = tmp_path / "o.h5"
    work = interrupted(embedder, inp, out, monkeypatch)
    (work / work_area.MANIFEST).write_text("garbage")
    with pytest.raises(
        ValueError,
        match=r"holds an interrupted run \(4 window\(s\) done, its manifest damaged\); "
        r"pass resume=True",
    ):
        embedder.embed_file(inp, out, window=WINDOW, progress=False)


def test_a_stateful_run_keeps_only_the_unbroken_start(random_models, tmp_path, monkeypatch, capsys):
    """A window's LSTM states come from the window before: a damaged window takes every later one with it."""
    e = ElmoEmbedder(*random_models("tiny"), batch_size=3, stateful=True, token_cache_mb=0)
    inp = write_lines(tmp_path / "in.txt", random_sentences(random.Random(7), 24))
    e.embed_file(inp, tmp_path / "want.h5", window=WINDOW, progress=False)
    out = tmp_path / "o.h5"
    e = ElmoEmbedder(*random_models("tiny"), batch_size=3, stateful=True, token_cache_mb=0)
    work = interrupted(e, inp, out, monkeypatch, windows_done=3)
    flip_a_byte(work / "shard-000006.h5", 0.7)
    capsys.readouterr()
    e = ElmoEmbedder(*random_models("tiny"), batch_size=3, stateful=True, token_cache_mb=0)  # a new process
    stats = e.embed_file(inp, out, window=WINDOW, progress=False, resume=True)
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(notes) == 2 and "shard-000006.h5" in notes[0] and "shard-000012.h5" in notes[1], notes
    assert stats["resumed_sentences"] == WINDOW
    assert_identical(out, tmp_path / "want.h5")


def test_an_assembled_output_that_does_not_match_its_record_is_assembled_again(
    embedder, clean, tmp_path, monkeypatch, capsys
):
    """Killed after the output was assembled and recorded, before its rename: the next run checks it."""
    from elmo_fast import durable

    inp, want = clean
    out = tmp_path / "o.h5"
    with monkeypatch.context() as m:
        _kill_at(m, durable, "move", 1)
        with pytest.raises(Killed):
            embedder.embed_file(inp, out, window=WINDOW, progress=False, resume=True)
    work = tmp_path / "o.h5.partial"
    manifest = json.loads((work / work_area.MANIFEST).read_text())
    assert manifest["complete"] and manifest["assembled"]["bytes"] == (work / work_area.ASSEMBLING).stat().st_size
    flip_a_byte(work / work_area.ASSEMBLING, 0.8)
    capsys.readouterr()
    embedder.embed_file(inp, out, window=WINDOW, progress=False, resume=True)
    assert "does not match the record of the assembled output" in capsys.readouterr().err
    assert_identical(out, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.h5"]


def test_records_hold_what_they_cover_and_the_files_checksum(embedder, clean, tmp_path, monkeypatch):
    inp, _ = clean
    work = interrupted(embedder, inp, tmp_path / "o.h5", monkeypatch, windows_done=2)
    record = json.loads((work / "shard-000006.h5.done").read_text())
    size, sha = shard_records.file_checksum(str(work / "shard-000006.h5"))
    assert record["bytes"] == size and record["sha256"] == sha and record["start"] == 6 and record["n"] == 6
    assert shard_records.unseal(record) is not None and shard_records.unseal({**record, "n": 5}) is None
    # the record is written after the shard is whole: a kill between the two leaves a shard without one
    assert [s["name"] for s in work_area.list_shards(str(work))] == ["shard-000000.h5", "shard-000006.h5"]
