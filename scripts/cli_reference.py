#!/usr/bin/env python
"""docs/cli.md, the command-line reference, generated from the parsers of ``elmo-fast`` themselves:
every command (subcommands of subcommands too), every flag with its value, default and help, and the
environment variables elmo-fast reads.

    python scripts/cli_reference.py            # writes docs/cli.md
    python scripts/cli_reference.py --check    # exit 1 (saying so) when docs/cli.md differs from the parsers

Regenerate after adding or changing a command or a flag (tests/docs/test_references.py fails until the
page matches). The page is built from the parsers' actions, not from argparse's formatted help, so it
does not depend on the terminal's width or on the Python version's help layout. The environment
variables come from :data:`ENVIRONMENT` below; the test checks that it names every ``ELMO_FAST_*``
variable the package, its extension and its build read, and no other.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "cli.md"
PROG = "elmo-fast"

#: every environment variable elmo-fast reads: name -> (when it is read, what it does)
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "ELMO_FAST_CACHE": (
        "run",
        "the cache folder: downloaded models (`NAME/options.json`, `NAME/weights.hdf5`) and the CPU kernels' "
        "measured choices (`calibration/`); default `~/.cache/elmo_fast`",
    ),
    "ELMO_FAST_BASE_URL": (
        "run",
        "where `--model NAME` and `fetch_model` download the official models from (default "
        "`https://allennlp.s3.amazonaws.com/models/elmo`): a mirror holding the same relative paths",
    ),
    "ELMO_FAST_API_KEY": (
        "run",
        "`elmo-fast serve`'s API key when `--api-key` is not given (keeps the key out of the process list); "
        "also each Ray Serve replica's",
    ),
    "ELMO_FAST_AS_ALLENNLP": (
        "start",
        "`1`: every Python started in this environment imports `elmo_fast.as_allennlp` first (allennlp "
        "0.9's ELMo import path for flair, seqvec and bio_embeddings; a `.pth` hook the install puts in "
        "site-packages); unset, `''` or `0`: nothing happens",
    ),
    "ELMO_FAST_PRECISION": (
        "run",
        "the precision of every biLM the allennlp import path builds (`fp32` default, `tf32`, `bf16`, `fp16`), "
        "for code you cannot pass arguments to",
    ),
    "ELMO_FAST_BACKEND": (
        "run",
        "the backend of every biLM the allennlp import path builds: `auto` (default), `fast`, `reference`",
    ),
    "ELMO_FAST_SELFCHECK": (
        "run",
        "the first-use check of the compiled ops against their plain-PyTorch references: `1`/`cuda` (default: "
        "CUDA ops; one that fails warns once and its reference runs instead), `all` (CPU ops too), `strict` "
        "(or `all,strict`: a failed check is an error), `0` (off)",
    ),
    "ELMO_FAST_CALIBRATION": (
        "run",
        "the CPU kernels' choices: `on` (default: measured once per machine, shape, precision and thread count, "
        "and kept in the cache), `off` (the kernels' defaults), `refresh` (measure again and store)",
    ),
    "ELMO_FAST_CALIBRATION_BUDGET": (
        "run",
        "seconds a calibration may measure for (default 4; what it could not measure keeps the defaults and "
        "is not stored)",
    ),
    "ELMO_FAST_PACKED_WEIGHTS": (
        "run",
        "`0` or `1`: force the LSTM's weights plain or packed for oneDNN's BRGeMM kernel on a CPU (packed fp32 "
        "weights are a copy the size of the LSTM's weights)",
    ),
    "ELMO_FAST_BILSTM_GEMV_ROWS": (
        "run",
        "the CPU LSTM kernel's largest row count for its own GEMV (else BLAS); overrides the calibration",
    ),
    "ELMO_FAST_BILSTM_THREADS": (
        "run",
        "`sequential` or `directions`: the CPU LSTM kernel's two directions in turn or on a thread each; "
        "overrides the calibration",
    ),
    "ELMO_FAST_SSL_KEYFILE_PASSWORD": (
        "run",
        "`elmo-fast serve`'s password for an encrypted `--ssl-keyfile` when `--ssl-keyfile-password` is not "
        "given (keeps it out of the process list)",
    ),
    "ELMO_FAST_CPU_ISA": (
        "run",
        "`avx2` or `base`: cap the CPU kernels' instruction set below what the CPU has (for comparisons)",
    ),
    "ELMO_FAST_HUGE_PAGES": (
        "run",
        "`0`: the CPU LSTM's large scratch buffers without transparent huge pages (for benchmarking)",
    ),
    "ELMO_FAST_CHAR_CNN_HIST_BYTES": (
        "run",
        "the CUDA char CNN's scratch budget in bytes (default 256 MB; smaller values exercise its slicing)",
    ),
    "ELMO_FAST_SKIP_CUDA_BUILD": ("build", "`1`: build the CPU extension only"),
    "ELMO_FAST_FORCE_CUDA_BUILD": (
        "build",
        "`1`: an unusable CUDA toolkit is an error instead of a CPU-only build",
    ),
    "ELMO_FAST_CUDA_ARCHS": (
        "build",
        'the GPU architectures to compile for, e.g. `"8.0;9.0"` (SASS for each, PTX for the newest)',
    ),
    "ELMO_FAST_CUDA_PROBE": ("build", "`0`: skip the test compile of the CUDA headers before the build"),
    "ELMO_FAST_BUILD_TORCH": (
        "build",
        "how an isolated build (`pip install .`) finds torch: `borrow` (default: the torch installed in the "
        "target environment), `pin` (ask for `torch==` that version), `isolated` (ask for `torch`)",
    ),
}

#: names that look like environment variables in the sources but are not read from the environment
NOT_ENVIRONMENT = {
    "ELMO_FAST_WITH_CUDA": "a C++ macro of the CUDA build",
    "ELMO_FAST_STAND_IN": "a module attribute marking the allennlp import path's modules",
}

_WHEN = {
    "run": "when elmo-fast runs",
    "start": "when Python starts",
    "build": "when the extension is built (`pip install`)",
}


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = {**vars(action), "prog": parser.prog}
    for name, value in list(params.items()):
        if hasattr(value, "__name__"):
            params[name] = value.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return action.help % params


def _value(action: argparse.Action) -> str:
    """The value a flag takes, as its help shows it: METAVAR, {a,b}, [VALUE], VALUE ..."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    elif action.option_strings:
        name = action.dest.upper()
    else:
        name = action.dest
    return {
        None: name,
        "?": f"[{name}]",
        "*": f"[{name} ...]",
        "+": f"{name} [{name} ...]",
        argparse.REMAINDER: "...",
    }.get(action.nargs, " ".join([name] * action.nargs) if isinstance(action.nargs, int) else name)


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default is None or default is argparse.SUPPRESS:
        return ""
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default)) if default else ""
    return str(default)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _command_section(parser: argparse.ArgumentParser, path: list[str], summary: str) -> list[str]:
    heading = "#" * min(2 + len(path) - 1, 4)
    lines = [f"{heading} `{' '.join([PROG, *path])}`", ""]
    about = parser.description or summary
    if about:
        lines += [_cell(about), ""]
    actions = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    groups = [g for g in parser._mutually_exclusive_groups if g._group_actions]
    for group in groups:
        names = ", ".join(f"`{a.option_strings[0] if a.option_strings else a.dest}`" for a in group._group_actions)
        lines += [
            f"{'One of' if group.required else 'At most one of'} {names}{' (required)' if group.required else ''}.",
            "",
        ]
    if actions:
        lines += ["| argument | value | default | what it does |", "|---|---|---|---|"]
        for action in sorted(actions, key=lambda a: bool(a.option_strings)):  # positionals first, then in order
            name = ", ".join(f"`{s}`" for s in action.option_strings) if action.option_strings else f"`{action.dest}`"
            value = _value(action) if action.option_strings or action.nargs not in (None, 1) else ""
            required = " (required)" if action.option_strings and action.required else ""
            lines.append(
                f"| {name}{required} | {f'`{_cell(value)}`' if value else ''} | "
                f"{f'`{_cell(_default(action))}`' if _default(action) else ''} | {_cell(_help(action, parser))} |"
            )
        lines.append("")
    sub = _subparsers(parser)
    if sub is not None:
        summaries = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sub.choices.items():
            lines += _command_section(child, [*path, name], summaries.get(name, ""))
    return lines


