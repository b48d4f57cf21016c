"""RELIABILITY.md stays true: every test it names as holding a promise exists."""
from __future__ import annotations

import ast
import re

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


def test_every_test_named_in_reliability_md_exists():
    named = _named_tests()
    assert len(named) >= 50
    missing = []
    for file, name in named:
        path = ROOT / "tests" / file
        tree = ast.parse(path.read_text(encoding="utf-8")) if path.exists() else None
        if tree is None or not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
            missing.append(f"{file}::{name}")
    assert not missing, f"RELIABILITY.md names tests that do not exist: {missing}"


def test_the_readme_links_it():
    assert "(RELIABILITY.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
