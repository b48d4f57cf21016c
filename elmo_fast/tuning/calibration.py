"""Measure, on the machine at hand, which of the CPU kernels' equivalent ways of computing the same values
is fastest for one model shape, precision and thread count, and whether it beats the kernels' defaults by
more than the measurement can tell apart. :func:`calibrate` returns an :class:`Outcome`: the
:class:`~elmo_fast.bilm.cpu_choices.CpuTuning` and what the store records beside it.

What is timed (:mod:`~elmo_fast.tuning.measure`: a warm-up run, then interleaved rounds), on the model's
own layer-0 weights and fresh random inputs:

* ``bilstm``, one layer, both directions, at 1, 4, 16 and 64 rows (:data:`LSTM_ROWS`; :data:`STEPS` steps
  at up to :data:`FEW_ROWS` rows, where a step's time is reading its weights, one step above): the
  kernels' default (``plain/default``) and every (layout, schedule, GEMM) candidate: the weights plain or
  packed for oneDNN's BRGeMM micro-kernel (only where this CPU runs it and the shapes allow), the
  directions in turn (each GEMM on all threads) or concurrently (a thread each), the op's own GEMV or the
  GEMM (BLAS or oneDNN's matmul for plain weights, the micro-kernel for packed ones). A GEMV that lost at
  one row count is not timed at larger ones;
* fp32: ``highway`` at 16 and 64 rows: its default, its GEMV and BLAS.

The gate: every candidate's first result is compared with the reference twin's
(:func:`~elmo_fast.bilm.reference.bilstm_ref`, :func:`~elmo_fast.bilm.reference.highway_ref`: plain
PyTorch, fp32 inside) on the same inputs (in bf16, the same bf16-rounded weights), elementwise within the
op's bound of :data:`~elmo_fast.verification.tolerances.TOL` (its float32 or bfloat16 row: atol + rtol |ref|,
scaled by the output's largest |value| where that exceeds 1). One outside it is left out (the caller
warns, the store records it) and is never chosen: a wrong GEMV means GEMMs for every row count.

The choice: per layout, the GEMV thresholds and the row count from which the directions run concurrently
follow from the candidates' times (:func:`gemv_threshold`, :func:`concurrent_from`); each layout's
choice is then compared with the default round by round at every row count, and the best replaces the
default only if it is faster by a margin (1 - the geometric mean of the median ratios) larger than both
:data:`MIN_MARGIN` and the measured spread of those ratios (packed fp32 weights, a copy of the LSTM's
weights, by :data:`PACKED_FP32_MARGIN` more). Otherwise every LSTM value keeps its default. The highway's
threshold is decided the same way; layer 0's input gates (a weight of W_hh's shape) take the LSTM's in-turn
GEMV threshold (fp32, plain weights). Every decision the measurement could not make (a budget spent)
keeps its default, and the outcome says it is incomplete.

Cost: about 200 op calls (7 candidates at each of 4 row counts, a warm-up and 5 rounds each, 3 for the
hopeless) and 6 reference runs, at most the chooser's budget (4 s by default; one round over it at most),
once per machine, shape, precision and thread count; a later process reads the store and re-checks it
(:mod:`~elmo_fast.tuning.recheck`). benchmarks/bench_calibration.py measures both (BENCHMARKS.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..bilm import ops, reference
from ..bilm.cpu_choices import ALWAYS, DEFAULT, UNSET, CpuTuning
from ..verification.tolerances import TOL
from .measure import Candidate, Chooser, Timings

#: the row counts measured (rows of an LSTM step); thresholds fall between them
LSTM_ROWS = (1, 4, 16, 64)
HIGHWAY_ROWS = (16, 64)
#: LSTM steps per timed call at up to FEW_ROWS rows, where a step reads its weights: from memory at a
#: call's first step, maybe from cache at the next ones, as in a sentence's steps. From FEW_ROWS on a
#: step's arithmetic dominates and one step does.
STEPS = 4
FEW_ROWS = 4
#: how much faster the directions must run concurrently (at every larger row count) to be chosen so
CONCURRENT_MARGIN = 0.03
#: how much faster than the default a choice must be, at least, whatever the spread
MIN_MARGIN = 0.03
#: how much more packed float32 weights must gain: they cost a copy of the LSTM's weights
PACKED_FP32_MARGIN = 0.05
#: the kernels' own choice, timed beside the candidates
DEFAULT_NAME = "plain/default"


@dataclass
class Outcome:
    """What a calibration found.

    tuning:   the choice (:data:`~elmo_fast.bilm.cpu_choices.DEFAULT` where nothing beat the defaults).
    margin:   the LSTM choice's gain over the default (0.2: 20% less time, geometric mean over the row
              counts), None where it could not be compared; spread: the measured spread it had to exceed.
    highway:  the same for the highway's threshold ({"margin", "spread", "chosen"}), None if not measured.
    check:    {"rows", "ratio"}: the row count where the chosen LSTM schedule gained most, and its ratio
              (what a later process re-checks), None when the LSTM keeps its defaults.
    excluded: the candidates the gate left out, each {"candidate", "where", "error", "bound", "detail"}.
    busy:     how busy the machine was while timing (:class:`~elmo_fast.tuning.measure.Contention`).
    complete: every decision was measured (within the budget); an incomplete outcome is not stored.
    """

    tuning: CpuTuning
    margin: float | None = None
    spread: float | None = None
    highway: dict | None = None
    check: dict | None = None
    excluded: list[dict] = field(default_factory=list)
    busy: float = 0.0
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    report: dict = field(default_factory=dict)


def _first_tensor(out: object) -> Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out  # type: ignore[return-value]


def reference_gate(expected: Tensor, dtype: torch.dtype):
    """gate(candidate, result) for :meth:`~elmo_fast.tuning.measure.Chooser.measure`: None when the result
    is within ``TOL[dtype]`` of ``expected`` (scaled by its largest |value| above 1), else why not."""
    tol = TOL[dtype]
    expected = expected.float()
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    allowed = (tol["atol"] + tol["rtol"] * expected.abs()) * scale
    bound = f"{tol['atol']:g} + {tol['rtol']:g} |ref|" + (f", x {scale:.3g}" if scale > 1 else "")
    name = str(dtype).replace("torch.", "")

    def gate(candidate: Candidate, out: object) -> dict | None:
        got = _first_tensor(out).float()
        if got.shape != expected.shape:
            return {
                "error": None,
                "bound": bound,
                "detail": f"shape {list(got.shape)} where the reference has {list(expected.shape)}",
            }
        if got.numel() == 0:
            return None
        diff = (got - expected).abs()
        finite = bool(torch.isfinite(got).all())
        if finite and bool((diff <= allowed).all()):
            return None
        error = diff.max().item() if finite else math.inf
        return {
            "error": error,
            "bound": bound,
            "detail": f"max error {error:.3g} against the reference twin, beyond the {name} bound {bound}",
        }

    return gate


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


def _series(timings: dict[int, Timings], excluded: dict[int, set[str]], name: str) -> dict[int, float]:
    """name's time at each row count where it ran (inf where the gate left it out)."""
    out = {n: t.stat(name) for n, t in timings.items() if name in t}
    out.update({n: math.inf for n, names in excluded.items() if name in names})
    return out


