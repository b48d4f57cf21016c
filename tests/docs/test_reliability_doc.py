"""RELIABILITY.md stays true: every test it names as holding a promise exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from repo_paths import REPO as ROOT


def _named_tests() -> list[tuple[str, str]]:
    """(file, test) for each reference in RELIABILITY.md: ``file.py::test`` and the ``::test``
    after it in the same cell, which means the same file."""
    out = []
    for line in (ROOT / "RELIABILITY.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        current = None
        for m in re.finditer(r"(?:(test_\w+\.py))?::(test_\w+)", line):
            current = m.group(1) or current
            assert current is not None, f"'::{m.group(2)}' names no file: {line}"
            out.append((current, m.group(2)))
    return out


def _test_file(name: str) -> Path | None:
    """tests/<room>/<name>: RELIABILITY.md names a test file by its name, which is one file's (pytest imports
    the tests by their file's name, so two rooms cannot both hold one)."""
    found = sorted((ROOT / "tests").rglob(name))
    return found[0] if len(found) == 1 else None


@pytest.mark.slow
def test_every_test_named_in_reliability_md_exists():
    named = _named_tests()
    assert len(named) >= 50
    missing = []
    for file, name in named:
        path = _test_file(file)
        tree = ast.parse(path.read_text(encoding="utf-8")) if path is not None else None
        if tree is None or not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
            missing.append(f"{file}::{name}")
    assert not missing, f"RELIABILITY.md names tests that do not exist: {missing}"


def test_the_readme_links_it():
    assert "(RELIABILITY.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
