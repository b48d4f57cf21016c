"""The environment variables of the CPU kernels' choices, read and checked in one place.

The calibration itself:

* ``ELMO_FAST_CALIBRATION``: ``on`` (the default; also 1, true, yes), ``off`` (0, false, no: every
  kernel's default, nothing measured or read), ``refresh`` (measure again in this process, whatever is
  stored, and store the new result).
* ``ELMO_FAST_CALIBRATION_BUDGET=S``: seconds one calibration may measure for (default
  :data:`DEFAULT_BUDGET_S`; what it could not measure in time keeps the kernels' defaults, and is not stored).

Overrides that force a kernel's schedule (for benchmarks and tests). Where one is set, the process runs
what it forces (the kernels' defaults for the rest) and measures, stores and re-checks nothing: every
candidate timed under a forced schedule would time that schedule, and a result stored under it would be
noise for every later process.

* ``ELMO_FAST_PACKED_WEIGHTS=0|1``: the LSTM's weights plain, or packed for oneDNN's BRGeMM micro-kernel
  where this CPU runs it (packed fp32 weights are a copy the size of the LSTM's weights).
* ``ELMO_FAST_BILSTM_GEMV_ROWS=N`` (an integer >= 0), ``ELMO_FAST_BILSTM_THREADS=sequential|directions``:
  read by the kernels themselves at every call (csrc/cpu/tuning.h), over any tuning.

What the kernels dispatch on, named in the calibration's key (:mod:`~elmo_fast.tuning.key`):
``ELMO_FAST_CPU_ISA=avx512|avx2|base`` (the char CNN's vector width), ``ATEN_CPU_CAPABILITY`` (ATen's
kernels and the LSTM's own), ``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA`` (oneDNN's: bf16 GEMMs, the
BRGeMM micro-kernel). The last three belong to PyTorch and oneDNN, which check them.

Any other value of an elmo-fast variable above is an :class:`~elmo_fast.errors.ElmoFastError`, one line
naming the variable and the values it takes; an empty value is the same as unset.
"""

from __future__ import annotations

import os

from ..errors import ElmoFastError

MODE = "ELMO_FAST_CALIBRATION"
BUDGET = "ELMO_FAST_CALIBRATION_BUDGET"
PACKED = "ELMO_FAST_PACKED_WEIGHTS"
GEMV_ROWS = "ELMO_FAST_BILSTM_GEMV_ROWS"
THREADS = "ELMO_FAST_BILSTM_THREADS"
CPU_ISA = "ELMO_FAST_CPU_ISA"

#: the variables that force a schedule: calibration off for the process where one is set
FORCING = (PACKED, GEMV_ROWS, THREADS)
#: the variables that change what the kernels dispatch on: named in the key
DISPATCH = (CPU_ISA, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")

#: seconds a calibration may measure for when ELMO_FAST_CALIBRATION_BUDGET is unset
DEFAULT_BUDGET_S = 4.0

_MODES = {"on": "on", "1": "on", "true": "on", "yes": "on", "off": "off", "0": "off", "false": "off", "no": "off"}
_MODES["refresh"] = "refresh"
#: the largest row count the kernels take (a GEMV threshold)
_MAX_ROWS = 2**31 - 1


def _value(name: str) -> str:
    return os.environ.get(name, "").strip()


def mode() -> str:
    """``ELMO_FAST_CALIBRATION`` as one of on, off, refresh."""
    value = _value(MODE).lower()
    if not value:
        return "on"
    if value not in _MODES:
        raise ElmoFastError(f"{MODE}={value!r} is not a calibration mode: expected on, off or refresh (or unset)")
    return _MODES[value]


def budget() -> float:
    """``ELMO_FAST_CALIBRATION_BUDGET`` in seconds (:data:`DEFAULT_BUDGET_S` when unset)."""
    value = _value(BUDGET)
    if not value:
        return DEFAULT_BUDGET_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ElmoFastError(f"{BUDGET}={value!r} is not a number of seconds: expected a number > 0 (or unset)")
    return seconds


def packed_override() -> bool | None:
    """``ELMO_FAST_PACKED_WEIGHTS``: True (1), False (0), None (unset)."""
    value = _value(PACKED)
    if not value:
        return None
    if value not in ("0", "1"):
        raise ElmoFastError(f"{PACKED}={value!r} is not a choice: expected 0 (plain) or 1 (packed) (or unset)")
    return value == "1"


def forced() -> dict[str, str]:
    """The schedule-forcing variables that are set, each checked: {name: value}."""
    packed_override()
    rows = _value(GEMV_ROWS)
    if rows and not (rows.isascii() and rows.isdigit() and len(rows) <= 10 and int(rows) <= _MAX_ROWS):
        raise ElmoFastError(
            f"{GEMV_ROWS}={rows!r} is not a row count: expected an integer from 0 to {_MAX_ROWS} (or unset)"
        )
    threads = _value(THREADS)
    if threads and threads not in ("sequential", "directions"):
        raise ElmoFastError(f"{THREADS}={threads!r} is not a schedule: expected sequential or directions (or unset)")
    return {name: _value(name) for name in FORCING if _value(name)}


def dispatch_variables() -> dict[str, str]:
    """The dispatch variables that are set, ``ELMO_FAST_CPU_ISA`` checked: {name: value}."""
    isa = _value(CPU_ISA)
    if isa and isa not in ("avx512", "avx2", "base"):
        raise ElmoFastError(f"{CPU_ISA}={isa!r} is not an ISA cap: expected avx512, avx2 or base (or unset)")
    return {name: _value(name) for name in DISPATCH if _value(name)}


def snapshot() -> tuple[str, ...]:
    """Every variable above as it is now, unchecked: a memo's key (a change means: read them again)."""
    return tuple(os.environ.get(name, "") for name in (MODE, BUDGET, *FORCING, *DISPATCH))
