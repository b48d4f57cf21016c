"""The first-use self-check (``ELMO_FAST_SELFCHECK``): each op checked against its reference twin the
first time a process calls it on a device, in the schedule the call takes, and the one record of what
that decided (which checks passed, which failed and so fall back), read by ``elmo-fast doctor``, the
embed summary and the server's ``/health`` and ``/metrics`` (:func:`fallbacks`).

``ELMO_FAST_SELFCHECK`` (read when :mod:`elmo_fast.bilm` is imported; :func:`enable` sets it later):

* unset, ``1`` or ``cuda``: ops on CUDA tensors are checked (the default, until a GPU run has verified
  the kernels on the hardware);
* ``all``: ops on CPU tensors too;
* ``strict`` (with ``all``: ``all,strict``): a failed check raises :class:`SelfCheckError`, one line
  naming the op and its error, at that call and every later one, instead of falling back;
* ``0`` (``off``): no check; an op call then pays one ``is None`` test.

What is checked is (op, device, schedule): the schedule is what the call takes besides its values
(GEMM weights packed for the CPU's BRGeMM, the GEMV threshold, the LSTM's tuning: what the calibration
chose and the model passes), and the check runs the op in it
(:func:`elmo_fast.verification.selfcheck.check_op`, a few milliseconds of small cases;
benchmarks/bench_selfcheck.py measures it).

Only a wrong result falls back: an op whose outputs leave their bound gives ONE warning
(:class:`SelfCheckWarning`, naming the op, its error and the bound) and runs its reference twin
(:mod:`elmo_fast.verification.fallback`: slower, right) in that schedule on that device for the rest
of the process. Anything the check raises (out of memory, an earlier CUDA error, an interrupt) reaches
the caller unchanged and decides nothing: the op stays unchecked, and its next call checks it again.

When on, an op call on a device the mode does not check pays one Python call; on a checked device, one
set lookup after its first use.

This module imports nothing of the package at load time (:mod:`elmo_fast.bilm` imports it while it is
itself being imported); the ops, the checks and the fallback are bound by :func:`enable`.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

ENV_VAR = "ELMO_FAST_SELFCHECK"

#: the mode when the variable is unset: CUDA ops checked, a failure falls back (until a GPU run has
#: verified the kernels on the hardware)
DEFAULT_MODE = "cuda"


class SelfCheckError(RuntimeError):
    """A compiled op gave results outside its bound against its reference twin on this device."""


class SelfCheckWarning(RuntimeWarning):
    """An op failed its first-use self-check on a device and runs its reference twin there from now on."""


#: a check's key: (op, device, schedule), the schedule as the op gives it (None: the kernels' defaults)
Key = tuple[str, str, Any]

#: keys whose check passed: the hook's fast path
_passed: set[Key] = set()
#: keys whose check found wrong results -> the one line saying what failed (raised in strict mode,
#: warned once otherwise)
_failed: dict[Key, str] = {}
_lock = threading.RLock()
#: None (off), "cuda" or "all": which devices are checked
_mode: str | None = None
_strict = False
#: elmo_fast.bilm.ops, bound by enable(); elmo_fast.verification.selfcheck, .fallback, .selfcheck_cases,
#: bound on an op's first checked call (_bind): selfcheck_cases imports elmo_fast.bilm, whose import runs enable()
_ops: ModuleType | None = None
_checks: ModuleType | None = None
_fallback: ModuleType | None = None
_cases: ModuleType | None = None


def _failure_line(op: str, device, schedule, results: list, seconds: float) -> str:
    failed = [r for r in results if r.failed]
    setting = f"{ENV_VAR}={_mode}{',strict' if _strict else ''}"  # the mode in effect, however it was set
    where = f"{device}" + ("" if schedule is None else f" ({_cases.Schedule.of_call(schedule).text()})")
    then = (
        "raising, as strict asks"
        if _strict
        else f"elmo_fast.bilm.reference.{failed[0].twin} runs instead on {where} for the rest of this process "
        f"(right, slower; {ENV_VAR}=strict makes this an error, 0 turns the check off)"
    )
    return (
        f"elmo-fast self-check ({setting}): {op} gives wrong results on {where}: {failed[0].one_line()} "
        f"(against elmo_fast.bilm.reference.{failed[0].twin}; {len(failed)} of {len(results)} checks failed, "
        f"{seconds * 1e3:.0f} ms); {then}. Run `elmo-fast doctor` for every op, and report its output"
    )


def _on_first_use(op: str, tensor: torch.Tensor, schedule: tuple | None = None) -> Callable[..., object] | None:
    """ops' hook, called before each op call with its main input and its schedule: the first time an op
    runs on a device the mode checks (in that schedule), runs its checks there; returns None (run the
    kernel), or, for an op that failed them, the twin to call instead (strict: raises SelfCheckError)."""
    if tensor.is_cuda:
        if not _ops.HAS_CUDA_KERNELS:  # nothing to check: the op says how to build them
            return None
    elif _mode != "all":
        return None
    _bind()
    device = tensor.device
    key = (op, str(device), schedule)
    if key in _passed or getattr(_checks.local, "bypass", False) or device.type not in ("cpu", "cuda"):
        return None
    if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        # traced or captured: no check can run now (the eager calls are checked); a failed op falls back
        return _twin(op, key, tensor)
    with _lock:
        if key not in _passed and key not in _failed:  # (another thread may have checked it meanwhile)
            start = time.perf_counter()
            # anything raised here propagates as it is, and the key stays unchecked
            results = _checks.check_op(op, device, schedule=_cases.Schedule.of_call(schedule), errors="raise")
            if any(r.failed for r in results):
                _failed[key] = _failure_line(op, device, schedule, results, time.perf_counter() - start)
                if not _strict:
                    warnings.warn(_failed[key], SelfCheckWarning, stacklevel=3)
            else:
                _passed.add(key)
    return _twin(op, key, tensor)


def _bind() -> None:
    global _checks, _fallback, _cases
    if _cases is None:
        from . import fallback, selfcheck, selfcheck_cases

        _checks, _fallback, _cases = selfcheck, fallback, selfcheck_cases


def _twin(op: str, key: Key, tensor: torch.Tensor) -> Callable[..., object] | None:
    if key not in _failed:
        return None
    if _strict:
        raise SelfCheckError(_failed[key])
    return functools.partial(_fallback.call_twin, op, tensor)


def parse_mode(value: str | None) -> tuple[str | None, bool]:
    """(devices: None, "cuda" or "all"; strict) from a value of ELMO_FAST_SELFCHECK: 0/off, 1/cuda,
    all, strict, or all,strict. None or "" is off (the variable's default is applied by
    :func:`enable_from_environment`)."""
    words = {w for w in (value or "").strip().lower().replace("+", ",").replace(" ", ",").split(",") if w}
    if not words or words <= {"0", "off", "false", "no"}:
        return None, False
    strict = "strict" in words
    words.discard("strict")
    words = {"cuda" if w in ("1", "on", "true", "yes") else w for w in words} or {"cuda"}
    if len(words) != 1 or not words <= {"cuda", "all"}:
        raise ValueError(
            f"{ENV_VAR}={value!r}: expected 1 (or cuda): check each CUDA op on its first use and fall "
            "back to its plain-PyTorch reference if it fails; all: ops on every device; strict (or all,strict): "
            "a failed check is an error; 0: off"
        )
    return words.pop(), strict


def mode() -> str:
    """The mode in effect, as ELMO_FAST_SELFCHECK writes it: ``off``, ``cuda``, ``all``, ``all,strict`` ..."""
    return "off" if _mode is None else _mode + (",strict" if _strict else "")


def enable(mode: str | None) -> None:
    """Set the first-use self-check, as ELMO_FAST_SELFCHECK (:func:`parse_mode`); None, "" or "0":
    off. Ops already checked in this process are not checked again (:func:`forget_checked`)."""
    global _mode, _strict, _ops
    parsed = parse_mode(mode)
    from ..bilm import ops

    _ops = ops
    _mode, _strict = parsed
    ops.set_first_use_hook(None if _mode is None else _on_first_use)


def enable_from_environment() -> None:
    """:func:`enable` with ``$ELMO_FAST_SELFCHECK``, DEFAULT_MODE when it is unset (run when
    elmo_fast.bilm is imported); a value it does not know is said in a warning, and the default applies."""
    value = os.environ.get(ENV_VAR)
    try:
        enable(DEFAULT_MODE if value is None else value)
    except ValueError as exc:
        warnings.warn(f"{exc}; the default ({DEFAULT_MODE}) applies", RuntimeWarning, stacklevel=2)
        enable(DEFAULT_MODE)


def state(op: str, device: str, schedule: tuple | None = None) -> str:
    """``unchecked``, ``passed`` or ``failed``: what the first-use check decided for the op on ``device``
    (``"cpu"``, ``"cuda:0"``) in ``schedule`` (as the op gives it; None: the defaults)."""
    key = (op, device, schedule)
    return "passed" if key in _passed else "failed" if key in _failed else "unchecked"


def fallbacks() -> dict[str, list[str]]:
    """Every op the self-check knows, each with where it runs its reference twin in this process because
    it failed its first-use check there: ``{"char_cnn": ["cuda:0"], "highway": [], ...}`` (a schedule
    other than the defaults is named: ``"cpu (packed bfloat16)"``). Under ``strict`` a failed op raises
    instead: none falls back. What the embed summary, ``elmo-fast doctor`` and the server's ``/health``
    and ``/metrics`` report."""
    from .selfcheck_cases import OPS, Schedule

    out: dict[str, list[str]] = {name: [] for name in OPS}
    if _strict:
        return out
    with _lock:
        failed = sorted(_failed, key=lambda k: (k[0], k[1], repr(k[2])))
    for op, device, schedule in failed:
        out.setdefault(op, []).append(device if schedule is None else f"{device} ({Schedule.of_call(schedule).text()})")
    return out


def fallback_summary() -> str | None:
    """The fallbacks in one phrase, ``char_cnn on cuda:0, bilstm on cpu (packed bfloat16)``; None when none."""
    parts = [f"{op} on {where}" for op, places in fallbacks().items() for where in places]
    return ", ".join(parts) or None


def forget_checked() -> None:
    """Check every op again on its next use (for tests)."""
    with _lock:
        _passed.clear()
        _failed.clear()
