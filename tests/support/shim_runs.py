"""Helpers for the tests of elmo-fast's allennlp import path, which run Python in child processes: an
import path is per process, and this one must meet the environment a user has (no allennlp in the
venv: tests/install_peers.sh keeps the peers outside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import cli_process
import pytest
from repo_paths import REPO

ROOT = REPO


def child_env(**extra: str | None) -> dict[str, str]:
    """This environment without the stand-in's variables (unless given) and without PYTHONPATH
    (peers stay out), plus ``extra`` (None removes a variable)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ELMO_FAST_AS_ALLENNLP", "ELMO_FAST_PRECISION", "ELMO_FAST_BACKEND", "PYTHONPATH")
    }
    env["PYTHONWARNINGS"] = "default"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_python(
    code: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    cwd: str | os.PathLike | None = None,
    fresh: bool = True,
) -> subprocess.CompletedProcess:
    """``python -c code`` (dedented) in a child process: a fresh interpreter (what an import path's tests
    need: the modules a user's process starts with), or with ``fresh=False`` one forked from the test run's
    interpreter that imported torch, numpy and h5py already (tests/support/cli_process.py: the same
    process otherwise, seconds sooner), for children whose imports are not what the test is about."""
    proc = (subprocess.run if fresh else cli_process.run)(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env if env is not None else child_env(),
        timeout=timeout,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def last_json(proc: subprocess.CompletedProcess):
    """The child's last stdout line, as JSON (what a child reports)."""
    return json.loads(proc.stdout.strip().splitlines()[-1])


def require_no_real_allennlp() -> None:
    """Skip when this venv has a real allennlp (the stand-in would stay off, as it must)."""
    proc = run_python("import importlib.util; print(importlib.util.find_spec('allennlp') is not None)", fresh=False)
    if proc.stdout.strip() == "True":
        pytest.skip(
            "a real allennlp is installed in this venv, so elmo-fast's allennlp import path stays off; "
            "the peers belong outside the venv: bash tests/install_peers.sh"
        )


def require(module: str, how: str) -> None:
    """Skip unless ``module`` is importable in a child process."""
    proc = run_python(f"import importlib.util; print(importlib.util.find_spec({module!r}) is not None)", fresh=False)
    if proc.stdout.strip() != "True":
        pytest.skip(f"{module} is not installed: {how}")
