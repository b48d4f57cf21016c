"""What scripts/cli_reference.py and scripts/api_reference.py share: write a generated page, or with
``--check`` compare it with what the code makes of it (exit 1 and the first lines of the difference)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path


def main(
    argv: list[str] | None, *, script: str, description: str, page: Path, render: Callable[[], str], source: str
) -> int:
    """``script`` is the generating script's path (its ``__file__``); ``source`` names what the page is
    generated from ("the parsers", "the code"), in messages."""
    repo = Path(script).resolve().parents[1]
    rel = page.relative_to(repo) if page.is_relative_to(repo) else page
    script = Path(script).name
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help=f"compare {rel} with {source}; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        old = page.read_text(encoding="utf-8") if page.exists() else ""
        if old == text:
            return 0
        diff = difflib.unified_diff(old.splitlines(), text.splitlines(), str(rel), source, lineterm="", n=0)
        print("\n".join(list(diff)[:40]), file=sys.stderr)
        print(f"{rel} is out of date: run `python scripts/{script}`", file=sys.stderr)
        return 1
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from elmo_fast.durable import write_text

    write_text(page, text)
    print(f"wrote {rel}")
    return 0
