"""Runs on one output at the same time, and runs killed at any moment: one run per output (a second
fails at once naming the holder's PID; a killed holder never blocks), and kill -9 at seeded moments
followed by --resume gives the clean run's output."""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import cli_process
import pytest
from embed_runs import assert_same_output, random_sentences, write_lines
from repo_paths import REPO, SUPPORT
from sigkill_at import HOOK as KILL_HOOK
from sigkill_at import PAUSE_HOOK

from elmo_fast.cli import main

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
for _hook in (KILL_HOOK, PAUSE_HOOK):
    ENV.pop(_hook, None)
HOOKED = [sys.executable, str(SUPPORT / "sigkill_at.py")]


@pytest.fixture(scope="module")
def job(random_models, tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    inp = write_lines(d / "in.txt", random_sentences(random.Random(21), 40))
    options, weights = random_models("tiny")
    flags = [
        "--all",
        "--options",
        str(options),
        "--weights",
        str(weights),
        "--window",
        "8",
        "--batch-size",
        "4",
        "--quiet",
    ]
    code, err = cli("embed", inp, d / "want.h5", *flags)
    assert code == 0, err
    return {"input": inp, "flags": flags, "want": d / "want.h5"}


def cli(*args) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, err.getvalue()


def start(job, out: Path, *extra: str, env: dict) -> subprocess.Popen:
    return cli_process.Popen(
        [*HOOKED, "embed", str(job["input"]), str(out), *job["flags"], *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(predicate, procs, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        for p in procs:
            assert p.poll() is None or p.returncode in (0, 2), p.stderr.read()
        assert time.monotonic() < deadline, "the runs never got there"
        time.sleep(0.02)


def lock_message(out: Path, pid: int) -> str:
    return (
        rf"^elmo-fast: error: output {re.escape(str(out))} is in use by another elmo-fast run \(PID {pid} on "
        rf".+, since [0-9: -]+\); wait for it to end or stop it \(lock file "
        rf"{re.escape(str(out.parent / ('.' + out.name + '.elmo-lock')))}\)$"
    )


@pytest.mark.parametrize("second", ["plain", "--resume"])
@pytest.mark.slow
def test_two_runs_started_at_once_one_writes_the_output_the_other_names_it(job, tmp_path, second):
    """Both start together; whichever takes the lock first pauses mid-run holding it (the test's hook),
    so they overlap for sure: the other must fail at once, naming the winner's PID."""
    out = tmp_path / "o.h5"
    gate = tmp_path / "gate"
    env = {**ENV, PAUSE_HOOK: f"0:batch:1:{gate}"}
    procs = [start(job, out, "--resume", env=env), start(job, out, *([] if second == "plain" else [second]), env=env)]
    try:

        def one_paused_one_done():
            return len(list(tmp_path.glob("gate.*.reached"))) == 1 and any(p.poll() is not None for p in procs)

        wait_for(one_paused_one_done, procs)
        winner = next(p for p in procs if f"gate.{p.pid}.reached" in os.listdir(tmp_path))
        loser = next(p for p in procs if p is not winner)
        err = loser.stderr.read()
        assert loser.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert re.match(lock_message(out, winner.pid), err.strip()), err
        gate.touch()
        assert winner.wait(timeout=120) == 0, winner.stderr.read()
    finally:
        gate.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert_same_output(out, job["want"], "the run that held the lock")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("gate")) == ["o.h5"]


@pytest.mark.slow
def test_a_second_run_fails_before_loading_the_model_and_a_killed_holders_lock_never_blocks(job, tmp_path, monkeypatch):
    out = tmp_path / "o.h5"
    gate = tmp_path / "gate"
    holder = start(job, out, "--resume", env={**ENV, PAUSE_HOOK: f"0:window:1:{gate}"})
    try:
        wait_for(lambda: (tmp_path / f"gate.{holder.pid}.reached").exists(), [holder])
        from elmo_fast.embedding import embedder as embedder_module

        with monkeypatch.context() as m:
            m.setattr(
                embedder_module.ElmoEmbedder,
                "__init__",
                lambda *a, **k: pytest.fail("the model was loaded although another run holds the output"),
            )
            for extra in ([], ["--resume"], ["--resume", "--overwrite"]):
                # refused before any work: loading the model would fail the test (above), not a clock
                code, err = cli("embed", job["input"], out, *job["flags"], *extra)
                assert code == 2 and re.match(lock_message(out, holder.pid), err.strip()), err
        # the holder's work is untouched by those attempts
        assert (tmp_path / "o.h5.partial" / "shard-000000.h5.done").exists()
    finally:
        holder.kill()  # SIGKILL: no cleanup, the lock file stays behind
        holder.wait()
    assert (tmp_path / ".o.h5.elmo-lock").exists()
    code, err = cli("embed", job["input"], out, *job["flags"], "--resume")
    assert code == 0, err
    assert_same_output(out, job["want"], "resumed after the holder was killed")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("gate")) == ["o.h5"]


@pytest.mark.slow
def test_the_python_api_holds_the_lock_too(job, tmp_path):
    from elmo_fast import ElmoEmbedder
    from elmo_fast.run_lock import RunLocked

    out = tmp_path / "o.h5"
    gate = tmp_path / "gate"
    holder = start(job, out, env={**ENV, PAUSE_HOOK: f"0:batch:1:{gate}"})
    try:
        wait_for(lambda: (tmp_path / f"gate.{holder.pid}.reached").exists(), [holder])
        e = ElmoEmbedder(job["flags"][2], job["flags"][4])
        with pytest.raises(RunLocked, match=rf"is in use by another elmo-fast run \(PID {holder.pid} "):
            e.embed_file(job["input"], out, progress=False)
        gate.touch()
        assert holder.wait(timeout=120) == 0, holder.stderr.read()
    finally:
        gate.touch()
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert_same_output(out, job["want"], "the holder's output")


@pytest.mark.parametrize("seed", [11, 29])
@pytest.mark.slow
def test_kill_9_at_seeded_moments_then_resume_gives_the_clean_output(job, tmp_path, seed):
    """Two SIGKILLs at moments drawn from the seed (a batch written, a window saved, or a sentence copied
    into the assembled output), each followed by --resume: the last run ends with the clean run's output."""
    rng = random.Random(seed)
    # 40 sentences, windows of 8, batches of at most 4: 5 windows, >= 10 batches, 40 copies when assembling
    moments = [
        (rng.choice(["batch", "window"]), rng.randint(1, 5)),
        (rng.choice(["batch", "window", "assemble"]), rng.randint(1, 3)),
    ]
    out = tmp_path / "o.h5"
    kills = 0
    for i, (event, n) in enumerate(moments):
        env = {**ENV, KILL_HOOK: f"0:{event}:{n}:{tmp_path / f'killed-{i}'}"}
        p = start(job, out, "--resume", env=env)
        err = p.communicate(timeout=300)[1]
        assert p.returncode in (-9, 0), f"seed {seed}, {event} {n}: {err}"
        kills += p.returncode == -9
        assert not list(tmp_path.glob(".*.elmo-tmp")) or p.returncode == -9
    assert kills >= 1, f"seed {seed}: no run was killed ({moments})"
    code, err = cli("embed", job["input"], out, *job["flags"], "--resume")
    assert code == 0, f"seed {seed}, moments {moments}: {err}"
    assert_same_output(out, job["want"], f"seed {seed}, moments {moments}")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("killed-")) == ["o.h5"]
