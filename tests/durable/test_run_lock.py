"""RunLock: one run per target; the second fails at once naming the holder; a killed holder's lock
never blocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import cli_process
import pytest

from elmo_fast.errors import ElmoFastError
from elmo_fast.run_lock import RunLock, RunLocked

HOLD = textwrap.dedent("""
    import sys, time
    from elmo_fast.run_lock import RunLock
    with RunLock(sys.argv[1], "target"):
        print("held", flush=True)
        time.sleep(60)
""")


def _holder(lock_path):
    proc = cli_process.Popen([sys.executable, "-c", HOLD, str(lock_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_fails_at_once_naming_the_holder(tmp_path):
    lock = tmp_path / ".out.lock"
    proc = _holder(lock)
    try:
        with pytest.raises(RunLocked) as e:
            RunLock(lock, "output /x/out.hdf5").acquire()
        msg = str(e.value)
        assert "\n" not in msg and f"PID {proc.pid} on {os.uname().nodename}" in msg
        assert msg.startswith("output /x/out.hdf5 is in use by another elmo-fast run") and str(lock) in msg
        assert isinstance(e.value, ElmoFastError)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_never_blocks(tmp_path):
    lock = tmp_path / ".out.lock"
    proc = _holder(lock)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lock.exists()  # left behind, holding the dead run's PID
    with RunLock(lock, "target") as held:
        assert held.held
    assert not held.held


def test_released_lock_is_free_and_same_process_cannot_nest(tmp_path):
    lock = tmp_path / "l"
    with RunLock(lock, "save folder /s"):
        with pytest.raises(RunLocked, match="save folder /s is in use"):
            RunLock(lock, "save folder /s").acquire()
    with RunLock(lock, "save folder /s"):
        pass


def test_unopenable_lock_file_is_a_one_line_error(tmp_path):
    with pytest.raises(RunLocked, match=r"^target: cannot open the lock file .*missing/l: No such file"):
        RunLock(tmp_path / "missing" / "l", "target").acquire()


def test_remove_on_release_leaves_no_file_and_a_run_that_opened_the_old_one_retries(tmp_path):
    """A lock beside an output is removed when its run ends; a run that opened the file just before
    that must not lock a file no longer under the name (two runs would then hold "the" lock)."""
    lock = tmp_path / ".out.lock"
    first = RunLock(lock, "output o", remove=True).acquire()
    late = RunLock(lock, "output o", remove=True)
    stale_fd = os.open(lock, os.O_RDWR)  # opened while the first run held it
    first.release()
    assert not lock.exists()
    assert not late._same_file(stale_fd)  # what acquire checks once it holds the flock
    os.close(stale_fd)
    with late:
        assert lock.exists() and json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(RunLocked, match=rf"output o is in use by another elmo-fast run \(PID {os.getpid()} "):
            RunLock(lock, "output o", remove=True).acquire()
    assert not lock.exists()


def test_a_killed_holders_file_is_taken_and_removed_by_the_next_run(tmp_path):
    lock = tmp_path / ".out.lock"
    proc = _holder(lock)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lock.exists()
    with RunLock(lock, "output o", remove=True):
        pass
    assert not lock.exists()
