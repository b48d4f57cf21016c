"""Injected storage faults for the tests: tests/support/faults/fault_shim.c, an LD_PRELOAD library that fails
the Nth write, fsync, ftruncate or close on files under a folder with the errno asked for (or kills
the process there: ``KILL``).

``shim()`` builds it once per test session with the system's C compiler (the test is skipped, with
the reason, where there is none or the platform has no LD_PRELOAD). ``run_python(code, ...)`` runs
Python code in a child process with the shim preloaded; inside it, ``Shim`` (ctypes) arms and
disarms faults, so one process can try every failure point of a run in turn.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import cli_process
import pytest

SOURCE = Path(__file__).resolve().parent / "faults" / "fault_shim.c"

WRITE, SYNC, CLOSE, TRUNCATE = 1, 2, 4, 8
ALL = WRITE | SYNC | CLOSE | TRUNCATE
ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}
#: armed as the errno: SIGKILL at the Nth call instead of an error (a kill -9 at an exact write point)
KILL = -9

_built: Path | None = None


def shim() -> Path:
    """The path of the built shim (built once per session); skips the test where it cannot be."""
    global _built
    if _built is not None:
        return _built
    if not sys.platform.startswith("linux"):
        pytest.skip("fault injection needs LD_PRELOAD and /proc/self/fd (Linux)")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("fault injection needs a C compiler (cc or gcc) to build tests/support/faults/fault_shim.c")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"elmo_fast_fault_shim_{digest}_{os.getuid()}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cli_process.run(
            [cc, "-shared", "-fPIC", "-O1", "-o", str(tmp), str(SOURCE), "-ldl", "-lpthread"],
            check=True,
            capture_output=True,
        )
        os.replace(tmp, out)
    _built = out
    return out


def env_with_shim(**faults: object) -> dict[str, str]:
    """The environment of a child process with the shim preloaded (and armed from FAULT_* when given:
    dir, nth, errno, sticky, ops)."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(shim()) + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    for key, value in faults.items():
        env[f"FAULT_{key.upper()}"] = str(value)
    return env


def run_python(code: str, *args: str, timeout: float = 600, **faults: object) -> subprocess.CompletedProcess:
    """Run ``python -c code args...`` with the shim preloaded; stdout/stderr captured as text."""
    return cli_process.run(  # (faulthandler from the code, not -X: a run with -X is not forked)
        [sys.executable, "-c", "import faulthandler; faulthandler.enable()\n" + code, *args],
        env=env_with_shim(**faults),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# Imported by the child processes (python -c): arms the shim loaded in their own process.
CHILD_PRELUDE = r"""
import ctypes, errno, os, sys
_lib = ctypes.CDLL(None)
_lib.fault_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int]
_lib.fault_count.restype = ctypes.c_long

class Shim:
    @staticmethod
    def arm(folder, nth, err, sticky=True, ops=15):
        _lib.fault_arm(os.fsencode(os.path.abspath(folder)), nth, err, int(sticky), ops)
    @staticmethod
    def disarm():
        _lib.fault_disarm()
    @staticmethod
    def count():
        return _lib.fault_count()
    @staticmethod
    def fired():
        return bool(_lib.fault_fired())
"""


def python_lib_dir() -> str:
    return sysconfig.get_paths()["purelib"]
