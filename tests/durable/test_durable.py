"""elmo_fast.durable: the one write path. A file under its final name is whole; a failure leaves the
old file (or none), no temporary file, and a one-line WriteError naming the file and the OS error."""

from __future__ import annotations

import errno
import json
import os

import cli_process
import h5py
import numpy as np
import pytest
import torch

from elmo_fast import durable
from elmo_fast.durable import WriteError


class _FailingFile:
    """A file whose writes fail with ``code`` once ``budget`` bytes went through."""

    def __init__(self, f, code: int, budget: int) -> None:
        self._f, self._code, self._budget = f, code, budget

    def write(self, data):
        if len(data) > self._budget:
            raise OSError(self._code, os.strerror(self._code))
        self._budget -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def failing_open(monkeypatch, code: int, budget: int) -> None:
    real = durable.file_writers._open
    monkeypatch.setattr(durable.file_writers, "_open", lambda *a, **k: _FailingFile(real(*a, **k), code, budget))


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(durable.TEMP_SUFFIX))


def test_writes_land_whole_under_their_final_names(tmp_path):
    durable.write_json(tmp_path / "a.json", {"x": [1, 2]})
    durable.write_text(tmp_path / "b.txt", "héllo\n")
    durable.write_bytes(tmp_path / "c.bin", b"\x00\x01")
    with durable.durable_hdf5(tmp_path / "d.hdf5") as f:
        f.create_dataset("w", data=np.arange(6, dtype=np.float32).reshape(2, 3))
    durable.save_torch({"t": torch.arange(3)}, tmp_path / "e.pt")
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": [1, 2]}
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "c.bin").read_bytes() == b"\x00\x01"
    with h5py.File(tmp_path / "d.hdf5", "r") as f:
        np.testing.assert_array_equal(f["w"][...], np.arange(6).reshape(2, 3))
    assert torch.load(tmp_path / "e.pt")["t"].tolist() == [0, 1, 2]
    assert _leftovers(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "d.hdf5").st_mode & 0o777 == 0o666 & ~umask


def test_an_error_in_the_body_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(KeyError):
        with durable.durable_open(target) as f:
            f.write("new, half")
            raise KeyError("boom")
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_a_failing_os_call_is_a_one_line_write_error(tmp_path, monkeypatch, code, where):
    target = tmp_path / "out.json"
    target.write_text("old")

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    if where == "write":
        failing_open(monkeypatch, code, budget=1000)
    else:
        monkeypatch.setattr(os, where, fail)
    with pytest.raises(WriteError) as info:
        durable.write_json(target, {"a": "b" * 100_000})
    message = str(info.value)
    assert "\n" not in message and str(target) in message and errno.errorcode[code] in message
    assert info.value.errno == code
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_torch_save_on_a_full_disk_is_a_write_error(tmp_path, monkeypatch, code):
    failing_open(monkeypatch, code, budget=100_000)
    with pytest.raises(WriteError, match=errno.errorcode[code]):
        durable.save_torch({"w": torch.randn(1000, 100)}, tmp_path / "ckpt.pt")
    monkeypatch.undo()
    assert not (tmp_path / "ckpt.pt").exists()
    assert _leftovers(tmp_path) == []


def test_check_writable_names_the_problem_before_any_work(tmp_path):
    with pytest.raises(WriteError, match="does not exist"):
        durable.check_writable(tmp_path / "missing" / "out.hdf5")
    with pytest.raises(WriteError, match=r"file name too long \(261 bytes; at most 255 here\)$"):
        durable.check_writable(tmp_path / ("x" * 256 + ".hdf5"))
    assert durable.check_writable(tmp_path / ("x" * 250 + ".hdf5"))  # legal (<= NAME_MAX): its temporary name fits
    with pytest.raises(WriteError, match="is a folder"):
        durable.check_writable(tmp_path)
    assert durable.check_writable(tmp_path / "ok.hdf5") == str(tmp_path / "ok.hdf5")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(WriteError, match="EACCES"):
            durable.check_writable(ro / "out.hdf5")


def test_sweep_removes_dead_runs_temp_files_only(tmp_path):
    import sys

    dead = cli_process.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    mine = durable.temp_path(tmp_path / "out.hdf5")
    theirs = mine.replace(f"-{os.getpid()}.", f"-{dead}.")
    other_host = os.path.join(tmp_path, f".out.hdf5.otherhost-{dead}.0123abcd{durable.TEMP_SUFFIX}")
    unrelated = tmp_path / ".out.hdf5.tmp"
    for p in (mine, theirs, other_host, unrelated):
        open(p, "w").close()
    assert durable.sweep_temp_files(tmp_path, "out.hdf5") == [theirs]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (mine, other_host, unrelated))
    assert durable.parse_temp_name(os.path.basename(mine))[0] == "out.hdf5"


