"""``elmo-fast``: the command line. One module per command group; each adds its subcommands.

* :mod:`~elmo_fast.cli.embed`   ``embed``
* :mod:`~elmo_fast.cli.train`   ``vocab``, ``train``, ``finetune``, ``perplexity``
* :mod:`~elmo_fast.cli.models`  ``random-model``, ``models``
"""
from __future__ import annotations

import argparse
import sys

from ..errors import ElmoFastError

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    from . import embed, models, train

    parser = argparse.ArgumentParser(prog="elmo-fast", description="Fast ELMo embeddings from bilm-tf model files.")
    sub = parser.add_subparsers(dest="command", required=True)
    embed.add_parser(sub)
    train.add_parsers(sub)
    models.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ElmoFastError as e:
        print(f"elmo-fast: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except OSError as e:  # the environment, not the input (disk full, permissions): one line, not a traceback
        print(f"elmo-fast: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if getattr(args, "resume", False):
            print("elmo-fast: interrupted; completed windows are kept: run again with --resume to continue",
                  file=sys.stderr)
        else:
            print("elmo-fast: interrupted; no output was written", file=sys.stderr)
        return 130

