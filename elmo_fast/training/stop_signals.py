"""SIGTERM and SIGHUP during a run: recorded, acted on between steps, so a stopped run always ends
on a checkpoint it can resume from (:class:`Interrupted`)."""

from __future__ import annotations

import signal

from ..errors import ElmoFastError, Param

#: the signals that stop a run cleanly (SIGINT stays Python's KeyboardInterrupt)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stop(Exception):
    """Raised by :meth:`StopSignals.check` once a stop signal has arrived."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


class StopSignals:
    """``with StopSignals() as stop:`` records SIGTERM and SIGHUP instead of dying of them; the loop
    calls :meth:`check` where stopping is safe (after a step). The previous handlers come back at
    the end of the block."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        for s in self._previous:
            signal.signal(s, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        self.received = signum

    def check(self) -> None:
        if self.received is not None:
            raise Stop(self.received)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class Interrupted(ElmoFastError):
    """A run stopped by a signal after writing a checkpoint."""

    def __init__(self, signum: int, *parts: str | Param) -> None:
        super().__init__(*parts)
        self.signum = signum

    def __reduce__(self):
        return type(self), (self.signum, str(self))

    @classmethod
    def at_step(cls, signum: int, step: int) -> Interrupted:
        name = signal.Signals(signum).name
        return cls(
            signum,
            f"stopped by {name} at step {step}; checkpoint written: run the same command with ",
            Param("resume", True),
            " to continue",
        )