@pytest.mark.parametrize("name", ["x" * 250 + ".hdf5", "y" * 255, "é" * 127, "a.b" * 84 + "€"])
def test_a_legal_name_of_any_length_is_written_and_its_leftovers_swept(tmp_path, name):
    """A final name up to NAME_MAX (255 bytes) is legal, so it can be written: its temporary name keeps
    the name's start and a hash of all of it, fits the filesystem, and is still known as that name's."""
    import sys

    assert len(os.fsencode(name)) <= 255
    final = tmp_path / name
    durable.check_writable(final)
    temp = os.path.basename(durable.temp_path(final, "sentences"))
    assert len(os.fsencode(temp)) <= 255 and temp.startswith("." + name[:40])
    stem = durable.parse_temp_name(temp)[0]
    assert stem != name and stem.startswith(name[:40]) and "~" in stem
    durable.write_text(final, "whole\n")
    with durable.durable_hdf5(tmp_path / ("h" + name[1:])) as h5:
        h5["x"] = [1.0]
    assert (tmp_path / name).read_text() == "whole\n" and (tmp_path / ("h" + name[1:])).is_file()
    # a killed run's temporary file of this name is found and swept; one of a name with the same start is not
    dead = cli_process.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    theirs = durable.temp_path(final).replace(f"-{os.getpid()}.", f"-{dead}.")
    cousin = durable.temp_path(tmp_path / (name[:-1] + "Z")).replace(f"-{os.getpid()}.", f"-{dead}.")
    for p in (theirs, cousin):
        open(p, "w").close()
    assert [t.path for t in durable.temp_files(tmp_path, name)] == [theirs]
    assert durable.sweep_temp_files(tmp_path, name) == [theirs]
    assert os.path.exists(cousin)


def test_a_short_name_keeps_its_whole_self_in_the_temporary_name(tmp_path):
    name = "o" * (255 - durable.temp_names.TEMP_OVERHEAD)  # the longest kept whole
    assert durable.parse_temp_name(os.path.basename(durable.temp_path(tmp_path / name)))[0] == name
    assert durable.fitting_stem(name + "o", durable.temp_names.TEMP_OVERHEAD) != name + "o"