def _lstm_choice(layout: str, timings: dict, excluded: dict, concurrency: bool) -> tuple[int, int, int]:
    """The op's tuning for this layout from its timings, UNSET where they do not decide."""
    gemv: dict[str, int | None] = {}
    cost: dict[str, dict[int, float]] = {}
    for mode in ("in turn", "concurrent"):
        gemm = _series(timings, excluded, f"{layout}/{mode}/gemm")
        g = _series(timings, excluded, f"{layout}/{mode}/gemv")
        threshold = 0 if layout == "packed" else gemv_threshold(LSTM_ROWS, g, gemm)
        gemv[mode] = threshold
        if threshold is None:
            cost[mode] = {}
            continue
        cost[mode] = {n: src[n] for n in LSTM_ROWS if n in (src := g if n <= threshold else gemm)}
    conc = concurrent_from(LSTM_ROWS, cost["in turn"], cost["concurrent"]) if concurrency else 0
    return tuple(UNSET if v is None else v for v in (gemv["in turn"], gemv["concurrent"], conc))  # type: ignore


def _runs_at(layout: str, choice: tuple[int, int, int], n: int) -> str:
    """The candidate a choice runs at n rows."""
    gemv_turn, gemv_conc, conc_min = choice
    concurrent = conc_min > 0 and n >= conc_min
    mode = "concurrent" if concurrent else "in turn"
    gemm = "gemv" if n <= (gemv_conc if concurrent else gemv_turn) and layout != "packed" else "gemm"
    return f"{layout}/{mode}/{gemm}"


