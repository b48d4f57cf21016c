"""What every command shares: termination signals as exceptions, flags for parameter names, the
--precision flag, the --backend and --onnx flags, timing."""

from __future__ import annotations

import _thread
import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

#: the signals a batch system, a container runtime or a closed terminal sends to end a job
#: (timeout, SLURM, docker stop and Kubernetes send SIGTERM; a closed terminal, SIGHUP)
TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(BaseException):
    """A termination signal, raised wherever the program is when it arrives, so that it unwinds
    through the cleanup that KeyboardInterrupt runs (a BaseException: ``except Exception`` blocks
    do not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` inside the block; the previous handlers come back
    after it. A signal that was ignored (``nohup`` ignores SIGHUP) stays ignored. A second signal
    while the first one's cleanup runs is ignored, so that the cleanup can finish."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    received: list[int] = []
    pending: list[int] = []  # a signal lost where Python could not raise it, on its way back
    in_hook = threading.Event()

    def handler(signum, frame):
        if in_hook.is_set():
            return  # (a redelivery that lands in the hook below: the next one comes 5 ms later)
        if pending:
            pending.clear()
        elif received:
            return
        received.append(signum)
        raise Terminated(signum)

    def redeliver(signum: int) -> None:
        while pending:
            _thread.interrupt_main(signum)  # (does nothing once the block has restored the old handlers)
            time.sleep(0.005)

    def unraisable(info) -> None:
        # The signal arrived while Python ran a weakref callback, a __del__ or the garbage collector,
        # where an exception cannot propagate: Python reports it here and goes on, and the run would
        # end as if never signalled. Trip it again, from another thread, until the handler raises it
        # in whatever the main thread does next.
        if isinstance(info.exc_value, Terminated) and received == [info.exc_value.signum]:
            in_hook.set()
            try:
                received.clear()
                pending.append(info.exc_value.signum)
                threading.Thread(target=redeliver, args=(info.exc_value.signum,), daemon=True).start()
            finally:
                in_hook.clear()
            return
        previous_hook(info)

    previous = {}
    previous_hook = sys.unraisablehook
    try:
        for sig in TERMINATING:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
        sys.unraisablehook = unraisable
        yield
        if pending:  # the block ended before the signal came back: it stops here
            signum = pending.pop()
            raise Terminated(signum)
    finally:
        pending.clear()
        sys.unraisablehook = previous_hook
        for sig, old in previous.items():
            signal.signal(sig, old)


def param_flags(parser: argparse.ArgumentParser, aliases: Mapping[str, str] = {}) -> dict[str, str]:
    """Python parameter name -> the flag that sets it, from the parser's own arguments: errors raised
    by the library name parameters (:class:`~elmo_fast.errors.Param`), the CLI shows flags.
    aliases: API names that differ from the parser's ``dest`` (``options_file`` -> ``options``)."""
    flags: dict[str, str] = {}
    for action in parser._actions:  # noqa: SLF001  (argparse's list of arguments has no public accessor)
        if action.dest in (argparse.SUPPRESS, "help"):
            continue
        if action.option_strings:
            flags.setdefault(action.dest, max(action.option_strings, key=lambda s: (s.startswith("--"), -len(s))))
        else:
            flags.setdefault(action.dest, (action.metavar or action.dest).upper())
    for api_name, dest in aliases.items():
        if dest in flags:
            flags[api_name] = flags[dest]
    return flags


class _DeprecatedAlias(argparse.Action):
    """A flag kept for old command lines: stores like the flag it aliases, and says so on stderr."""

    def __init__(self, option_strings, dest, instead: str, **kwargs) -> None:
        self.instead = instead
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(
            f"elmo-fast: {option_string} is deprecated: use {self.instead} {values}, which means the same",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_max_line_length_flag(parser: argparse.ArgumentParser) -> None:
    """``--max-line-length N`` (dest ``max_line_length``), one flag and one meaning for every command
    that reads lines of text (embed, train, finetune, vocab, perplexity)."""
    from ..textio import DEFAULT_MAX_LINE_LENGTH

    parser.add_argument(
        "--max-line-length",
        type=int,
        default=DEFAULT_MAX_LINE_LENGTH,
        metavar="N",
        help=f"a line longer than N characters is an error naming it, found before the line is read "
        f"whole (default {DEFAULT_MAX_LINE_LENGTH:,})",
    )


def add_precision_flag(
    parser: argparse.ArgumentParser, training: bool = False, deprecated_aliases: tuple[str, ...] = ()
) -> None:
    """``--precision {fp32,tf32,bf16,fp16}`` (dest ``precision``, default fp32), with one meaning in
    every command (:mod:`elmo_fast.bilm.precision`): embedding, serving and training take it alike.
    training: the help says what each mode does to a training step (fp16 is refused there).
    deprecated_aliases: old flags that set the same value (``train --dtype``), each saying so."""
    from ..bilm.precision import PRECISIONS

    modes = "; ".join(f"{p.name}: {p.training if training else p.summary}" for p in PRECISIONS.values())
    what = "the training step's arithmetic" if training else "the fast path's arithmetic, each mode's error bounded"
    parser.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default="fp32",
        help=f"{what} (default fp32). {modes}".replace("%", "%%"),
    )
    for flag in deprecated_aliases:
        parser.add_argument(
            flag,
            dest="precision",
            choices=list(PRECISIONS),
            action=_DeprecatedAlias,
            instead="--precision",
            help="deprecated: the same as --precision",
        )


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """``--backend {auto,fast,reference,onnx}`` and ``--onnx FILE`` (dests ``backend``, ``onnx``), one
    meaning for every command that embeds (embed, serve); :func:`onnx_file` checks the pair."""
    parser.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "fast", "reference", "onnx"],
        help="fast (fused C++/CUDA ops), reference (plain PyTorch), onnx (a graph written by `elmo-fast "
        "export onnx`, in ONNX Runtime on the CPU: give it as --onnx FILE), or auto: fast when built "
        "(default; onnx with --onnx)",
    )
    parser.add_argument(
        "--onnx",
        metavar="FILE",
        help="run this ONNX graph (from `elmo-fast export onnx`, which holds the model) in ONNX Runtime "
        "instead of the biLM; needs the [onnx] extra",
    )


def onnx_file(args: argparse.Namespace) -> str | None:
    """The graph --onnx / --backend onnx name, checked against the other flags before anything loads;
    None: the biLM's own backends."""
    from ..errors import ElmoFastError

    if args.onnx is None and args.backend != "onnx":
        return None
    if args.onnx is None:
        raise ElmoFastError("--backend onnx needs --onnx FILE (a graph written by `elmo-fast export onnx`)")
    if args.backend not in ("auto", "onnx"):
        raise ElmoFastError(
            f"--onnx {args.onnx} runs a graph in ONNX Runtime: give it with --backend onnx, not --backend {args.backend}"
        )
    given = [
        flag
        for flag, value in (
            ("--model", args.model),
            ("--model-dir", args.model_dir),
            ("--options", args.options),
            ("--weights", args.weights),
            ("--model-format", args.model_format),
        )
        if value
    ]
    if given:
        raise ElmoFastError(f"--onnx {args.onnx} holds the model: give it without {', '.join(given)}")
    return args.onnx


def process_start() -> float:
    """The ``time.perf_counter()`` reading of this process's start (Linux; elsewhere, now): the wall
    time a command reports includes the interpreter's and torch's start-up."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        # field 22 of the file (the 20th after the name): start time in clock ticks after boot
        return now - max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return now
