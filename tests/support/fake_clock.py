"""A clock for the calibration's chooser that moves only when a candidate "runs" (tests/tuning)."""

from __future__ import annotations

import torch


class FakeClock:
    """``clock()`` reads the time; ``advance(s)`` is a candidate running for s seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def costing(clock: FakeClock, seconds, result=None):
    """A candidate's run that takes ``seconds`` (a number, or a list consumed one per run) of fake time and
    returns ``result`` (default: ones)."""
    times = list(seconds) if isinstance(seconds, (list, tuple)) else None
    value = torch.ones(3) if result is None else result

    def run():
        clock.advance(times.pop(0) if times is not None else seconds)
        return value

    return run