def against_default(timings: dict[int, Timings], runs: dict[int, str], default: str) -> dict | None:
    """A choice (``runs``: the candidate it runs at each row count) against ``default``: {"ratio": the
    geometric mean of the per-row-count median ratios, "spread": the mean of their spreads, "by_rows":
    {n: ratio}}; None unless every row count compared."""
    ratios, spreads, by_rows = [], [], {}
    for n, name in runs.items():
        cmp = timings[n].compare(name, default) if n in timings else None
        if cmp is None:
            return None
        ratios.append(math.log(max(cmp.ratio, 1e-9)))
        spreads.append(cmp.spread)
        by_rows[n] = cmp.ratio
    if not ratios:
        return None
    return {"ratio": math.exp(sum(ratios) / len(ratios)), "spread": sum(spreads) / len(spreads), "by_rows": by_rows}


# ---- the measurements ------------------------------------------------------------------------------


def lstm_case(C: int, n: int, gen: torch.Generator):
    """Inputs of a one-layer ``bilstm`` over n rows, of STEPS steps each (one from FEW_ROWS rows on)."""
    steps = STEPS if n <= FEW_ROWS else 1
    xg0 = torch.randn(n, 2, 4 * C, generator=gen)
    index = torch.arange(n).unsqueeze(1).expand(n, steps).contiguous()
    lengths = torch.full((n,), steps, dtype=torch.long)
    return xg0, index, lengths


def _lstm_candidates(
    layouts: dict[str, list[Tensor]], case, concurrency: bool, gemv_alive: set[str]
) -> list[Candidate]:
    """The default and the (layout, schedule, GEMM) candidates of one row count, named
    "layout/schedule/gemv|gemm"."""
    xg0, index, lengths = case
    out = [
        Candidate(
            DEFAULT_NAME,
            lambda w=layouts["plain"]: ops.bilstm(xg0, index, lengths, w, None, None, None, None, None),
        )
    ]
    modes = [("in turn", 0)] + ([("concurrent", 1)] if concurrency else [])
    for layout, weights in layouts.items():
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
                    )
                )
    return out


def packable(lstm_weights: Sequence[Tensor], precision: str) -> bool:
    """Whether :func:`~elmo_fast.bilm.ops.pack_weight` takes every GEMM weight of the LSTM in ``precision``
    (N a multiple of 16; K even in bf16)."""
    g = 2 if precision == "bf16" else 1
    return all(w.shape[0] % 16 == 0 and w.shape[1] % g == 0 for k, w in enumerate(lstm_weights) if k % 4 != 2)


