"""The generated references stay true: docs/cli.md is what scripts/cli_reference.py makes of the parsers
of `elmo-fast` (every command and flag, with defaults, and every environment variable elmo-fast reads),
and docs/api.md what scripts/api_reference.py makes of the public names' docstrings. After changing a
command, a flag or a public docstring: `python scripts/cli_reference.py`, `python scripts/api_reference.py`."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

from repo_paths import REPO


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli_reference = _load("cli_reference")
api_reference = _load("api_reference")


def test_the_cli_page_is_what_the_parsers_say():
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == cli_reference.render(), "docs/cli.md is out of date: run `python scripts/cli_reference.py`"


def test_the_api_page_is_what_the_docstrings_say():
    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert page == api_reference.render(), "docs/api.md is out of date: run `python scripts/api_reference.py`"


def test_every_command_and_flag_of_elmo_fast_is_on_the_cli_page():
    from elmo_fast.cli import build_parser

    page = cli_reference.render()

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        assert f"`{' '.join(['elmo-fast', *path])}`" in page
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in page, f"elmo-fast {' '.join(path)} {flag}"
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])

    walk(build_parser(), [])


def test_the_generator_handles_what_parsers_can_hold():
    """Nested commands, required one-of groups, choices, optional values, defaults in help, pipes."""
    parser = argparse.ArgumentParser(prog="elmo-fast")
    parser.add_argument("--version", action="store_true", help="print it")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run | walk", description="Run things.")
    run.add_argument("input", help="what to read")
    mode = run.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fast", action="store_true", help="go fast")
    mode.add_argument("--slow", action="store_true", help="go slow")
    run.add_argument("--level", choices=["a", "b"], default="a", help="level (default %(default)s)")
    run.add_argument("--per", nargs="?", const="only", choices=("only", "also"), help="per what")
    run.add_argument("--n", type=int, default=3, metavar="N", help="how many")
    models = sub.add_parser("models", help="models")
    models_sub = models.add_subparsers(dest="what")
    verify = models_sub.add_parser("verify", help="verify a model's files")
    verify.add_argument("--name", required=True, help="which")
    page = cli_reference.render(parser)
    assert "| [`elmo-fast run`](#elmo-fast-run) | run \\| walk |" in page
    assert "| [`elmo-fast models verify`](#elmo-fast-models-verify) | verify a model's files |" in page
    assert "One of `--fast`, `--slow` (required)." in page
    assert "| `input` |  |  | what to read |" in page
    assert "| `--level` | `{a,b}` | `a` | level (default a) |" in page
    assert "| `--per` | `[{only,also}]` |  | per what |" in page
    assert "| `--n` | `N` | `3` | how many |" in page
    assert "| `--name` (required) | `NAME` |  | which |" in page
    assert "### `elmo-fast models verify`" in page
    assert "`--version`: print it" in page


def _environment_read() -> set[str]:
    """Every ELMO_FAST_* name the package, its extension and its build read: names in the Python sources
    of elmo_fast/, setup.py and build_support/, and the getenv() calls of csrc/."""
    names: set[str] = set()
    python = [*(REPO / "elmo_fast").rglob("*.py"), REPO / "setup.py", *(REPO / "build_support").glob("*.py")]
    for path in python:
        names |= set(re.findall(r"\bELMO_FAST_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")))
    for path in [*(REPO / "csrc").rglob("*.cpp"), *(REPO / "csrc").rglob("*.h"), *(REPO / "csrc").rglob("*.cu*")]:
        names |= set(re.findall(r'getenv\("(ELMO_FAST_[A-Z0-9_]+)"\)', path.read_text(encoding="utf-8")))
    return names


def test_the_cli_page_lists_every_environment_variable_elmo_fast_reads():
    read = _environment_read() - set(cli_reference.NOT_ENVIRONMENT)
    documented = set(cli_reference.ENVIRONMENT)
    assert read - documented == set(), "read but not documented: add them to ENVIRONMENT in scripts/cli_reference.py"
    assert documented - read == set(), "documented but read nowhere: remove them from ENVIRONMENT"
    assert "ELMO_FAST_BASE_URL" in read and "ELMO_FAST_CACHE" in read  # the discovery finds what it should
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in page for name in documented)


def test_the_check_mode_says_what_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli_reference, "PAGE", Path(tmp_path / "cli.md"))
    (tmp_path / "cli.md").write_text("stale\n")
    assert cli_reference.main(["--check"]) == 1
    assert "run `python scripts/cli_reference.py`" in capsys.readouterr().err
    (tmp_path / "cli.md").write_text(cli_reference.render())
    assert cli_reference.main(["--check"]) == 0
