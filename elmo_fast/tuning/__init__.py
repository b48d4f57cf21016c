"""The CPU kernels' choices measured on the machine at hand: the tuning room, beside the biLM core.

* :mod:`~elmo_fast.tuning.environment`  the variables (calibration mode and budget, the overrides that force
                                         a schedule, what the kernels dispatch on), read and checked once
* :mod:`~elmo_fast.tuning.dispatch`     what the kernels dispatch on, as they see it (ISA flags, ATen's
                                         level, which packed GEMMs run)
* :mod:`~elmo_fast.tuning.key`          the calibration's key: everything a choice depends on
* :mod:`~elmo_fast.tuning.measure`      timing candidates robustly: warm-up, interleaved rounds, a quantile,
                                         paired ratios and their spread; how busy the machine was
* :mod:`~elmo_fast.tuning.calibration`  the candidates, their gate against the reference twins, the choice
* :mod:`~elmo_fast.tuning.recheck`      a stored choice's short check on first use in a process
* :mod:`~elmo_fast.tuning.store`        the records kept on disk, one per key
* :mod:`~elmo_fast.tuning.cpu_tuning`   when to measure, read, re-check or force: this process's state

:mod:`elmo_fast.bilm` (its package init) installs :func:`~elmo_fast.tuning.cpu_tuning.cpu_tuning` as the
answer to :func:`elmo_fast.bilm.cpu_choices.cpu_tuning_for`: the model asks there and knows nothing of this
room, which measures through the ops and their reference twins.
"""

from __future__ import annotations

from ..bilm import cpu_choices
from . import cpu_tuning
from .cpu_tuning import CalibrationWarning, forget


def install() -> None:
    """Make this room answer every model's request for its CPU kernels' choices."""
    cpu_choices.install(cpu_tuning.cpu_tuning)


__all__ = ["CalibrationWarning", "forget", "install"]