def lstm_layouts(lstm_weights: Sequence[Tensor], precision: str, packed: bool) -> dict[str, list[Tensor]]:
    """Layer 0's op weights in ``precision`` ("plain"), and packed for the micro-kernel ("packed", when
    ``packed``); the biases stay fp32."""
    w32 = [w.detach() for w in lstm_weights[:8]]
    plain = [w if k % 4 == 2 else w.to(torch.bfloat16) for k, w in enumerate(w32)] if precision == "bf16" else w32
    layouts = {"plain": plain}
    if packed:
        layouts["packed"] = [w if k % 4 in (0, 2) else ops.pack_weight(plain[k]) for k, w in enumerate(plain)]
    return layouts


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def calibrate(
    lstm_weights: Sequence[Tensor],
    highway: tuple | None,
    precision: str,
    *,
    chooser: Chooser | None = None,
    seed: int | None = None,
    packed_available: bool | None = None,
) -> Outcome:
    """Measure and choose for this model (``lstm_weights``: the encoder's flat fp32 weights,
    ``highway``: (weights, biases, proj_weight, proj_bias) of a char token embedder, or None) in
    ``precision`` ("fp32", "bf16"; other modes take the defaults) at torch's current thread count.
    ``packed_available``: whether this CPU runs packed weights of the precision (else they are not
    offered; default: asked of the CPU now, :func:`~elmo_fast.bilm.ops.packed_gemm_available`). ``seed``: the inputs' (default: fresh from the OS)."""
    chooser = chooser or Chooser()
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    concurrency = threads >= 2
    report: dict = {"lstm": {}, "highway": {}, "seed": seed, "threads": threads, "rounds": chooser.rounds}
    if precision not in ("fp32", "bf16"):
        return Outcome(DEFAULT, report=report)
    if packed_available is None:
        packed_available = ops.packed_gemm_available(torch.bfloat16 if precision == "bf16" else torch.float32)
    offer_packed = packed_available and packable(lstm_weights, precision)
    if not offer_packed:
        chooser.notes.append(
            "packed: not offered ("
            + ("this CPU does not run them" if not packed_available else "the shapes cannot be packed")
            + ")"
        )
    layouts = lstm_layouts(lstm_weights, precision, offer_packed)
    ref_weights = [w.float() for w in layouts["plain"]]  # bf16: the rounded weights, as the kernels see them
    gate_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    C = int(lstm_weights[3].shape[1])
    # The GEMV's threshold is where it first loses (gemv_threshold): once it has, it is not timed again.
    gemv_alive = {f"{layout}/{mode}" for layout in layouts for mode in ("in turn", "concurrent")}
    timings: dict[int, Timings] = {}
    excluded: dict[int, set[str]] = {}
    with torch.inference_mode():
        for n in LSTM_ROWS:
            case = lstm_case(C, n, gen)
            expected = reference.bilstm_ref(*case, ref_weights, None, None)[0]
            before = len(chooser.excluded)
            t = chooser.measure(
                _lstm_candidates(layouts, case, concurrency, gemv_alive),
                gate=reference_gate(expected, gate_dtype),
                keep=[DEFAULT_NAME],
                where=f"bilstm, {precision}, {n} rows",
            )
            excluded[n] = {e["candidate"] for e in chooser.excluded[before:]}
            if not t:
                break
            timings[n] = t
            report["lstm"][n] = t.to_dict()
            for key in list(gemv_alive):
                if t.stat(f"{key}/gemv") > t.stat(f"{key}/gemm") or f"{key}/gemv" in excluded[n]:
                    gemv_alive.discard(key)
        highway_rows, highway_result = None, None
        if precision == "fp32" and highway is not None and highway[0]:
            highway_rows, highway_result = _calibrate_highway(highway, chooser, gen, report["highway"])
    outcome = Outcome(DEFAULT, report=report, excluded=chooser.excluded, notes=chooser.notes)
    default_wrong = any(DEFAULT_NAME in names for names in excluded.values())
    choices = {layout: _lstm_choice(layout, timings, excluded, concurrency) for layout in layouts}
    compared = {}
    for layout, choice in choices.items():
        if UNSET in choice or len(timings) < len(LSTM_ROWS):
            continue
        result = against_default(timings, {n: _runs_at(layout, choice, n) for n in LSTM_ROWS}, DEFAULT_NAME)
        if result is not None:
            compared[layout] = result
    report["compared"] = compared
    lstm, packed = None, False
    if compared:
        need = {
            layout: MIN_MARGIN + (PACKED_FP32_MARGIN if layout == "packed" and precision == "fp32" else 0.0)
            for layout in compared
        }
        # the layout with the most to spare over what it must gain
        layout = max(compared, key=lambda k: (1 - compared[k]["ratio"]) - need[k])
        best = compared[layout]
        outcome.margin, outcome.spread = 1 - best["ratio"], best["spread"]
        if default_wrong or outcome.margin > max(need[layout], best["spread"]):
            lstm, packed = choices[layout], layout == "packed"
            rows = min(best["by_rows"], key=best["by_rows"].get)
            outcome.check = {"rows": rows, "ratio": best["by_rows"][rows]}
    elif default_wrong:
        # The default itself is left out: nothing to compare with. The fastest complete choice whose kernels
        # all agree with the reference is taken (mean log time over the row counts), however much it gains.
        scores = {}
        for layout, choice in choices.items():
            if UNSET in choice or len(timings) < len(LSTM_ROWS):
                continue
            logs = [math.log(max(timings[n].stat(_runs_at(layout, choice, n)), 1e-12)) for n in LSTM_ROWS]
            if all(math.isfinite(v) for v in logs):
                scores[layout] = sum(logs) / len(logs)
        if scores:
            layout = min(scores, key=scores.get)
            lstm, packed = choices[layout], layout == "packed"
        chooser.notes.append(
            "the kernels' default disagrees with the reference: "
            + ("the fastest choice that agrees is taken" if scores else "no other choice was measured")
        )
    # Layer 0's input gates (weight [4C, P], as W_hh) run outside the op, on all threads: the in-turn
    # threshold. Packed weights take the micro-kernel; bf16 plain weights compute them in fp32, untimed here.
    linear = lstm[0] if lstm is not None and precision == "fp32" and not packed else None
    outcome.tuning = CpuTuning(lstm=lstm, linear_gemv_rows=linear, highway_gemv_rows=highway_rows, packed=packed)
    outcome.highway = highway_result
    outcome.busy = chooser.contention.share
    outcome.complete = chooser.complete and len(timings) == len(LSTM_ROWS)
    return outcome


