"""Timing equivalent candidates on a machine other processes may be using.

:meth:`Chooser.measure` runs each candidate once to warm up (its result goes to a gate, which may leave
it out: :mod:`~elmo_fast.tuning.calibration` compares it with the reference twin there), then
:data:`ROUNDS` rounds, each running every candidate once, the order rotating from round to round: a
busy moment slows the candidates of one round alike instead of one candidate's every run. A candidate's
time is the :data:`QUANTILE` of its rounds (robust to the rounds a burst of other work hit); two
candidates are compared by the median of their per-round ratios, and the spread of those ratios says
how far that comparison can be trusted (:meth:`Timings.compare`).

The chooser also measures how busy the machine was while it timed: the share of its threads' time spent
runnable but waiting for a CPU (Linux's per-thread ``schedstat``; elsewhere the process's CPU time
against the wall clock's), which the calibration records. :func:`cpu_pressure` tells, without timing
anything, whether the machine is busy now.
"""

from __future__ import annotations

import glob
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

#: timed rounds of each candidate after its warm-up run (fewer once the budget is spent; under MIN_ROUNDS, none count)
ROUNDS = 5
MIN_ROUNDS = 3
#: a candidate's time: this quantile of its rounds
QUANTILE = 0.25
#: after MIN_ROUNDS rounds, a candidate whose best run is this much slower than the fastest's runs no more
#: (a kept one aside)
HOPELESS = 1.5


