"""The suite's Python children (tests/support/cli_process.py) are forked from an interpreter that imported torch
once; what a test can see of them is what a fresh interpreter gives: arguments, path, streams, folder,
environment, exit codes and signals, the fault shim armed from its environment. A run the fork could change
(an environment the preimported libraries may read) is a fresh interpreter, and the fork is really used (else
the suite is only slower)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import cli_process

_PROBE = r"""
import json, os, sys, tempfile
first = sorted(m for m in ("torch", "elmo_fast") if m in sys.modules)
line = sys.stdin.readline()
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(), "read": line,
    "streams": [(s.name, s.encoding, s.errors, s.line_buffering, s.seekable()) for s in (sys.stdin, sys.stdout, sys.stderr)],
    "dunder": sys.stdout is sys.__stdout__ and sys.stdin is sys.__stdin__,
    "env": os.environ.get("ELMO_FAST_PROBE"), "tmp": tempfile.gettempdir(), "main_file": "__file__" in globals(),
    "first": first,
}))
sys.stderr.write("to stderr\n")
"""


def _both(args, **kwargs):
    fresh = subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)
    forked = cli_process.run(args, capture_output=True, text=True, timeout=120, **kwargs)
    assert fresh.returncode == forked.returncode == 0, fresh.stderr + forked.stderr
    assert fresh.stderr == forked.stderr
    return json.loads(fresh.stdout), json.loads(forked.stdout)


def test_a_forked_child_sees_what_a_fresh_interpreter_sees(tmp_path):
    env = {**os.environ, "ELMO_FAST_PROBE": "x", "TMPDIR": str(tmp_path)}
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    for args in ([sys.executable, "-c", _PROBE, "a", "b"], [sys.executable, str(script), "a"]):
        fresh, forked = _both(args, input="a line\n", cwd=tmp_path, env=env)
        assert fresh.pop("first") == [], fresh  # a fresh interpreter has imported neither
        assert forked.pop("first") == ["torch"], forked  # the fork happened: torch was there, the project not
        assert fresh == forked


def test_module_runs_equal(tmp_path):
    args = [sys.executable, "-m", "elmo_fast", "--version"]
    fresh = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    forked = cli_process.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (forked.returncode, forked.stdout, forked.stderr)


def test_exit_codes_tracebacks_and_signals_are_a_fresh_interpreters():
    for code in ("import sys; sys.exit(3)", "raise SystemExit('said')", "raise ValueError('bad')"):
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        forked = cli_process.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert fresh.returncode == forked.returncode and fresh.returncode != 0
        assert fresh.stderr.splitlines()[-1:] == forked.stderr.splitlines()[-1:]
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGUSR1):  # (not SIGINT: a background job ignores it)
        codes = []
        for popen in (subprocess.Popen, cli_process.Popen):
            code = "import time; print('up', flush=True); time.sleep(60)"
            with popen(
                [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            ) as child:
                assert child.stdout.readline() == "up\n" and child.poll() is None
                child.send_signal(sig)
                codes.append(child.wait(timeout=60))
        assert codes[0] == codes[1] and codes[0] != 0, (sig, codes)
    started = time.monotonic()
    try:
        cli_process.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
        raise AssertionError("no timeout")
    except subprocess.TimeoutExpired:
        assert time.monotonic() - started < 30


def test_a_child_whose_environment_the_libraries_read_gets_their_import_under_it():
    """torch reads OMP_NUM_THREADS when it is imported: a child that sets it is forked from an interpreter
    started with it (or is a fresh one), never from one that imported torch without it."""
    code = "import sys; had = 'torch' in sys.modules; import torch; print(torch.get_num_threads(), had)"
    for threads in (None, "1", "2"):
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        forked = cli_process.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert fresh.stdout.split()[0] == forked.stdout.split()[0], (threads, fresh.stdout, forked.stdout)
        assert fresh.stdout.split()[1] == "False" and forked.stdout.split()[1] == "True", (threads, forked.stdout)


_WRITE_UNDER = r"""
import errno, os, sys
try:
    with open(os.path.join(sys.argv[1], "f"), "w") as f:
        f.write("x")
        f.flush()
    print("written")
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def test_a_child_with_the_fault_shim_preloaded_is_armed_from_its_own_environment(tmp_path):
    """A child with LD_PRELOAD is forked from an interpreter that preloaded the shim unarmed: in the fork the
    shim reads the child's FAULT_* as a fresh process does at load, and a child without them is not armed
    by an earlier one's."""
    from fault_injection import env_with_shim

    def run(**faults):
        args = [sys.executable, "-c", _WRITE_UNDER, str(tmp_path)]
        fresh = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env_with_shim(**faults))
        forked = cli_process.run(args, capture_output=True, text=True, timeout=120, env=env_with_shim(**faults))
        assert fresh.returncode == forked.returncode == 0, fresh.stderr + forked.stderr
        return fresh.stdout.strip(), forked.stdout.strip()

    assert run(dir=tmp_path, nth=1, errno=28) == ("ENOSPC", "ENOSPC")
    assert run() == ("written", "written")
    assert run(dir=tmp_path, nth=1, errno=5, sticky=0) == ("EIO", "EIO")
    assert run(dir=tmp_path / "elsewhere", nth=1, errno=28) == ("written", "written")
    server = cli_process._server_for(env_with_shim())
    server.running -= 1
    assert server.proc is not None and server.proc.poll() is None  # the forks were forks: a server runs