def _calibrate_highway(
    highway: tuple, chooser: Chooser, gen: torch.Generator, report: dict
) -> tuple[int | None, dict | None]:
    """The highway's GEMV threshold (None: its default) and how it compared with the default."""
    weights, biases, proj_w, proj_b = (
        [w.detach() for w in highway[0]],
        [b.detach() for b in highway[1]],
        highway[2].detach(),
        highway[3].detach(),
    )
    F = weights[0].shape[1]
    timings: dict[int, Timings] = {}
    excluded: dict[int, set[str]] = {}
    for n in HIGHWAY_ROWS:
        x = torch.randn(n, F, generator=gen)
        expected = reference.highway_ref(x, weights, biases, proj_w, proj_b)
        before = len(chooser.excluded)
        t = chooser.measure(
            [
                Candidate(name, lambda r=rows: ops.highway(x, weights, biases, proj_w, proj_b, r))
                for name, rows in (("default", None), ("gemv", ALWAYS), ("blas", 0))
            ],
            gate=reference_gate(expected, torch.float32),
            keep=["default"],
            where=f"highway, fp32, {n} rows",
        )
        excluded[n] = {e["candidate"] for e in chooser.excluded[before:]}
        if not t:
            return None, None
        timings[n] = t
        report[n] = t.to_dict()
    threshold = gemv_threshold(HIGHWAY_ROWS, _series(timings, excluded, "gemv"), _series(timings, excluded, "blas"))
    if threshold is None:
        return None, None
    if any("default" in names for names in excluded.values()):  # the default disagrees: the threshold that agrees
        return threshold, {"margin": None, "spread": None, "chosen": True}
    result = against_default(timings, {n: "gemv" if n <= threshold else "blas" for n in HIGHWAY_ROWS}, "default")
    if result is None:
        return None, None
    margin = 1 - result["ratio"]
    chosen = margin > max(MIN_MARGIN, result["spread"])
    return (threshold if chosen else None), {"margin": margin, "spread": result["spread"], "chosen": chosen}
