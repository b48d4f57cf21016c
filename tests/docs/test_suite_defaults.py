"""The suite runs what a user runs: its effective defaults (calibration, self-check, backend, precision,
state mode; no ELMO_FAST_* setting a user does not have) are those of a process started with none of the
package's variables set, and those docs/precision-and-speed.md lists."""

from __future__ import annotations

import json
import os
import re
import sys

import cli_process
import pytest
from repo_paths import REPO, SUPPORT
from user_defaults import NOT_BEHAVIOUR, effective_defaults


def _users_defaults() -> dict:
    """effective_defaults() in a new process whose environment has none of the package's variables (the
    cache aside, a location every user has)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELMO_FAST_") or k == "ELMO_FAST_CACHE"}
    proc = cli_process.run(
        [sys.executable, str(SUPPORT / "user_defaults.py")], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_suite_runs_a_users_defaults():
    ours, users = effective_defaults(), _users_defaults()
    assert users["variables set"] == []
    assert ours == users, "the test suite runs settings a user does not have (tests/conftest.py?)"


@pytest.mark.slow
def test_the_docs_list_the_defaults():
    text = (REPO / "docs" / "precision-and-speed.md").read_text(encoding="utf-8")
    section = text.split("## The defaults", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| ([^|]+?) \| `([^`]+)`", section, re.M))
    users = _users_defaults()
    assert listed == {
        k: users[k] for k in ("backend", "precision", "state mode", "CPU calibration", "first-use self-check")
    }


def test_conftest_sets_no_behaviour():
    """The suite's conftest sets no variable of the package but where files are kept."""
    source = (REPO / "tests" / "conftest.py").read_text(encoding="utf-8")
    assert not re.search(r'environ\.setdefault\("ELMO_FAST_(CALIBRATION|SELFCHECK)', source)
    set_there = set(re.findall(r'environ(?:\.setdefault\(|\[)"(ELMO_FAST_[A-Z_0-9]+)"', source))
    assert set_there <= NOT_BEHAVIOUR, sorted(set_there - NOT_BEHAVIOUR)


def test_the_suite_keeps_its_files_in_a_cache_of_its_own():
    """The calibration measures on a fresh cache once per session, as on a new machine, and stores there
    (never in the user's ~/.cache/elmo_fast): the folder conftest made for this session."""
    from elmo_fast.cache_dir import cache_dir

    folder = cache_dir()
    assert folder.name.startswith("elmo-fast-test-cache-") and folder.is_dir()