@dataclass
class Candidate:
    """One way of computing a result: ``run()`` returns it (a tensor, or a tuple whose first is one)."""

    name: str
    run: Callable[[], object]


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` (linear interpolation between order statistics)."""
    v = sorted(values)
    if not v:
        return math.inf
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass(frozen=True)
class Comparison:
    """a against b: ``ratio`` the median of their per-round time ratios (< 1: a is faster), ``spread`` the
    inter-quartile range of those ratios, over ``rounds`` rounds both ran in."""

    ratio: float
    spread: float
    rounds: int


@dataclass
class Timings:
    """The seconds of each timed run of each candidate that was measured, in round order."""

    rounds: dict[str, list[float]] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.rounds

    def __bool__(self) -> bool:
        return bool(self.rounds)

    def stat(self, name: str) -> float:
        """The candidate's time (:data:`QUANTILE` of its rounds); inf if it ran fewer than MIN_ROUNDS rounds
        (not measured, or dropped as hopeless)."""
        runs = self.rounds.get(name, ())
        return quantile(runs, QUANTILE) if len(runs) >= MIN_ROUNDS else math.inf

    def compare(self, a: str, b: str) -> Comparison | None:
        """a's time against b's, round by round (None unless both ran in MIN_ROUNDS rounds or more)."""
        if a not in self.rounds or b not in self.rounds:
            return None
        if a == b:
            return Comparison(1.0, 0.0, len(self.rounds[a]))
        pairs = list(zip(self.rounds[a], self.rounds[b]))
        if len(pairs) < MIN_ROUNDS:
            return None
        ratios = [x / max(y, 1e-12) for x, y in pairs]
        return Comparison(quantile(ratios, 0.5), quantile(ratios, 0.75) - quantile(ratios, 0.25), len(pairs))

    def to_dict(self) -> dict:
        return {name: [round(s, 7) for s in runs] for name, runs in self.rounds.items()}


def _run_delay_ns() -> int | None:
    """Nanoseconds this process's threads have spent runnable but waiting for a CPU (Linux), else None."""
    total = 0
    paths = glob.glob("/proc/self/task/*/schedstat")
    if not paths:
        return None
    for path in paths:
        try:
            with open(path) as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total


def cpu_pressure() -> float | None:
    """The share of the last 10 seconds in which some task of this machine (or container) waited for a CPU
    (Linux's pressure stall information, ``/proc/pressure/cpu``); None where the kernel does not report it."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as f:
            for line in f:
                if line.startswith("some "):
                    fields = dict(item.split("=", 1) for item in line.split()[1:])
                    return float(fields["avg10"]) / 100.0
    except (OSError, ValueError, KeyError):
        pass
    return None


class Contention:
    """How long this process's threads waited for a CPU while timing, as a share of the time they could
    have run (0: never; 0.5: half of it, e.g. two busy processes on as many cores as threads)."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.possible = 0.0
        self._start: tuple[float, int | None, float] | None = None

    def start(self) -> None:
        self._start = (time.perf_counter(), _run_delay_ns(), time.process_time())

    def stop(self) -> None:
        if self._start is None:
            return
        wall0, delay0, cpu0 = self._start
        self._start = None
        wall = time.perf_counter() - wall0
        threads = max(torch.get_num_threads(), 1)
        delay1 = _run_delay_ns()
        if delay0 is not None and delay1 is not None:
            waited = (delay1 - delay0) / 1e9
        else:  # no schedstat: the CPU time the threads did not get
            waited = max(0.0, wall * threads - (time.process_time() - cpu0))
        self.waited += max(0.0, waited)
        self.possible += wall * threads

    @property
    def share(self) -> float:
        return min(1.0, self.waited / self.possible) if self.possible > 0 else 0.0


@dataclass
class Chooser:
    """Times groups of candidates (:meth:`measure`).

    clock: seconds (``time.perf_counter``; tests give a fake one). budget_s: total measuring time (none by
    default; the calibration's is ELMO_FAST_CALIBRATION_BUDGET's) after
    which :meth:`measure` measures nothing more: it starts no group, ends a group's rounds early, and leaves a
    group that has not run MIN_ROUNDS rounds unmeasured (an empty :class:`Timings`), so that a busy machine
    overruns the budget by one round at most. rounds: timed rounds per group.
    """

    clock: Callable[[], float] = time.perf_counter
    budget_s: float = math.inf
    rounds: int = ROUNDS
    #: what went wrong, one line each (failed candidates, candidates left out by the gate, budget spent)
    notes: list[str] = field(default_factory=list)
    #: the candidates the gate left out: {"candidate", "where", and what the gate said}
    excluded: list[dict] = field(default_factory=list)
    contention: Contention = field(default_factory=Contention)
    _start: float | None = None

    def spent(self) -> float:
        if self._start is None:
            self._start = self.clock()
        return self.clock() - self._start

    @property
    def complete(self) -> bool:
        """Whether every group asked for was measured within the budget."""
        return not any(note.startswith("budget of") for note in self.notes)

    def measure(
        self,
        candidates: Sequence[Candidate],
        gate: Callable[[Candidate, object], dict | None] | None = None,
        keep: Sequence[str] = (),
        where: str = "",
    ) -> Timings:
        """Warm up, gate and time ``candidates`` (see the module's docstring). ``gate(candidate, result)``:
        None to keep it, else a dict saying why it is left out. ``keep``: names never dropped as hopeless."""
        timings = Timings()
        if self.spent() >= self.budget_s:
            self.notes.append(
                f"budget of {self.budget_s:g} s spent: {', '.join(c.name for c in candidates)} not measured"
            )
            return timings
        alive: list[Candidate] = []
        for c in candidates:
            try:
                out = c.run()
            except Exception as e:  # a kernel this CPU lacks, say: the candidate is out
                self.notes.append(f"{c.name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
                continue
            why = gate(c, out) if gate is not None else None
            if why is not None:
                self.excluded.append({"candidate": c.name, "where": where, **why})
                self.notes.append(f"{c.name} ({where}): left out, {why.get('detail', 'disagrees with the reference')}")
                continue
            alive.append(c)
        runs: dict[str, list[float]] = {c.name: [] for c in alive}
        self.contention.start()
        try:
            for r in range(self.rounds):
                if self.spent() >= self.budget_s:
                    if r < MIN_ROUNDS:  # too few rounds to tell anything: the group is unmeasured
                        self.notes.append(
                            f"budget of {self.budget_s:g} s spent: {', '.join(c.name for c in alive)} measured "
                            f"{r} round(s) only, not enough ({where or 'a group'})"
                        )
                        return Timings()
                    break
                order = alive[r % len(alive) :] + alive[: r % len(alive)] if alive else []
                for c in order:
                    start = self.clock()
                    c.run()
                    runs[c.name].append(self.clock() - start)
                if r == MIN_ROUNDS - 1 and len(alive) > 1:  # MIN_ROUNDS in: the hopeless ones run no more
                    best = {c.name: min(runs[c.name]) for c in alive}
                    fastest = min(best.values())
                    dropped = [c for c in alive if best[c.name] > HOPELESS * fastest and c.name not in keep]
                    alive = [c for c in alive if c not in dropped]
                    for c in dropped:
                        timings.rounds[c.name] = runs.pop(c.name)
        finally:
            self.contention.stop()
        timings.rounds.update(runs)
        return timings
