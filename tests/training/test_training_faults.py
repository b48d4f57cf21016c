"""Training under storage faults, kills and a second run: a file under its final name is whole, a
failure is one line naming the file and the OS error (exit 1), and ``--resume`` then ends with the
weights of an uninterrupted run, bit for bit.

Faults are injected below Python (tests/support/faults/fault_shim.c): the Nth write, fsync, ftruncate or
close under the output directory fails (ENOSPC for the rest of the run, as a full disk; EIO once),
for every N of a small run, inside one child process; or the process is killed (SIGKILL) at the Nth
such call, in the middle of writing a checkpoint among others.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import cli_process
import pytest
from fault_injection import CHILD_PRELUDE, KILL, env_with_shim, run_python
from repo_paths import SUPPORT
from training_runs import final_tensors, mini_inputs, same_tensors, train_args

# every test here runs whole training runs, failing or killing them at each point: each takes minutes
pytestmark = pytest.mark.slow
TESTS = str(SUPPORT)

# Runs in one child process with the shim loaded: the CLI in-process (main(argv), stderr captured),
# a clean run, then for each errno and each failure point N of the run: a fresh output directory, the
# run with the Nth call failing, checks of what it left, the fault disarmed, --resume, the result
# compared with the clean run's. gc.freeze(): durable's close_hdf5 runs a full gc.collect, 0.1 s with
# torch's objects to scan, which would make this loop minutes long; frozen, they are not scanned.
_EVERY_POINT = r'''
import contextlib, gc, hashlib, io, json, shutil
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import h5py, torch
from elmo_fast import durable
from elmo_fast.cli import main
from elmo_fast.formats.bilm_tf import load_options
from elmo_fast.training.checkpoints import read_checkpoint
from training_runs import final_tensors, same_tensors

inputs, root, command = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
out = os.path.join(root, "out")
vocab_text = open(inputs["vocab"]).read()


def argv(target, *extra):
    if command == "vocab":
        return ["vocab", inputs["train"], "--out", os.path.join(target, "vocab.txt"), *extra]
    return [target if a == "@OUT" else a for a in json.loads(sys.argv[5])] + list(extra)


def cli(args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, err.getvalue()


def result(target):
    if command == "vocab":
        return open(os.path.join(target, "vocab.txt")).read()
    return final_tensors(target)


def same(a, b):
    return a == b if command == "vocab" else same_tensors(a, b)


def fresh(target):
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)


def problems(target):
    """What is wrong with the files a failed run left: temporary files, or a file not whole."""
    found = []
    for folder, _, names in os.walk(target):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if name.endswith(durable.TEMP_SUFFIX):
                    found.append("temporary file left: " + name)
                elif name.endswith(".pt"):
                    read_checkpoint(Path(path))
                elif name.endswith(".hdf5"):
                    with h5py.File(path, "r") as f:
                        f.visititems(lambda n, o: o[...] if isinstance(o, h5py.Dataset) else None)
                elif name == "options.json":
                    load_options(path)
                elif name == "vocab.txt":
                    assert open(path).read() == vocab_text, "vocab.txt differs"
                elif name == "metrics.jsonl":
                    text = open(path).read()
                    assert text == "" or text.endswith("\n"), "a line cut short"
                    assert all(isinstance(json.loads(line), dict) for line in text.splitlines())
                elif name != ".elmo-fast.lock":
                    found.append("unexpected file: " + name)
            except Exception as e:
                found.append(f"{name} not whole: {type(e).__name__}: {e}")
    return found


import time
started = time.perf_counter()
def state(target):
    """What a run after the fault depends on: the files left and their content (timings aside: a
    checkpoint by its step, the metrics log by its steps). The same state resumes the same way."""
    found = []
    for folder, _, names in os.walk(target):
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.endswith(".pt"):
                found.append(name)
            elif name == "metrics.jsonl":
                found.append((name, tuple(json.loads(l)["step"] for l in open(path).read().splitlines())))
            elif name != ".elmo-fast.lock":
                found.append((name, hashlib.sha256(open(path, "rb").read()).hexdigest()))
    return tuple(sorted(map(str, found)))


torch.set_num_threads(1)  # (fast on a busy machine; the clean run below runs alike)
gc.freeze()
fresh(os.path.join(root, "clean"))
rc, err = cli(argv(os.path.join(root, "clean")))
assert rc == 0, err
want = result(os.path.join(root, "clean"))
fresh(out)
Shim.arm(out, 0, 0)
rc, err = cli(argv(out))
total = Shim.count()
Shim.disarm()
assert rc == 0 and same(result(out), want), err
bad, outcomes, resumed = [], {}, set()
for code, sticky in ((errno.ENOSPC, True), (errno.EIO, False)):
    name = errno.errorcode[code]
    for nth in range(1, total + 1):
        case = f"{name} at call {nth}/{total}"
        if nth % 50 == 0:  # what the earlier runs left in cycles is freed, not kept frozen
            gc.unfreeze()
            gc.collect()
        gc.freeze()
        fresh(out)
        Shim.arm(out, nth, code, sticky)
        rc, err = cli(argv(out))
        fired = Shim.fired()
        Shim.disarm()
        lines = err.strip().splitlines()
        if not fired:
            bad.append(f"{case}: the fault never fired")
        if rc == 0:  # a call whose failure costs nothing (the lock file's note of its holder)
            outcomes["done"] = outcomes.get("done", 0) + 1
            if not same(result(out), want):
                bad.append(f"{case}: exit 0 with another result")
        elif rc != 1 or len(lines) != 1 or "Traceback" in err or name not in lines[0] or \
                not lines[0].startswith(f"elmo-fast: error: cannot write {out}"):
            bad.append(f"{case}: exit {rc}, stderr {err[-600:]!r}")
        else:
            what = os.path.basename(lines[0].split(": ")[2].split("cannot write ")[1])
            outcomes[what] = outcomes.get(what, 0) + 1
        found = problems(out)
        bad += [f"{case}: {p}" for p in found]
        if found or state(out) in resumed:  # (a state seen already, shown to resume right)
            continue
        resumed.add(state(out))
        rc, err = cli(argv(out, *(["--resume"] if command == "train" else ["--overwrite"])))
        if rc != 0:
            bad.append(f"{case}: the run after it failed: {err[-600:]!r}")
        elif not same(result(out), want):
            bad.append(f"{case}: the run after it gave another result")
print(json.dumps({"total": total, "bad": bad, "outcomes": outcomes, "states": len(resumed),
                  "seconds": time.perf_counter() - started}))
'''


def _every_point(tmp_path, command: str) -> dict:
    inputs = mini_inputs(tmp_path / "inputs")
    args = train_args(inputs, "@OUT", max_steps=2, checkpoint_every=1)
    run = run_python(
        CHILD_PRELUDE + _EVERY_POINT, TESTS, json.dumps(inputs), str(tmp_path), command, json.dumps(args), timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Exception ignored" not in run.stderr, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["bad"] == [], report["bad"][:10]
    return report


def test_every_storage_fault_of_a_training_run_then_resume(tmp_path):
    """Each write/fsync/ftruncate/close under --out of a 2-step run (metrics lines, vocab.txt, two
    checkpoints, two exports of weights.hdf5, options.json and softmax.hdf5) fails in turn, ENOSPC
    (sticky) and EIO (once): the run ends with one line naming the file and the errno, exit 1, no
    traceback; every file under its final name is whole (checkpoints load, HDF5 files read, the
    metrics lines parse), no temporary file is left; then --resume ends with the clean run's weights."""
    report = _every_point(tmp_path, "train")
    assert report["total"] >= 100, report  # the shim saw the run's writes, HDF5's pwrites included
    failed_files = set(report["outcomes"]) - {"done"}
    assert {"metrics.jsonl", "vocab.txt", "options.json", "weights.hdf5", "softmax.hdf5"} <= failed_files, report
    assert any(f.startswith("step-") for f in failed_files), report  # checkpoints among them


