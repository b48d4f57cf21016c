"""The first use of a stored choice in a process: one short timing of the chosen LSTM schedule against the
kernels' default, at the row count where it gained most when measured (the record's ``check``), in
:data:`ROUNDS` interleaved rounds after a warm-up run: milliseconds on small models, a fraction of a second
on ``original``. It also tells how busy the machine is now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..bilm import ops
from ..bilm.cpu_choices import CpuTuning
from .calibration import lstm_case, lstm_layouts
from .measure import Candidate, Chooser

#: timed rounds of the re-check
ROUNDS = 3
#: the chosen schedule still holds unless it is now slower than the default by more than this (or the
#: spread measured now, whichever is larger)
SLACK = 0.02


@dataclass(frozen=True)
class Recheck:
    """ratio: the chosen schedule's time over the default's now (median of the rounds); spread: of those
    ratios; holds: the choice is still not slower than the default beyond the noise; busy: the share of
    the time this process waited for a CPU while timing."""

    ratio: float
    spread: float
    holds: bool
    busy: float


def recheck(lstm_weights: Sequence[Tensor], precision: str, tuning: CpuTuning, rows: int) -> Recheck:
    """Time ``tuning``'s LSTM schedule (and layout) against the default at ``rows`` rows."""
    chooser = Chooser(rounds=ROUNDS)
    layouts = lstm_layouts(lstm_weights, precision, tuning.packed)
    chosen = layouts["packed" if tuning.packed else "plain"]
    xg0, index, lengths = lstm_case(int(lstm_weights[3].shape[1]), rows, torch.Generator().manual_seed(rows))
    schedule = list(tuning.lstm) if tuning.lstm is not None else None
    with torch.inference_mode():
        t = chooser.measure(
            [
                Candidate("chosen", lambda: ops.bilstm(xg0, index, lengths, chosen, None, None, None, None, schedule)),
                Candidate(
                    "default",
                    lambda: ops.bilstm(xg0, index, lengths, layouts["plain"], None, None, None, None, None),
                ),
            ],
            keep=["chosen", "default"],
        )
    cmp = t.compare("chosen", "default")
    if cmp is None:  # a candidate raised (noted): the choice does not hold
        return Recheck(float("inf"), 0.0, False, chooser.contention.share)
    return Recheck(cmp.ratio, cmp.spread, cmp.ratio <= 1 + max(SLACK, cmp.spread), chooser.contention.share)