def _commands_table(parser: argparse.ArgumentParser, path: list[str]) -> list[str]:
    sub = _subparsers(parser)
    if sub is None:
        return []
    rows = []
    summaries = {a.dest: a.help or "" for a in sub._choices_actions}
    for name, child in sub.choices.items():
        full = " ".join([PROG, *path, name])
        anchor = re.sub(r"[^\w\- ]", "", full.lower()).replace(" ", "-")
        rows.append(f"| [`{full}`](#{anchor}) | {_cell(summaries.get(name, ''))} |")
        rows += _commands_table(child, [*path, name])
    return rows


def environment_section() -> list[str]:
    lines = [
        "## Environment variables",
        "",
        "| variable | read | what it does |",
        "|---|---|---|",
    ]
    for name, (when, what) in ENVIRONMENT.items():
        lines.append(f"| `{name}` | {_WHEN[when]} | {_cell(what)} |")
    return lines + [""]


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The page for ``parser`` (default: elmo-fast's own)."""
    if parser is None:
        sys.path.insert(0, str(REPO))
        from elmo_fast.cli import build_parser

        parser = build_parser()
    top = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    lines = [
        "# Command-line reference",
        "",
        "<!-- Generated by `python scripts/cli_reference.py` from the parsers of elmo-fast: edit the parsers'",
        "help, then run it again (tests/docs/test_references.py fails while this page differs). -->",
        "",
        f"Every command of `{PROG}` and every flag, with its default; `{PROG} COMMAND --help` says the same.",
        "Exit status: 0 done; 2 a problem with the input, the model or the flags, known before work starts;",
        "1 a failure during the run (a full disk, permissions); 130 Ctrl-C; 128 + N a termination signal N",
        "(143 SIGTERM, 129 SIGHUP). Environment variables: [the end of this page](#environment-variables).",
        "",
        "| command | what it does |",
        "|---|---|",
        *_commands_table(parser, []),
        "",
        f"Options of `{PROG}` itself: "
        + "; ".join(f"`{', '.join(a.option_strings)}`: {_cell(_help(a, parser))}" for a in top)
        + ".",
        "",
    ]
    sub = _subparsers(parser)
    if sub is not None:
        summaries = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sub.choices.items():
            lines += _command_section(child, [name], summaries.get(name, ""))
    lines += environment_section()
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generated_page import main as generated_page_main

    return generated_page_main(
        argv, script=__file__, description=__doc__.split("\n\n")[0], page=PAGE, render=render, source="the parsers"
    )


if __name__ == "__main__":
    sys.exit(main())
