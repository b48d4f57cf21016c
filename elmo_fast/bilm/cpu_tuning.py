"""The CPU fast path's choices for a model: measured at first use, remembered, or forced.

:func:`cpu_tuning` gives the :class:`~elmo_fast.bilm.calibration.CpuTuning` of a model's shapes,
precision and torch's current thread count: from this process's memory, else from the disk store
(:mod:`~elmo_fast.bilm.calibration_store`), else by calibrating (:mod:`~elmo_fast.bilm.calibration`,
well under a second) and storing the result for later processes (unless the time budget ran out
before every measurement: then only this process uses it).

Environment:

* ``ELMO_FAST_CALIBRATION``: ``on`` (the default), ``off`` (no calibration: every kernel's default,
  the constants measured on one machine), ``refresh`` (calibrate again in this process, whatever is
  stored, and store the new result).
* ``ELMO_FAST_CALIBRATION_BUDGET=S``: seconds a calibration may measure for (default 1; what it could
  not measure in time keeps the kernels' defaults, and is not stored).
* ``ELMO_FAST_PACKED_WEIGHTS=0|1``: force the LSTM's weights plain or packed for the BRGeMM kernel
  (packed fp32 weights are a copy the size of the LSTM's weights).
* ``ELMO_FAST_BILSTM_GEMV_ROWS=N``, ``ELMO_FAST_BILSTM_THREADS=sequential|directions``: read by the
  kernels themselves, they override any tuning (csrc/cpu/tuning.h).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from ..run_lock import RunLock, RunLocked
from . import calibration, calibration_store
from .calibration import DEFAULT, CpuTuning

log = logging.getLogger(__name__)

ENV = "ELMO_FAST_CALIBRATION"
PACKED_ENV = "ELMO_FAST_PACKED_WEIGHTS"
BUDGET_ENV = "ELMO_FAST_CALIBRATION_BUDGET"
_MODES = ("on", "off", "refresh")

_lock = threading.Lock()
_memo: dict[str, CpuTuning] = {}
_said: set[str] = set()


def mode() -> str:
    """``ELMO_FAST_CALIBRATION`` as one of on, off, refresh (an unknown value is said once, and is on)."""
    value = os.environ.get(ENV, "on").strip().lower() or "on"
    if value in ("0", "false", "no"):
        return "off"
    if value in ("1", "true", "yes"):
        return "on"
    if value not in _MODES:
        _say_once(f"{ENV}={value!r} is none of {', '.join(_MODES)}: calibrating as with 'on'", warn=True)
        return "on"
    return value


def budget() -> float:
    """``ELMO_FAST_CALIBRATION_BUDGET`` in seconds (1 when unset; a bad value is said once, and is 1)."""
    value = os.environ.get(BUDGET_ENV, "").strip()
    if not value:
        return 1.0
    try:
        seconds = float(value)
        if not seconds > 0 or seconds == float("inf"):
            raise ValueError
    except ValueError:
        _say_once(f"{BUDGET_ENV}={value!r} is not a positive number of seconds: using 1", warn=True)
        return 1.0
    return seconds


def tuning_environment() -> tuple[str | None, ...]:
    """The environment variables a tuning depends on, as they are now (a caller's memo key)."""
    return (os.environ.get(ENV), os.environ.get(PACKED_ENV))


def model_shapes(lstm_weights: Sequence[Tensor], highway: tuple | None) -> dict:
    """What a calibration of this model depends on: its GEMM shapes."""
    w_proj = lstm_weights[3]
    out = {"lstm": [len(lstm_weights) // 8, int(w_proj.shape[0]), int(w_proj.shape[1])]}
    if highway is not None and highway[0]:
        out["highway"] = [len(highway[0]), *map(int, highway[0][0].shape), int(highway[2].shape[0])]
    return out


def cpu_tuning(lstm_weights: Sequence[Tensor], highway: tuple | None, precision: str) -> CpuTuning:
    """The tuning of a model (``lstm_weights``: its encoder's flat fp32 weights; ``highway``: its char
    token embedder's (weights, biases, proj_weight, proj_bias), or None) in ``precision`` at torch's
    current thread count. Never raises for want of a cache: a store that cannot be read is
    recalibrated, one that cannot be written is said once."""
    how = mode()
    if how == "off" or precision not in ("fp32", "bf16"):
        return _forced(DEFAULT, precision, lstm_weights)
    key = calibration_store.calibration_key(model_shapes(lstm_weights, highway), precision, torch.get_num_threads())
    text = calibration_store.key_text(key)
    with _lock:
        tuning = _memo.get(text)
        if tuning is None:
            if how == "refresh":
                tuning = _calibrate(key, lstm_weights, highway, precision)
            else:
                tuning = calibration_store.load(key) or _calibrate_once(key, lstm_weights, highway, precision)
            _memo[text] = tuning
    return _forced(tuning, precision, lstm_weights)


def _calibrate_once(key: dict, lstm_weights, highway, precision: str) -> CpuTuning:
    """Calibrate, one process of the machine at a time: processes starting together (torchrun's ranks,
    an embed's workers) would otherwise each measure while the others load the CPUs, and store what
    that gave. The first takes a lock beside the store's file and measures; the others wait for its
    result (up to a few budgets: a process stopped mid-measurement leaves no result, then they measure).
    Without a usable store folder, every process measures."""
    path = calibration_store.path_for(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return _calibrate(key, lstm_weights, highway, precision)
    deadline = time.monotonic() + 3 * budget() + 2.0
    while True:
        try:
            with RunLock(path.with_suffix(".lock"), "the CPU calibration", remove=True):
                # another process may have measured while this one waited for the lock
                return calibration_store.load(key) or _calibrate(key, lstm_weights, highway, precision)
        except RunLocked as e:
            if "is in use by another elmo-fast run" not in str(e):  # no lock here (a read-only folder)
                return _calibrate(key, lstm_weights, highway, precision)
        tuning = calibration_store.load(key)
        if tuning is not None:
            return tuning
        if time.monotonic() > deadline:
            return _calibrate(key, lstm_weights, highway, precision)
        time.sleep(0.05)


def packable(lstm_weights: Sequence[Tensor], precision: str) -> bool:
    """Whether :func:`~elmo_fast.bilm.ops.pack_weight` takes every GEMM weight of the LSTM in ``precision``
    (N a multiple of 16; K even in bf16)."""
    g = 2 if precision == "bf16" else 1
    return all(w.shape[0] % 16 == 0 and w.shape[1] % g == 0 for k, w in enumerate(lstm_weights) if k % 4 != 2)


def _calibrate(key: dict, lstm_weights, highway, precision: str) -> CpuTuning:
    start = time.perf_counter()
    try:
        tuning, report = calibration.calibrate(
            lstm_weights, highway, precision, chooser=calibration.Chooser(budget_s=budget())
        )
    except Exception as e:  # never fail a forward for a measurement: the defaults are correct too
        _say_once(
            f"elmo_fast: calibrating the CPU kernels failed ({type(e).__name__}: {e}); using the defaults", warn=True
        )
        return DEFAULT
    seconds = time.perf_counter() - start
    log.info(
        "elmo_fast: calibrated the CPU kernels for %s, %s, %d threads in %.2f s: %s",
        key["shapes"],
        precision,
        key["threads"],
        seconds,
        tuning,
    )
    if not report.get("complete", True):
        # The budget ran out (a busy machine, say): this process uses what was measured, the kernels'
        # defaults for the rest; a later process measures again rather than inherit a partial choice.
        return tuning
    try:
        calibration_store.save(key, tuning, report, seconds)
    except Exception as e:  # a read-only or full disk: this process keeps its result
        _say_once(
            f"elmo_fast: could not store the CPU calibration ({e}); later processes will measure again", warn=False
        )
    return tuning


def _forced(tuning: CpuTuning, precision: str, lstm_weights: Sequence[Tensor]) -> CpuTuning:
    value = os.environ.get(PACKED_ENV, "").strip()
    if precision not in ("fp32", "bf16") or value not in ("0", "1"):
        return tuning
    if value == "1" and not packable(lstm_weights, precision):
        _say_once(
            f"{PACKED_ENV}=1: this model's LSTM weights cannot be packed in {precision} (each [N, K] needs "
            "N a multiple of 16, and K even in bf16); they stay as they are",
            warn=True,
        )
        return replace(tuning, packed=False)
    return replace(tuning, packed=value == "1")


def _say_once(message: str, warn: bool) -> None:
    if message in _said:
        return
    _said.add(message)
    if warn:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    else:
        log.warning(message)


def forget() -> None:
    """Drop this process's memory of calibrations (tests; the disk store stays)."""
    with _lock:
        _memo.clear()