def test_every_storage_fault_of_elmo_fast_vocab(tmp_path):
    """`elmo-fast vocab`: every failure point of writing vocab.txt is one line, exit 1, and no file."""
    report = _every_point(tmp_path, "vocab")
    assert report["total"] >= 3 and set(report["outcomes"]) == {"vocab.txt"}, report


# ---- kill -9 at exact write points ---------------------------------------------------------------


def _cli(args, **faults):
    env = env_with_shim(**faults) if faults else None
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *args], capture_output=True, text=True, timeout=600, env=env
    )


_COUNT = r"""
import json
sys.path.insert(0, sys.argv[1])
from elmo_fast.cli import main
args = json.loads(sys.argv[2])
counts = {}
for folder in ("", "/checkpoints"):
    target = sys.argv[3] + folder
    Shim.arm(target, 0, 0)
    assert main(args) == 0
    counts[folder or "all"] = Shim.count()
    Shim.disarm()
    args = args + ["--overwrite"]
print(json.dumps(counts))
"""


def test_kill_9_at_seeded_write_points_then_resume_gives_the_same_weights(tmp_path):
    """`elmo-fast train --resume` killed (SIGKILL) at seeded random write-side calls under --out, one
    of them inside a checkpoint's write, then resumed to the end: the weights and softmax are the
    uninterrupted run's, the metrics log holds each step once, no temporary file is left."""
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    inputs = mini_inputs(tmp_path / "inputs")
    clean, out = tmp_path / "clean", tmp_path / "killed"
    args = train_args(inputs, clean, 6, 1)
    run = run_python(CHILD_PRELUDE + _COUNT, TESTS, json.dumps(args), str(clean))
    assert run.returncode == 0, run.stderr[-3000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    want = final_tensors(clean)
    resume = train_args(inputs, out, 6, 1, "--resume")
    kills = []
    # each attempt dies early in what is left of the run, so that the next one has calls left to die at
    for folder, total in (("", counts["all"]), ("/checkpoints", counts["/checkpoints"]), ("", counts["all"])):
        nth = rng.randint(1, max(1, total // 3))
        r = _cli(resume, dir=str(out) + folder, nth=nth, errno=KILL)
        kills.append((folder or "/", nth, r.returncode))
        assert r.returncode in (0, -9), f"seed {seed}, kills {kills}: {r.stderr[-2000:]}"
    assert [k for k in kills if k[2] == -9 and k[0] == "/checkpoints"], f"seed {seed}: kills {kills}"
    r = _cli(resume)
    assert r.returncode == 0, f"seed {seed}, kills {kills}: {r.stderr[-2000:]}"
    assert same_tensors(final_tensors(out), want), f"seed {seed}, kills {kills}: weights differ"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7)), f"seed {seed}, kills {kills}: {steps}"
    assert not [p for p in out.rglob("*") if p.name.endswith(".elmo-tmp")]


# ---- two runs on one directory -----------------------------------------------------------------

_WAIT_THEN_TRAIN = r"""
import sys, os, time
from elmo_fast.cli import main
import elmo_fast.training.trainer  # everything imported before the go: the run starts at once
while not os.path.exists(sys.argv[1]):
    time.sleep(0.005)
sys.exit(main(sys.argv[2:]))
"""


def _lock_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_second_run_on_the_same_directory_fails_at_once_naming_the_first(tmp_path):
    """Two `elmo-fast train` on one --out: the second fails at once (exit 2, one line naming the first
    one's PID); the first finishes with the weights of a run that had the directory to itself."""
    inputs = mini_inputs(tmp_path / "inputs")
    out = tmp_path / "out"
    first = cli_process.Popen(
        [sys.executable, "-m", "elmo_fast", *train_args(inputs, out, 40, 10)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = cli_process.Popen(
        [sys.executable, "-c", _WAIT_THEN_TRAIN, str(tmp_path / "go"), *train_args(inputs, out, 40, 10)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not _lock_held(out / ".elmo-fast.lock") and first.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        (tmp_path / "go").touch()
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert (
            err.count("\n") == 1
            and f"output directory {out} is in use by another elmo-fast run (PID {first.pid} on " in err
        ), err
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()
    alone = tmp_path / "alone"
    r = _cli(train_args(inputs, alone, 40, 10))
    assert r.returncode == 0, r.stderr
    assert same_tensors(final_tensors(out), final_tensors(alone))