def test_append_line_leaves_no_torn_line_on_error(tmp_path, monkeypatch):
    log = tmp_path / "metrics.jsonl"
    durable.append_line(log, '{"step": 1}')
    real = os.write

    def short_then_fail(fd, data):
        if len(data) > 3:
            return real(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(WriteError, match="ENOSPC"):
        durable.append_line(log, '{"step": 2}')
    monkeypatch.undo()
    assert log.read_text() == '{"step": 1}\n'


def test_write_error_pickles_with_its_fields():
    import pickle

    e = WriteError("/x/out.hdf5", OSError(errno.EIO, "Input/output error"))
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.path == "/x/out.hdf5" and back.errno == errno.EIO
    before = durable.OutputPathError("/x/out.hdf5", "its folder /x does not exist")
    back = pickle.loads(pickle.dumps(before))  # (from a worker process): still the error known before any work
    assert type(back) is durable.OutputPathError and str(back) == str(before) and back.path == "/x/out.hdf5"


def test_folders_to_be_made_are_checked_before_any_work(tmp_path):
    """check_creatable makes nothing and names what is wrong; make_dirs makes the folder and its parents.
    Both raise OutputPathError, the error of a path refused before any work."""
    (tmp_path / "a_file").write_text("x")
    assert durable.check_creatable(tmp_path / "new" / "deeper") == str(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()
    with pytest.raises(
        durable.OutputPathError, match=rf"cannot write {tmp_path}/a_file/sub: {tmp_path}/a_file is not a folder$"
    ):
        durable.check_creatable(tmp_path / "a_file" / "sub")
    with pytest.raises(durable.OutputPathError, match=r"the model directory exists and is not a folder$"):
        durable.make_dirs(tmp_path / "a_file", "model directory")
    with pytest.raises(durable.OutputPathError, match=r"file name too long \(300 bytes; at most \d+ here\)$"):
        durable.make_dirs(tmp_path / ("x" * 300) / "m")
    assert durable.make_dirs(tmp_path / "new" / "deeper") == str(tmp_path / "new" / "deeper")
    assert (tmp_path / "new" / "deeper").is_dir()


# --- a text file written across many calls, scratch files, two-phase writes ----------------------------


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_a_file_writer_that_cannot_finish_is_a_write_error_and_leaves_the_old_file(tmp_path, monkeypatch, where):
    target = tmp_path / "out.txt"
    target.write_text("old")
    writer = durable.FileWriter(target)
    for i in range(3):  # written across many calls
        writer.file.write(f"line {i}\n")
    assert target.read_text() == "old" and _leftovers(tmp_path) == [os.path.basename(writer.temp)]
    monkeypatch.setattr(os, where, lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(WriteError, match=rf"^cannot write {target}: Input/output error \(EIO\)$"):
        writer.finish()
    monkeypatch.undo()
    assert target.read_text() == "old" and _leftovers(tmp_path) == []
    writer = durable.FileWriter(target)
    writer.file.write("new\n")
    writer.finish()
    assert target.read_text() == "new\n" and _leftovers(tmp_path) == []


def test_a_tag_names_a_scratch_file_that_abort_removes(tmp_path):
    target = tmp_path / "out.hdf5"
    target.write_bytes(b"old")
    scratch = durable.FileWriter(target, tag="sentences")
    assert scratch.temp.endswith(".sentences" + durable.TEMP_SUFFIX)
    assert durable.parse_temp_name(os.path.basename(scratch.temp)) == ("out.hdf5", durable.host_tag(), os.getpid())
    scratch.file.write("a line\n")
    output = durable.Hdf5Writer(target)
    output.file.create_dataset("x", data=np.zeros(3))
    assert [t.final_name for t in durable.temp_files(tmp_path)] == ["out.hdf5", "out.hdf5"]
    assert {t.owner() for t in durable.temp_files(tmp_path, "out.hdf5")} == {"running"}  # this process's
    for writer in (scratch, output):
        writer.abort()
        writer.abort()  # twice (an abort after a failed finish): nothing left to do
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="tag"):
        durable.temp_path(target, tag="Not-Letters")


def test_move_renames_a_whole_file_or_names_the_target(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    durable.write_text(work / "assembled.txt", "whole\n")
    durable.move(work / "assembled.txt", tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "whole\n" and not (work / "assembled.txt").exists()
    durable.write_text(work / "assembled.txt", "again\n")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    with pytest.raises(WriteError, match=rf"cannot write {tmp_path / 'out.txt'}: .*\(EXDEV\)"):
        durable.move(work / "assembled.txt", tmp_path / "out.txt")
    assert (work / "assembled.txt").read_text() == "again\n"  # kept, for a later try


def test_sync_false_is_atomic_without_fsync(tmp_path, monkeypatch):
    """Advisory files rewritten every second (a rank's progress) skip the fsyncs, not the rename."""
    target = tmp_path / "progress.json"
    target.write_text("old")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(AssertionError("fsync called")))
    durable.write_json(target, {"tokens": 5}, indent=None, sync=False)
    assert target.read_text() == '{"tokens": 5}\n' and _leftovers(tmp_path) == []


def test_save_torch_passes_its_options_on(tmp_path):
    """ELMoForManyLangs' released models use torch's legacy (pre-1.6) format."""
    state = {"w": torch.randn(7, 3)}
    durable.save_torch(state, tmp_path / "legacy.pkl", _use_new_zipfile_serialization=False)
    import zipfile

    assert not zipfile.is_zipfile(tmp_path / "legacy.pkl")
    assert torch.equal(torch.load(tmp_path / "legacy.pkl")["w"], state["w"])


def test_sweep_and_temp_files_know_tagged_names(tmp_path):
    import sys

    dead = cli_process.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    theirs = os.path.join(tmp_path, f".out.hdf5.{durable.host_tag()}-{dead}.0123abcd.sentences{durable.TEMP_SUFFIX}")
    open(theirs, "w").close()
    assert [(t.final_name, t.pid, t.owner()) for t in durable.temp_files(tmp_path)] == [("out.hdf5", int(dead), "gone")]
    assert durable.sweep_temp_files(tmp_path, "out.hdf5") == [theirs]


# ---- every failure point, injected below Python (tests/support/faults/fault_shim.c) -----------

_EVERY_POINT = r"""
import json
import numpy as np
import torch
import h5py
from elmo_fast import durable

folder = sys.argv[1]
EXPECTED_JSON = {"a": list(range(2000))}


def write_all():
    with durable.durable_hdf5(os.path.join(folder, "w.hdf5")) as f:
        for i in range(4):
            f.create_dataset(f"d{i}", data=np.full((60, 40), i, np.float32))
        f.attrs["n"] = 4
    durable.write_json(os.path.join(folder, "m.json"), EXPECTED_JSON)
    durable.save_torch({"t": torch.arange(20000)}, os.path.join(folder, "c.pt"))


def whole(name):
    path = os.path.join(folder, name)
    if name == "w.hdf5":
        with h5py.File(path, "r") as f:
            return f.attrs["n"] == 4 and all((f[f"d{i}"][...] == i).all() and f[f"d{i}"].shape == (60, 40) for i in range(4))
    if name == "m.json":
        return json.load(open(path)) == EXPECTED_JSON
    if name == "c.pt":
        return torch.equal(torch.load(path)["t"], torch.arange(20000))
    return False


def clean():
    for n in os.listdir(folder):
        os.unlink(os.path.join(folder, n))


Shim.arm(folder, 0, 0)
write_all()
total = Shim.count()
Shim.disarm()
bad = []
tried = 0
for err, sticky in ((errno.ENOSPC, True), (errno.EIO, False)):  # a full disk stays full; EIO once
        for nth in range(1, total + 1):
            clean()
            Shim.arm(folder, nth, err, sticky)
            try:
                write_all()
                outcome = None
            except durable.WriteError as e:
                outcome = str(e)
            fired = Shim.fired()
            Shim.disarm()
            tried += 1
            names = sorted(os.listdir(folder))
            case = (errno.errorcode[err], sticky, nth)
            if not fired:
                bad.append((case, "the fault never fired"))
            if outcome is None:
                bad.append((case, "no error although a write failed"))
            elif "\n" in outcome or errno.errorcode[err] not in outcome or folder not in outcome:
                bad.append((case, "message: " + outcome))
            for name in names:
                if name.endswith(durable.TEMP_SUFFIX):
                    bad.append((case, "temporary file left: " + name))
                elif not whole(name):
                    bad.append((case, "not whole under its final name: " + name))
clean()
write_all()  # the process still writes HDF5 files after every kind of failure
assert all(whole(n) for n in ("w.hdf5", "m.json", "c.pt"))
print(json.dumps({"total": total, "tried": tried, "bad": bad}))
"""


@pytest.mark.slow
def test_every_injected_failure_point_gives_an_error_and_no_partial_file(tmp_path):
    """Each write/fsync/ftruncate/close of an HDF5 file, a JSON file and a torch checkpoint fails in
    turn (ENOSPC for the rest of the run, as a full disk; EIO once): every one is a one-line
    WriteError naming the file and the errno; a file under its final name is always whole; no
    temporary file stays; no crash, and the process still writes HDF5 afterwards."""
    from fault_injection import CHILD_PRELUDE, run_python

    run = run_python(CHILD_PRELUDE + _EVERY_POINT, str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["total"] >= 20, report  # the shim saw the writes (HDF5's pwrite included)
    assert report["tried"] == 2 * report["total"]
    assert report["bad"] == [], report["bad"][:10]
    assert "Exception ignored" not in run.stderr, run.stderr[-3000:]


# --- several files that make one whole; reading back what was written ------------------------------


@pytest.mark.parametrize("where", ["body", "second file's fsync"])
def test_files_written_together_change_no_final_name_on_failure(tmp_path, monkeypatch, where):
    (tmp_path / "options.json").write_text("old options")
    (tmp_path / "weights.hdf5").write_bytes(b"old weights")
    real_fsync = os.fsync
    fsyncs = []

    def second_fails(fd):
        fsyncs.append(fd)
        if len(fsyncs) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    with pytest.raises(WriteError if where != "body" else KeyError) as info:
        with durable.together() as files:
            files.hdf5(tmp_path / "weights.hdf5").create_dataset("w", data=np.ones(3))
            files.open(tmp_path / "options.json").write("new options")
            if where == "body":
                raise KeyError("boom")
            monkeypatch.setattr(os, "fsync", second_fails)
    monkeypatch.undo()
    if where != "body":
        assert str(info.value) == f"cannot write {tmp_path / 'options.json'}: No space left on device (ENOSPC)"
    assert (tmp_path / "options.json").read_text() == "old options"
    assert (tmp_path / "weights.hdf5").read_bytes() == b"old weights"
    assert _leftovers(tmp_path) == []
    with durable.together() as files:
        files.hdf5(tmp_path / "weights.hdf5").create_dataset("w", data=np.ones(3))
        files.open(tmp_path / "options.json").write("new options")
    assert (tmp_path / "options.json").read_text() == "new options" and _leftovers(tmp_path) == []
    with h5py.File(tmp_path / "weights.hdf5", "r") as f:
        assert f["w"][...].tolist() == [1, 1, 1]


def test_reading_back_fails_the_file_being_made(tmp_path):
    with pytest.raises(WriteError, match=rf"^cannot write {tmp_path / 'out.h5'}: Input/output error \(EIO\)$"):
        with durable.reading_back(tmp_path / "out.h5"):
            raise OSError(errno.EIO, "Input/output error")
    with pytest.raises(durable.ElmoFastError, match="not an I/O error"):  # the package's own errors pass through
        with durable.reading_back(tmp_path / "out.h5"):
            raise durable.ElmoFastError("not an I/O error")
