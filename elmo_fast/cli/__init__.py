"""``elmo-fast``: the command line. One module per command group; each adds its subcommands.

* :mod:`~elmo_fast.cli.embed`   ``embed``
* :mod:`~elmo_fast.cli.train`   ``vocab``, ``train``, ``finetune``, ``perplexity``
* :mod:`~elmo_fast.cli.models`  ``random-model``, ``models``
* :mod:`~elmo_fast.cli.doctor`  ``doctor`` (and ``--version``'s line)
* :mod:`~elmo_fast.cli.calibration`  ``calibration show|clear|refresh`` (the CPU kernels' stored choices)
* :mod:`~elmo_fast.cli.convert` ``convert``
* :mod:`~elmo_fast.cli.export`  ``export onnx`` (the ``[onnx]`` extra)
* :mod:`~elmo_fast.cli.serve`   ``serve`` (the ``[serve]`` extra)

Every command ends with one line and an exit status (the table: docs/embedding.md, "Exit codes"):
0 done; 2 a problem known before any work starts: the input, the model, the flags or where the output
goes (:class:`~elmo_fast.errors.ElmoFastError`, its parameters named as flags, and
:class:`~elmo_fast.durable.OutputPathError`: its folder missing, the output a folder, a name too long,
no permission to create files there); 1 a failure during the run (disk full, an I/O error: an OSError,
or :class:`~elmo_fast.durable.WriteError` naming the file); 130 Ctrl-C; 128 + N a termination signal N
(143 SIGTERM, 129 SIGHUP), which unwinds through the same cleanup as Ctrl-C. ``serve`` is the
exception: a stop signal is how a server is meant to end, so it answers what it received and exits 0
(a second signal stops it at once: 128 + N).
"""

from __future__ import annotations

import argparse
import sys

from ..durable import OutputPathError, WriteError
from ..errors import ElmoFastError
from .common import Terminated, process_start, signals_as_exceptions

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    from . import calibration, convert, doctor, embed, export, models, serve, train

    parser = argparse.ArgumentParser(prog="elmo-fast", description="Fast ELMo embeddings from bilm-tf model files.")
    parser.add_argument(
        "--version",
        action=doctor.VersionAction,
        help="print elmo-fast's version, torch's, the extension's backends and the bundled model's licence terms, and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    embed.add_parser(sub)
    train.add_parsers(sub)
    models.add_parsers(sub)
    convert.add_parser(sub)
    export.add_parser(sub)
    doctor.add_parsers(sub)
    calibration.add_parsers(sub)
    serve.add_parser(sub)
    return parser


def _stopped(args: argparse.Namespace, why: str) -> None:
    outcome = args.outcome(args) if hasattr(args, "outcome") else "stopped"
    print(f"elmo-fast: {why}; {outcome}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except OutputPathError as e:  # where the output goes, refused before any work: the arguments' problem
        print(f"elmo-fast: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except WriteError as e:  # the environment (a full disk, permissions), said in one line naming the file
        print(f"elmo-fast: error: {e}", file=sys.stderr)
        return 1
    except ElmoFastError as e:
        print(f"elmo-fast: error: {e.render(getattr(args, 'flags', None))}", file=sys.stderr)
        return USAGE_ERROR
    except OSError as e:  # the environment, not the input (disk full, permissions): one line, not a traceback
        print(f"elmo-fast: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _stopped(args, "interrupted")
        return 130


def main(argv: list[str] | None = None) -> int:
    started = process_start()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started = started
    try:
        with signals_as_exceptions():
            return _run(args)
    except Terminated as e:  # outside _run: a signal may also land in its except clauses
        _stopped(args, f"terminated by {e.name}")
        return 128 + e.signum
