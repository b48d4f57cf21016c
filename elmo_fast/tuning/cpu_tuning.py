"""The CPU fast path's choices for a model: measured at first use, remembered, re-checked, or forced. The one
owner of this process's calibration state; :func:`cpu_tuning` is what
:func:`elmo_fast.bilm.cpu_choices.cpu_tuning_for` answers with.

For a model's shapes, precision and torch's current thread count (and the environment:
:mod:`~elmo_fast.tuning.environment`):

1. ``ELMO_FAST_CALIBRATION=off``, a precision other than fp32 and bf16, or a variable that forces a
   schedule (``ELMO_FAST_PACKED_WEIGHTS``, ``ELMO_FAST_BILSTM_GEMV_ROWS``, ``ELMO_FAST_BILSTM_THREADS``):
   the kernels' defaults (and what is forced), nothing measured, read or stored;
2. else this process's memory, else the disk store (:mod:`~elmo_fast.tuning.store`). A stored choice is
   re-checked once per process (:mod:`~elmo_fast.tuning.recheck`) and measured again when the chosen
   schedule is no longer faster than the default, or when it was measured on a busy machine (its threads
   kept waiting for a CPU :data:`BUSY` of the time or more) and this machine is now quiet. On a machine
   busy now (Linux's CPU pressure, or the re-check's own waiting, at :data:`BUSY` or more) the stored
   choice stands: a timing would measure the other processes;
3. else calibrated (:mod:`~elmo_fast.tuning.calibration`), one process of the machine at a time, and
   stored for later processes (a calibration the budget cut short too: what it measured, the defaults
   for the rest; on a busy machine, which is what usually cuts it short, a later quiet process measures
   again). ``ELMO_FAST_CALIBRATION=refresh`` calibrates again once per process, whatever is stored.

Packed weights are used only where this CPU runs them now (``torch.backends.mkldnn`` may be switched off
in a process); a candidate the reference gate left out is said once (:class:`CalibrationWarning`). Never
raises for want of a cache: a store that cannot be read is recalibrated, one that cannot be written is
said once. A malformed variable is an :class:`~elmo_fast.errors.ElmoFastError`.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from ..bilm.cpu_choices import DEFAULT, CpuTuning
from ..run_lock import RunLock, RunLocked
from . import calibration, dispatch, environment, measure, recheck, store
from .key import calibration_key, key_text, model_shapes
from .measure import Chooser

log = logging.getLogger(__name__)

#: a record measured while its threads waited for a CPU this share of the time was made on a busy machine
BUSY = 0.2
#: a machine is quiet when a re-check waits for a CPU under this share of the time
QUIET = 0.05


class CalibrationWarning(RuntimeWarning):
    """A CPU kernel candidate disagreed with its reference twin and was left out (said once a process)."""


_lock = threading.RLock()
_memo: dict[tuple, CpuTuning] = {}
#: keys whose stored record this process has re-checked, or measured itself
_settled: set[str] = set()
_said: set[str] = set()
#: what this process did for each key, for `doctor` and `elmo-fast calibration show`
activity: dict[str, str] = {}


def _precision_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def cpu_tuning(lstm_weights: Sequence[Tensor], highway: tuple | None, precision: str) -> CpuTuning:
    """The tuning of a model (``lstm_weights``: its encoder's flat fp32 weights; ``highway``: its char
    token embedder's (weights, biases, proj_weight, proj_bias), or None) in ``precision`` at torch's
    current thread count; see the module's docstring."""
    shapes = model_shapes(lstm_weights, highway)
    slot = (
        precision,
        torch.get_num_threads(),
        environment.snapshot(),
        torch.backends.mkldnn.enabled,
        tuple(shapes["lstm"]),
        tuple(shapes.get("highway", ())),
    )
    tuning = _memo.get(slot)
    if tuning is None:
        with _lock:
            tuning = _memo.get(slot)
            if tuning is None:
                tuning = _memo[slot] = _resolve(lstm_weights, highway, precision, shapes)
    return tuning


def _resolve(lstm_weights, highway, precision: str, shapes: dict) -> CpuTuning:
    how = environment.mode()
    forced = environment.forced()
    environment.dispatch_variables()  # checked here too: a bad value is the user's to fix
    if how == "off" or precision not in ("fp32", "bf16"):
        tuning = DEFAULT
    elif forced:
        _say_once(
            "elmo_fast: "
            + ", ".join(f"{k}={v}" for k, v in forced.items())
            + " forces the CPU kernels' schedule: the calibration measures and stores nothing in this process",
            warn=False,
        )
        tuning = DEFAULT
    else:
        key = calibration_key(shapes, precision, torch.get_num_threads())
        tuning = _calibrated(key, lstm_weights, highway, precision, refresh=how == "refresh")
    return _usable(_forced_packing(tuning, precision, lstm_weights), precision)


def _calibrated(key: dict, lstm_weights, highway, precision: str, refresh: bool) -> CpuTuning:
    text = key_text(key)
    if refresh and text not in _settled:
        _settled.add(text)
        return _calibrate(key, lstm_weights, highway, precision, why="refresh")
    record = store.load(key)
    if record is None:
        _settled.add(text)
        return _calibrate_once(key, lstm_weights, highway, precision)
    if text in _settled:
        return record.tuning
    _settled.add(text)
    return _rechecked(key, record, lstm_weights, highway, precision)


def _rechecked(key: dict, record: store.Record, lstm_weights, highway, precision: str) -> CpuTuning:
    """The stored choice after its first-use check (see the module's docstring)."""
    text = key_text(key)
    if record.check is None and record.busy < BUSY:
        activity[text] = "read from the store (the defaults held; nothing to re-check)"
        return record.tuning
    pressure = measure.cpu_pressure()
    if pressure is not None and pressure >= BUSY:
        # A timing now would measure the other processes: the stored choice stands until a quiet start.
        activity[text] = f"read from the store; not re-checked, the machine is busy ({pressure:.0%} CPU pressure)"
        return record.tuning
    rows = record.check["rows"] if record.check is not None else calibration.LSTM_ROWS[-1]
    try:
        now = recheck.recheck(lstm_weights, precision, record.tuning, rows)
    except Exception as e:  # never fail a forward for a measurement
        _say_once(f"elmo_fast: re-checking the stored CPU calibration failed ({type(e).__name__}: {e})", warn=False)
        return record.tuning
    if now.busy >= BUSY:
        activity[text] = f"read from the store; the re-check waited for a CPU {now.busy:.0%} of the time: kept"
        return record.tuning
    if record.check is not None and not now.holds:
        return _calibrate(
            key,
            lstm_weights,
            highway,
            precision,
            why=f"the stored choice ran at {now.ratio:.2f}x the default's time at {rows} rows",
        )
    if record.busy >= BUSY and now.busy < QUIET:
        return _calibrate(
            key,
            lstm_weights,
            highway,
            precision,
            why=f"stored while busy ({record.busy:.0%} waiting for a CPU), quiet now ({now.busy:.0%})",
        )
    activity[text] = f"read from the store, re-checked: {now.ratio:.2f}x the default's time at {rows} rows"
    return record.tuning


def _calibrate_once(key: dict, lstm_weights, highway, precision: str) -> CpuTuning:
    """Calibrate, one process of the machine at a time: processes starting together (torchrun's ranks,
    an embed's workers) would otherwise each measure while the others load the CPUs, and store what
    that gave. The first takes a lock beside the store's file and measures; the others wait for its
    result (up to a few budgets: a process stopped mid-measurement leaves no result, then they measure).
    Without a usable store folder, every process measures."""
    path = store.path_for(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return _calibrate(key, lstm_weights, highway, precision)
    deadline = time.monotonic() + 3 * environment.budget() + 2.0
    while True:
        try:
            with RunLock(path.with_suffix(".lock"), "the CPU calibration", remove=True):
                # another process may have measured while this one waited for the lock
                record = store.load(key)
                return record.tuning if record is not None else _calibrate(key, lstm_weights, highway, precision)
        except RunLocked as e:
            if "is in use by another elmo-fast run" not in str(e):  # no lock here (a read-only folder)
                return _calibrate(key, lstm_weights, highway, precision)
        record = store.load(key)
        if record is not None:
            return record.tuning
        if time.monotonic() > deadline:
            return _calibrate(key, lstm_weights, highway, precision)
        time.sleep(0.05)


def _calibrate(key: dict, lstm_weights, highway, precision: str, why: str = "nothing in the store") -> CpuTuning:
    text = key_text(key)
    start = time.perf_counter()
    try:
        outcome = calibration.calibrate(
            lstm_weights,
            highway,
            precision,
            chooser=Chooser(budget_s=environment.budget()),
            packed_available=dispatch.packed_available(_precision_dtype(precision)),
        )
    except Exception as e:  # never fail a forward for a measurement: the defaults are correct too
        _say_once(
            f"elmo_fast: calibrating the CPU kernels failed ({type(e).__name__}: {e}); using the defaults", warn=True
        )
        return DEFAULT
    seconds = time.perf_counter() - start
    for e in outcome.excluded:
        _say_once(
            f"elmo_fast: the CPU kernel candidate {e['candidate']} ({e['where']}) disagrees with its reference "
            f"twin: {e.get('detail', '')}; it is left out of the calibration",
            warn=True,
            category=CalibrationWarning,
        )
    log.info(
        "elmo_fast: calibrated the CPU kernels for %s, %s, %d threads in %.2f s (%s): %s",
        key["shapes"],
        precision,
        key["threads"],
        seconds,
        why,
        outcome.tuning,
    )
    activity[text] = f"measured in this process ({why}, {seconds:.2f} s)"
    if not outcome.complete:
        # The budget ran out (a busy machine, say): what was measured is stored with the kernels' defaults
        # for the rest, and with how busy the machine was: a later process on a quiet machine measures
        # again, and none pays for a calibration on a machine too busy to finish one.
        activity[text] += ", the budget ran out before every measurement"
    try:
        store.save(key, outcome, seconds)
    except Exception as e:  # a read-only or full disk: this process keeps its result
        _say_once(
            f"elmo_fast: could not store the CPU calibration ({e}); later processes will measure again", warn=False
        )
    return outcome.tuning


def refresh(lstm_weights: Sequence[Tensor], highway: tuple | None, precision: str) -> store.Record | None:
    """Measure this model's choices now and store them (``elmo-fast calibration refresh``); the stored
    record, or None if it could not be stored."""
    key = calibration_key(model_shapes(lstm_weights, highway), precision, torch.get_num_threads())
    with _lock:
        _memo.clear()
        _settled.add(key_text(key))
        _calibrate(key, lstm_weights, highway, precision, why="refresh")
    return store.load(key)


def _forced_packing(tuning: CpuTuning, precision: str, lstm_weights: Sequence[Tensor]) -> CpuTuning:
    """ELMO_FAST_PACKED_WEIGHTS over the tuning, where the shapes allow packing."""
    value = environment.packed_override()
    if precision not in ("fp32", "bf16") or value is None:
        return tuning
    if value and not calibration.packable(lstm_weights, precision):
        _say_once(
            f"{environment.PACKED}=1: this model's LSTM weights cannot be packed in {precision} (each [N, K] needs "
            "N a multiple of 16, and K even in bf16); they stay as they are",
            warn=True,
        )
        return replace(tuning, packed=False)
    return replace(tuning, packed=value)


def _usable(tuning: CpuTuning, precision: str) -> CpuTuning:
    """Packed weights only where this CPU runs them now; else the plain path, said once."""
    if tuning.packed and not dispatch.packed_available(_precision_dtype(precision)):
        _say_once(
            f"elmo_fast: this CPU cannot run packed {precision} weights now (oneDNN's BRGeMM micro-kernel: AVX-512 "
            "with BF16 or AMX, and torch.backends.mkldnn enabled); the LSTM's weights stay as they are",
            warn=True,
        )
        return replace(tuning, packed=False)
    return tuning


def _say_once(message: str, warn: bool, category: type[Warning] = RuntimeWarning) -> None:
    if message in _said:
        return
    _said.add(message)
    if warn:
        warnings.warn(message, category, stacklevel=3)
    else:
        log.warning(message)


def forget() -> None:
    """Drop this process's memory of calibrations (tests, `elmo-fast calibration refresh`; the store stays)."""
    with _lock:
        _memo.clear()
        _settled.clear()
        activity.clear()
