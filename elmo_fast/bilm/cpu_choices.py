"""The CPU kernels' choices as the ops take them (csrc/cpu/tuning.h), and the one place a model asks for
its own.

:class:`CpuTuning` holds one model's choices in one precision at one thread count: which GEMM each LSTM
step takes (the op's own GEMV or BLAS, by row count), whether the two directions run in turn or on a
thread each, the highway's and layer 0's GEMV thresholds, and whether the LSTM's weights are packed for
oneDNN's BRGeMM micro-kernel. :data:`DEFAULT` is "no choice made": every kernel's own default.

:func:`cpu_tuning_for` is what :class:`~elmo_fast.bilm.model.ElmoBiLm` calls. The answer comes from the
provider :mod:`elmo_fast.tuning` installs (it measures the machine, keeps what it measured and applies the
environment's overrides); it is installed when :mod:`elmo_fast.bilm` is imported, so every model has it.
Nothing here is kept in a model: a pickled, copied or saved model carries no choice, and asks again on the
machine that loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from torch import Tensor

#: a row count no step exceeds: "always" for a GEMV threshold
ALWAYS = 2**31 - 1
#: in a tuning, "the kernel's default" (a value the calibration did not decide)
UNSET = -1


@dataclass(frozen=True)
class CpuTuning:
    """The CPU fast path's choices for one (model shape, precision, threads); None: the kernels' default.

    lstm:              ``[gemv_rows_in_turn, gemv_rows_concurrent, concurrent_min_rows]``, the ``tuning`` of
                       :func:`~elmo_fast.bilm.ops.bilstm` (-1: that value's default). The training op
                       (:func:`~elmo_fast.bilm.ops.lstm_layer`, whose backward differs) is not measured and
                       keeps its defaults.
    linear_gemv_rows:  ``gemv_max_rows`` of layer 0's input gates (:func:`~elmo_fast.bilm.ops.linear`)
    highway_gemv_rows: ``gemv_max_rows`` of :func:`~elmo_fast.bilm.ops.highway`
    packed:            the LSTM's GEMM weights packed for the BRGeMM micro-kernel (:func:`~elmo_fast.bilm.ops.pack_weight`)
    """

    lstm: tuple[int, int, int] | None = None
    linear_gemv_rows: int | None = None
    highway_gemv_rows: int | None = None
    packed: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lstm"] = None if self.lstm is None else list(self.lstm)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CpuTuning:
        """The tuning a :meth:`to_dict` wrote; ValueError for anything else (a cache file is never trusted)."""
        if not isinstance(d, dict) or set(d) != {"lstm", "linear_gemv_rows", "highway_gemv_rows", "packed"}:
            raise ValueError(f"not a CpuTuning: {d!r}")

        def count(v, name, low=0):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not low <= v <= ALWAYS):
                raise ValueError(f"CpuTuning.{name} must be an int in [{low}, {ALWAYS}] or None, got {v!r}")
            return v

        def schedule(v, name):
            if v is None:
                return None
            if not isinstance(v, list) or len(v) != 3 or None in v:
                raise ValueError(f"CpuTuning.{name} must be 3 ints or None, got {v!r}")
            return tuple(count(x, name, UNSET) for x in v)

        if not isinstance(d["packed"], bool):
            raise ValueError(f"CpuTuning.packed must be a bool, got {d['packed']!r}")
        return cls(
            schedule(d["lstm"], "lstm"),
            count(d["linear_gemv_rows"], "linear_gemv_rows"),
            count(d["highway_gemv_rows"], "highway_gemv_rows"),
            d["packed"],
        )

    def describe(self) -> str:
        """One line: ``GEMV up to 32 rows in turn / 0 concurrently, directions concurrent from 8 rows, ...``."""
        if self == DEFAULT:
            return "the kernels' defaults"

        def rows(v):
            return "default" if v is None or v == UNSET else ("always" if v >= ALWAYS else f"{v}")

        parts = []
        if self.lstm is not None:
            turn, conc, conc_min = self.lstm
            parts.append(f"LSTM GEMV rows in turn {rows(turn)}, concurrent {rows(conc)}")
            parts.append(
                "directions "
                + (
                    "default"
                    if conc_min == UNSET
                    else "in turn"
                    if conc_min == 0
                    else f"concurrent from {conc_min} rows"
                )
            )
        if self.linear_gemv_rows is not None:
            parts.append(f"layer 0 GEMV rows {rows(self.linear_gemv_rows)}")
        if self.highway_gemv_rows is not None:
            parts.append(f"highway GEMV rows {rows(self.highway_gemv_rows)}")
        parts.append("weights packed" if self.packed else "weights plain")
        return ", ".join(parts)


#: no measurement: every op's own default
DEFAULT = CpuTuning()

#: (lstm_weights, highway, precision) -> CpuTuning; see :func:`cpu_tuning_for`
Provider = Callable[[Sequence[Tensor], "tuple | None", str], CpuTuning]
_provider: Provider | None = None


def install(provider: Provider | None) -> Provider | None:
    """Make ``provider`` the answer of :func:`cpu_tuning_for` (None: the kernels' defaults); returns the one
    it replaces. :mod:`elmo_fast.tuning` installs its own when :mod:`elmo_fast.bilm` is imported."""
    global _provider
    previous, _provider = _provider, provider
    return previous


def cpu_tuning_for(lstm_weights: Sequence[Tensor], highway: tuple | None, precision: str) -> CpuTuning:
    """The choices for a model (``lstm_weights``: its encoder's flat fp32 weights; ``highway``: its char token
    embedder's (weights, biases, proj_weight, proj_bias), or None) in ``precision`` at torch's current thread
    count: the installed provider's answer, else :data:`DEFAULT`."""
    return DEFAULT if _provider is None else _provider(lstm_weights, highway, precision)
