"""RunLock: one run per target; the second fails at once naming the holder; a killed holder's lock
never blocks."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_path)], stdout=subprocess.PIPE, text=True)
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
