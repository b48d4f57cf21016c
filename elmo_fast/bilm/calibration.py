"""Measure, on the machine at hand, which of the CPU kernels' equivalent ways of computing the same
values is fastest for one model shape, precision and thread count, and return the choice
(:class:`CpuTuning`), which the ops take as plain arguments (csrc/cpu/tuning.h).

What is chosen, each by timing the candidates on the model's own layer-0 weights:

* per row count n (1, 4, 16, 64: :data:`LSTM_ROWS`, the rows still running at an LSTM step), the directions in turn
  (each GEMM on all threads) or concurrently (one thread each), and for each, the op's own GEMV or
  BLAS for the step's GEMMs: hence ``tuning = [gemv_rows_in_turn, gemv_rows_concurrent,
  concurrent_min_rows]`` for ``bilstm`` / ``lstm_layer`` (layer 0's input gates, whose weight has
  W_hh's shape, take the in-turn threshold);
* fp32: the highway's GEMV threshold (n = 16, 64: :data:`HIGHWAY_ROWS`, while the GEMV still wins);
* the LSTM's weights as they are, through BLAS or oneDNN's matmul (and the GEMV for few rows), or
  packed once (:func:`~elmo_fast.bilm.ops.pack_weight`) for oneDNN's BRGeMM micro-kernel (bf16: AMX
  tiles where the CPU has them; packed fp32 weights cost a copy of the LSTM's weights).

A candidate runs the real op (``bilstm`` on one layer, a few steps), once to warm up and then
``repeats`` times interleaved with the others, its best time kept. A candidate that raises, or whose
result differs from the others' by more than its precision allows, is out; a decision with no
measurement left (all out, or the time budget spent) keeps the kernels' default. Costs a few
milliseconds per candidate on small models, and stays under the budget (1 s by default;
``ELMO_FAST_CALIBRATION_BUDGET``) on the official ones. :mod:`~elmo_fast.bilm.cpu_tuning` decides when to calibrate and caches the result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from . import ops

#: a row count no step exceeds: "always" for a GEMV threshold
ALWAYS = 2**31 - 1
#: the row counts measured (rows of an LSTM step); thresholds fall between them
LSTM_ROWS = (1, 4, 16, 64)
HIGHWAY_ROWS = (16, 64)
#: LSTM steps per timed call at few rows, where a step reads its weights: from memory at a call's first
#: step, maybe from cache at the next ones, as in a sentence's steps (a layer and direction's weights
#: may stay in the last-level cache from step to step when the directions run in turn, not when they
#: run concurrently: two steps undervalued that). From FEW_ROWS on a step's arithmetic dominates and
#: one step does.
STEPS = 4
FEW_ROWS = 4
#: after their first runs, the candidates this much slower than the best run no more (but in a
#: Chooser's first group, whose first runs pay for generating kernels and touching memory)
HOPELESS = 1.5
#: in a tuning, "the kernel's default" (a choice the calibration could not make)
UNSET = -1
#: how much faster the directions must run concurrently to be chosen so (run to run, the two schedules
#: differ by a few percent where they are even: the choice would otherwise follow the noise)
CONCURRENT_MARGIN = 0.03
#: how much faster packed float32 weights must be to be chosen: they cost a copy of the LSTM's weights
PACKED_FP32_MARGIN = 0.05


@dataclass(frozen=True)
class CpuTuning:
    """The CPU fast path's choices for one (model shape, precision, threads); None: the kernels' default.

    lstm:              ``[gemv_rows_in_turn, gemv_rows_concurrent, concurrent_min_rows]``, the ``tuning`` of
                       :func:`~elmo_fast.bilm.ops.bilstm` (-1: that value's default). The training op
                       (:func:`~elmo_fast.bilm.ops.lstm_layer`, whose backward differs) is not measured here
                       and keeps its defaults.
    linear_gemv_rows:  ``gemv_max_rows`` of layer 0's input gates (:func:`~elmo_fast.bilm.ops.linear`)
    highway_gemv_rows: ``gemv_max_rows`` of :func:`~elmo_fast.bilm.ops.highway`
    packed:            bf16: the GEMM weights packed for the BRGeMM micro-kernel
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


#: no measurement: every op's own default
DEFAULT = CpuTuning()


@dataclass
class Candidate:
    """One way of computing a result: ``run()`` returns it (a tensor, or a tuple whose first is one)."""

    name: str
    run: Callable[[], object]
    #: results of candidates of one group must agree to this, relative to the largest |value|
    tolerance: float = 1e-4


@dataclass
class Chooser:
    """Times candidates and says which is fastest.

    clock: seconds (``time.perf_counter``; tests give a fake one). budget_s: total measuring time
    after which :meth:`measure` measures nothing more (returns no timings). repeats: runs of each
    candidate after its first, interleaved across candidates; the best of all its runs counts (the
    first's one-time costs, a kernel generated or memory first touched, then lose to a later run).
    """

    clock: Callable[[], float] = time.perf_counter
    budget_s: float = 1.0
    repeats: int = 1
    #: what went wrong, one line each (failed candidates, disagreeing results, budget spent)
    notes: list[str] = field(default_factory=list)
    _start: float | None = None
    _groups: int = 0

    def spent(self) -> float:
        if self._start is None:
            self._start = self.clock()
        return self.clock() - self._start

    def measure(self, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Best seconds of each candidate that ran and agreed with the first that ran; {} once the
        budget is spent."""
        if self.spent() >= self.budget_s:
            self.notes.append(
                f"budget of {self.budget_s:g} s spent: {', '.join(c.name for c in candidates)} not measured"
            )
            return {}
        alive: list[Candidate] = []
        best: dict[str, float] = {}
        reference = None
        for c in candidates:  # the first run, whose result is checked
            try:
                start = self.clock()
                out = c.run()
                seconds = self.clock() - start
            except Exception as e:  # a kernel this CPU lacks, say: the candidate is out
                self.notes.append(f"{c.name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                continue
            first = _first_tensor(out)
            if reference is None:
                reference = first
            elif not _agrees(first, reference, c.tolerance):
                self.notes.append(f"{c.name}: result differs from {alive[0].name}'s beyond {c.tolerance:g}: left out")
                continue
            alive.append(c)
            best[c.name] = seconds
        if self._groups > 0 and best:  # a candidate far behind after its first run is not run again
            fastest = min(best.values())
            alive = [c for c in alive if best[c.name] <= HOPELESS * fastest]
        self._groups += 1
        for _ in range(self.repeats):
            if self.spent() >= self.budget_s:  # first runs only: a busy machine is not kept waiting
                break
            for c in alive:
                start = self.clock()
                c.run()
                best[c.name] = min(best[c.name], self.clock() - start)
        return best


def _first_tensor(out: object) -> Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out  # type: ignore[return-value]


def _agrees(a: Tensor, b: Tensor, tolerance: float) -> bool:
    """Same shape, finite, and within ``tolerance`` of b's largest |value| everywhere."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    a, b = a.float(), b.float()
    if not bool(torch.isfinite(a).all()):
        return False
    return (a - b).abs().max().item() <= tolerance * max(b.abs().max().item(), 1e-6)


# ---- deriving choices from timings ------------------------------------------------------------------


def gemv_threshold(rows: Sequence[int], gemv: dict[int, float], blas: dict[int, float]) -> int | None:
    """The largest row count the GEMV should take, from its and BLAS's times at ``rows`` (ascending):
    between the last count where the GEMV was at least as fast and the first where it was not (their
    geometric mean), 0 if it lost at the first, twice the last if it never lost. None when a count
    was not measured before the GEMV lost (the budget ran out): then nothing is known."""
    last_win = None
    for n in rows:
        if n not in gemv or n not in blas:
            return None
        if gemv[n] <= blas[n]:
            last_win = n
            continue
        return 0 if last_win is None else round(math.sqrt(last_win * n))
    return None if last_win is None else 2 * last_win


def concurrent_from(rows: Sequence[int], in_turn: dict[int, float], concurrent: dict[int, float]) -> int | None:
    """``concurrent_min_rows``: the directions run concurrently from the row count past which doing so
    was faster (by CONCURRENT_MARGIN) at every count (geometric mean of the last loss and the first of
    those wins); 1 if it always was, 0 if it never was. None unless both were measured at every count."""
    measured = list(rows)
    if not measured or any(n not in in_turn or n not in concurrent for n in measured):
        return None
    wins = [concurrent[n] < (1 - CONCURRENT_MARGIN) * in_turn[n] for n in measured]
    if not wins[-1]:
        return 0
    k = len(wins)
    while k > 0 and wins[k - 1]:
        k -= 1
    return 1 if k == 0 else round(math.sqrt(measured[k - 1] * measured[k]))


# ---- the measurements ------------------------------------------------------------------------------


def _lstm_case(layer0: Sequence[Tensor], n: int, gen: torch.Generator):
    """Inputs of a one-layer ``bilstm`` over n rows, of STEPS steps each (one from FEW_ROWS rows on)."""
    C = layer0[3].shape[1]
    steps = STEPS if n <= FEW_ROWS else 1
    xg0 = torch.randn(n, 2, 4 * C, generator=gen)
    index = torch.arange(n).unsqueeze(1).expand(n, steps).contiguous()
    lengths = torch.full((n,), steps, dtype=torch.long)
    return xg0, index, lengths


def _lstm_candidates(
    layouts: dict[str, list[Tensor]], case, concurrency: bool, gemv_alive: set[str]
) -> list[Candidate]:
    """(layout, schedule, GEMM) candidates of one row count, named "layout/schedule/gemv|gemm": "gemm"
    is BLAS or oneDNN's matmul for plain weights, the BRGeMM micro-kernel for packed ones (which the
    GEMV does not take)."""
    xg0, index, lengths = case
    modes = [("in turn", 0)] + ([("concurrent", 1)] if concurrency else [])
    out = []
    for layout, weights in layouts.items():
        tol = 1e-4 if weights[1].dtype == torch.float32 else 0.1  # two bf16 paths, each within 5% of fp32
        for mode, conc in modes:
            gemms = [("gemm", 0)] if layout == "packed" else [("gemv", ALWAYS), ("gemm", 0)]
            for gemm, rows in gemms:
                if gemm == "gemv" and f"{layout}/{mode}" not in gemv_alive:
                    continue
                tuning = [rows, rows, conc]
                out.append(
                    Candidate(
                        f"{layout}/{mode}/{gemm}",
                        lambda w=weights, t=tuning: ops.bilstm(xg0, index, lengths, w, None, None, None, None, t),
                        tol,
                    )
                )
    return out


def _layer0(flat: Sequence[Tensor]) -> list[Tensor]:
    return [w.detach() for w in flat[:8]]


def calibrate(
    lstm_weights: Sequence[Tensor],
    highway: tuple | None,
    precision: str,
    *,
    chooser: Chooser | None = None,
    seed: int = 0,
) -> tuple[CpuTuning, dict]:
    """Measure and choose for this model (``lstm_weights``: the encoder's flat fp32 weights,
    ``highway``: (weights, biases, proj_weight, proj_bias) of a char token embedder, or None) in
    ``precision`` ("fp32", "bf16"; other modes take the defaults) at torch's current thread count.
    Returns the tuning and a report: every timing (seconds, by row count and candidate), the notes, and
    whether every measurement ran within the budget ("complete")."""
    chooser = chooser or Chooser()
    gen = torch.Generator().manual_seed(seed)
    concurrency = torch.get_num_threads() >= 2
    report: dict = {"lstm": {}, "highway": {}, "notes": chooser.notes, "threads": torch.get_num_threads()}
    w32 = _layer0(lstm_weights)
    layouts: dict[str, list[Tensor]]
    if precision == "bf16":
        w16 = [w if k % 4 == 2 else w.to(torch.bfloat16) for k, w in enumerate(w32)]  # biases stay fp32
        layouts = {"plain": w16}
        try:
            layouts["packed"] = [w if k % 4 in (0, 2) else ops.pack_weight(w16[k]) for k, w in enumerate(w16)]
        except Exception as e:  # shapes it cannot pack, or no extension
            chooser.notes.append(f"packed: not available ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    elif precision == "fp32":
        layouts = {"plain": w32}
        try:
            layouts["packed"] = [w if k % 4 in (0, 2) else ops.pack_weight(w) for k, w in enumerate(w32)]
        except Exception as e:
            chooser.notes.append(f"packed: not available ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    else:
        return DEFAULT, report
    # The GEMV's threshold is where it first loses (gemv_threshold): once it has, it is not timed again.
    gemv_alive = {f"{layout}/{mode}" for layout in layouts for mode in ("in turn", "concurrent")}
    with torch.inference_mode():
        for n in LSTM_ROWS:
            t = chooser.measure(_lstm_candidates(layouts, _lstm_case(w32, n, gen), concurrency, gemv_alive))
            report["lstm"][n] = t
            for key in list(gemv_alive):
                if t.get(f"{key}/gemv", math.inf) > t.get(f"{key}/gemm", math.inf):
                    gemv_alive.discard(key)
        highway_rows = None
        if precision == "fp32" and highway is not None and highway[0]:
            highway_rows = _calibrate_highway(highway, chooser, gen, report["highway"])
    timings = report["lstm"]
    report["complete"] = not any(note.startswith("budget of") for note in chooser.notes)
    choices = {layout: _lstm_choice(layout, timings, concurrency) for layout in layouts}
    report["scores"] = scores = {layout: _layout_score(layout, c, timings) for layout, c in choices.items()}
    if precision == "fp32" and "packed" in scores:  # a copy of the weights: only for a clear gain
        scores["packed"] -= math.log(1 - PACKED_FP32_MARGIN)
    # The fastest layout among those measured completely; else the weights as they are.
    layout = min(scores, key=lambda k: (scores[k], k != "plain"))
    if scores[layout] == math.inf:
        layout = "plain"
    lstm = choices[layout]
    # Layer 0's input gates (weight [4C, P], as W_hh) run outside the op, on all threads: the in-turn
    # threshold (packed weights: the micro-kernel, whatever the rows). bf16 with plain weights computes
    # them in fp32, which this run did not time.
    linear = lstm[0] if precision == "fp32" and layout == "plain" and lstm[0] != UNSET else None
    return CpuTuning(
        lstm=lstm, linear_gemv_rows=linear, highway_gemv_rows=highway_rows, packed=layout == "packed"
    ), report


def _series(timings: dict, name: str) -> dict[int, float]:
    return {n: t[name] for n, t in timings.items() if name in t}


def _lstm_choice(layout: str, timings: dict, concurrency: bool) -> tuple[int, int, int]:
    """The op's tuning for this layout from its timings, UNSET where they do not decide."""
    gemv: dict[str, int | None] = {}
    cost: dict[str, dict[int, float]] = {}
    for mode in ("in turn", "concurrent"):
        gemm = _series(timings, f"{layout}/{mode}/gemm")
        g = _series(timings, f"{layout}/{mode}/gemv")
        threshold = 0 if layout == "packed" else gemv_threshold(LSTM_ROWS, g, gemm)
        gemv[mode] = threshold
        if threshold is None:
            cost[mode] = {}
            continue
        cost[mode] = {n: src[n] for n in LSTM_ROWS if n in (src := g if n <= threshold else gemm)}
    conc = concurrent_from(LSTM_ROWS, cost["in turn"], cost["concurrent"]) if concurrency else 0
    return tuple(UNSET if v is None else v for v in (gemv["in turn"], gemv["concurrent"], conc))  # type: ignore


def _layout_score(layout: str, choice: tuple[int, int, int], timings: dict) -> float:
    """Mean log time over the row counts of this layout with its choice (lower is faster); inf unless
    the choice is complete and every count was measured."""
    if UNSET in choice:
        return math.inf
    gemv_turn, gemv_conc, conc_min = choice
    logs = []
    for n in LSTM_ROWS:
        concurrent = conc_min > 0 and n >= conc_min
        mode = "concurrent" if concurrent else "in turn"
        gemm = "gemv" if n <= (gemv_conc if concurrent else gemv_turn) and layout != "packed" else "gemm"
        v = timings.get(n, {}).get(f"{layout}/{mode}/{gemm}")
        if v is None:
            return math.inf
        logs.append(math.log(max(v, 1e-9)))
    return sum(logs) / len(logs)


def _calibrate_highway(highway: tuple, chooser: Chooser, gen: torch.Generator, report: dict) -> int | None:
    weights, biases, proj_w, proj_b = highway
    F = weights[0].shape[1]
    gemv: dict[int, float] = {}
    blas: dict[int, float] = {}
    for n in HIGHWAY_ROWS:
        x = torch.randn(n, F, generator=gen)
        t = chooser.measure(
            [
                Candidate(name, lambda r=rows: ops.highway(x, list(weights), list(biases), proj_w, proj_b, r))
                for name, rows in (("gemv", ALWAYS), ("blas", 0))
            ]
        )
        report[n] = t
        if "gemv" in t:
            gemv[n] = t["gemv"]
        if "blas" in t:
            blas[n] = t["blas"]
        if not t or t.get("gemv", math.inf) > t.get("blas", math.inf):
            break  # the GEMV lost (or nothing ran): larger counts will not turn it back
    return gemv_threshold(HIGHWAY_ROWS, gemv, blas)
