"""calibrate() (elmo_fast.tuning.calibration) on the real ops with a fake clock: choices follow the timings
as stated; a choice replaces the kernels' defaults only by a margin larger than the measured spread; every
candidate meets the reference twin before it can win, and one that does not is left out and never chosen."""

from __future__ import annotations

import math

import pytest
import torch
from cpu_features import needs_packed_bf16
from fake_clock import FakeClock

from elmo_fast.bilm import ops
from elmo_fast.bilm.cpu_choices import ALWAYS, DEFAULT, UNSET, CpuTuning
from elmo_fast.tuning import calibration
from elmo_fast.tuning.measure import Chooser

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


def tiny_lstm(P=16, C=16, L=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = []
    for _ in range(2 * L):
        w += [
            torch.randn(4 * C, P, generator=gen) * 0.2,
            torch.randn(4 * C, P, generator=gen) * 0.2,
            torch.randn(4 * C, generator=gen) * 0.1,
            torch.randn(P, C, generator=gen) * 0.2,
        ]
    return w


#: what the kernels run with tuning=None for these small fp32 weights (csrc/cpu/tuning.cpp): the GEMV up to
#: 32 rows, the directions concurrently from 9
DEFAULT_GEMV_ROWS, DEFAULT_CONCURRENT_FROM = 32, 9


def kernel_runs(n: int, tuning, threads: int = 2) -> tuple[bool, bool]:
    """(GEMV?, concurrent?) of a bilstm call at n rows with this tuning (None: the defaults)."""
    if tuning is None:
        return n <= DEFAULT_GEMV_ROWS, threads >= 2 and n >= DEFAULT_CONCURRENT_FROM
    concurrent = threads >= 2 and tuning[2] > 0 and n >= tuning[2]
    return n <= (tuning[1] if concurrent else tuning[0]), concurrent


def fake_costs(monkeypatch, clock, cost, wrong=None):
    """ops.bilstm (as calibration calls it) really runs, then moves the fake clock by cost(n, gemv,
    concurrent, packed); ``wrong(n, gemv, concurrent, packed)``: whether that kernel's result is off."""
    real = ops.bilstm

    def timed(xg0, token_index, lengths, weights, *args):
        out = real(xg0, token_index, lengths, weights, *args)
        n, packed = token_index.shape[0], weights[1].dim() == 4
        gemv, concurrent = kernel_runs(n, args[-1])
        gemv = gemv and not packed
        clock.advance(cost(n, gemv, concurrent, packed))
        if wrong is not None and wrong(n, gemv, concurrent, packed):
            out = (out[0] + 0.5, *out[1:])
        return out

    monkeypatch.setattr(calibration.ops, "bilstm", timed)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)


def chooser(clock):
    return Chooser(clock=clock, budget_s=1e9)


@needs_extension
def test_calibrate_chooses_what_was_fastest_by_more_than_the_margin(monkeypatch):
    clock = FakeClock()

    # GEMV faster up to 16 rows in turn, never concurrently; concurrent faster from 16 rows on; packed slower
    def cost(n, gemv, concurrent, packed):
        t = n * (1.0 if not concurrent or n < 16 else 0.5)
        if gemv:
            t *= 0.8 if (n <= 16 and not concurrent) else 1.5
        return t * 1e-4 * (1.5 if packed else 1.0)

    fake_costs(monkeypatch, clock, cost)
    out = calibration.calibrate(tiny_lstm(), None, "fp32", chooser=chooser(clock), seed=1)
    assert out.tuning == CpuTuning(lstm=(32, 0, 8), linear_gemv_rows=32, highway_gemv_rows=None, packed=False)
    # against the default (GEMV to 32 rows, concurrent from 9): the same at 1, 4 and 64 rows; at 16 rows
    # concurrent GEMMs (8) instead of concurrent GEMVs (12)
    assert out.margin == pytest.approx(1 - (8 / 12) ** 0.25) and out.spread == pytest.approx(0.0)
    assert out.check == {"rows": 16, "ratio": pytest.approx(8 / 12)}
    assert out.complete and out.excluded == [] and set(out.report["lstm"]) == {1, 4, 16, 64}
    # the GEMV lost concurrently at 1 row: never timed concurrently again
    assert "plain/concurrent/gemv" not in out.report["lstm"][4]


@needs_extension
def test_a_gain_within_the_spread_keeps_the_defaults(monkeypatch):
    clock = FakeClock()
    calls = {"n": 0}

    # BLAS 2% faster than the GEMV at few rows, but every run varies by +-10%: the measurement cannot tell
    def cost(n, gemv, concurrent, packed):
        calls["n"] += 1
        noise = 1.0 + (0.1 if calls["n"] % 3 == 0 else -0.1 if calls["n"] % 3 == 1 else 0.0)
        return n * 1e-4 * (1.0 if gemv else 0.98) * (1.0 if not packed else 2.0) * noise

    fake_costs(monkeypatch, clock, cost)
    out = calibration.calibrate(tiny_lstm(), None, "fp32", chooser=chooser(clock), seed=1)
    assert out.tuning == DEFAULT and out.check is None
    assert out.margin is not None and out.margin < max(calibration.MIN_MARGIN, out.spread)


@needs_extension
@needs_packed_bf16
def test_calibrate_packs_bf16_weights_when_that_is_faster(monkeypatch):
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: (0.5 if packed else 1.0) * n * 1e-4)
    out = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=chooser(clock), seed=1)
    assert out.tuning.packed and out.tuning.linear_gemv_rows is None and out.margin == pytest.approx(0.5)
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: (2.0 if packed else 1.0) * n * 1e-4)
    assert not calibration.calibrate(tiny_lstm(), None, "bf16", chooser=chooser(clock), seed=1).tuning.packed


@needs_extension
def test_packed_weights_are_not_offered_where_they_do_not_run(monkeypatch):
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: (0.1 if packed else 1.0) * n * 1e-4)
    out = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=chooser(clock), seed=1, packed_available=False)
    assert not out.tuning.packed
    assert not any(name.startswith("packed/") for t in out.report["lstm"].values() for name in t)
    assert "packed: not offered (this CPU does not run them)" in out.notes


@needs_extension
def test_every_candidate_meets_the_reference_before_it_can_win(monkeypatch):
    """A wrong GEMV (the default's kernel at few rows, and the fastest): left out, never chosen, while the
    kernels that agree with the reference twin are compared and chosen among (comparing candidates with the
    first one, a GEMV, would have left the right ones out instead)."""
    clock = FakeClock()
    fake_costs(
        monkeypatch,
        clock,
        lambda n, gemv, conc, packed: n * 1e-4 * (0.5 if gemv else 1.0),
        wrong=lambda n, gemv, conc, packed: gemv,
    )
    out = calibration.calibrate(tiny_lstm(), None, "fp32", chooser=chooser(clock), seed=1)
    left_out = {(e["candidate"], e["where"]) for e in out.excluded}
    assert ("plain/in turn/gemv", "bilstm, fp32, 1 rows") in left_out
    assert ("plain/default", "bilstm, fp32, 1 rows") in left_out  # the default runs the GEMV at 1 row
    assert not any("gemm" in name for name, _ in left_out)
    e = next(e for e in out.excluded if e["candidate"] == "plain/in turn/gemv")
    assert e["error"] == pytest.approx(0.5, rel=1e-3) and e["bound"] == "1e-05 + 0 |ref|"
    assert "against the reference twin, beyond the float32 bound" in e["detail"]
    # the GEMV is never chosen: thresholds 0, whatever its speed
    assert out.tuning.lstm is not None and out.tuning.lstm[:2] == (0, 0) and out.tuning.linear_gemv_rows == 0


@needs_extension
@needs_packed_bf16
def test_the_gate_holds_bf16_candidates_to_the_bf16_bound(monkeypatch):
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: n * 1e-4)
    out = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=chooser(clock), seed=2)
    assert out.excluded == []  # real bf16 kernels against the reference on the same rounded weights
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: n * 1e-4, wrong=lambda n, gemv, conc, packed: packed)
    out = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=chooser(clock), seed=2)
    assert {e["candidate"] for e in out.excluded} == {"packed/in turn/gemm", "packed/concurrent/gemm"}
    assert all("bfloat16 bound 0.02 + 0.01 |ref|" in e["detail"] for e in out.excluded)
    assert not out.tuning.packed


def test_reference_gate_scales_with_the_output():
    expected = torch.tensor([100.0, -50.0, 0.0])
    gate = calibration.reference_gate(expected, torch.float32)
    assert gate(None, expected + 5e-4) is None  # 1e-5 of an output of magnitude 100
    why = gate(None, expected + 2e-3)
    assert why["error"] == pytest.approx(2e-3) and why["bound"] == "1e-05 + 0 |ref|, x 100"
    assert gate(None, torch.tensor([math.nan, 0.0, 0.0]))["error"] == math.inf
    assert "shape [2]" in gate(None, torch.zeros(2))["detail"]


@needs_extension
def test_calibrate_falls_back_to_the_defaults(monkeypatch):
    # the budget spent after the first row count: whatever was not decided is the kernels' default
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: 0.25)  # binary fractions: exact sums
    out = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=Chooser(clock=clock, budget_s=1.0), seed=1)
    assert out.tuning == DEFAULT and not out.complete
    assert any(n.startswith("budget of 1 s spent") for n in out.notes)
    # precisions it does not measure: the defaults outright
    assert calibration.calibrate(tiny_lstm(), None, "tf32").tuning == DEFAULT


def test_thresholds_from_timings():
    rows = (1, 4, 16, 64)
    fast, slow = 1.0, 2.0
    g = calibration.gemv_threshold
    assert g(rows, {1: fast, 4: fast, 16: slow}, {1: slow, 4: slow, 16: fast}) == 8  # between 4 and 16
    assert g(rows, {1: slow}, {1: fast}) == 0  # never the GEMV
    assert g(rows, {1: math.inf}, {1: fast}) == 0  # a GEMV the gate left out loses
    assert g(rows, dict.fromkeys(rows, fast), dict.fromkeys(rows, slow)) == 128  # always: twice the last
    assert g(rows, {1: fast, 4: fast}, {1: slow, 4: slow}) is None  # budget ran out: unknown
    c = calibration.concurrent_from
    assert c(rows, dict.fromkeys(rows, fast), dict.fromkeys(rows, slow)) == 0  # never concurrent
    assert c(rows, dict.fromkeys(rows, slow), dict.fromkeys(rows, fast)) == 1  # always
    assert c(rows, {1: fast, 4: fast, 16: slow, 64: slow}, {1: slow, 4: slow, 16: fast, 64: fast}) == 8
    # a win at 4 that does not last is no threshold: concurrent past the last loss (16), before 64
    assert c(rows, {1: fast, 4: slow, 16: fast, 64: slow}, {1: slow, 4: fast, 16: slow, 64: fast}) == 32
    assert c(rows, {1: fast}, {1: slow}) is None  # not measured everywhere


def test_tuning_from_a_dict_is_checked():
    t = CpuTuning(lstm=(0, 0, 9), linear_gemv_rows=128, highway_gemv_rows=32, packed=True)
    assert CpuTuning.from_dict(t.to_dict()) == t
    assert CpuTuning.from_dict(DEFAULT.to_dict()) == DEFAULT
    for bad in [
        None,
        [],
        {},
        {**t.to_dict(), "lstm": [1, 2]},
        {**t.to_dict(), "lstm": [1, 2, -2]},
        {**t.to_dict(), "packed": 1},
        {**t.to_dict(), "highway_gemv_rows": -1},
        {**t.to_dict(), "linear_gemv_rows": True},
        {**t.to_dict(), "extra": 1},
        {**t.to_dict(), "lstm": "128"},
        {**t.to_dict(), "lstm": [0, 0, None]},
    ]:
        with pytest.raises(ValueError):
            CpuTuning.from_dict(bad)
    assert t.describe() == (
        "LSTM GEMV rows in turn 0, concurrent 0, directions concurrent from 9 rows, layer 0 GEMV rows 128, "
        "highway GEMV rows 32, weights packed"
    )
    assert DEFAULT.describe() == "the kernels' defaults"
    assert CpuTuning(lstm=(ALWAYS, UNSET, 0)).describe().startswith("LSTM GEMV rows in turn always, concurrent default")


@needs_extension
def test_a_wrong_highway_gemv_is_left_out_and_never_chosen(monkeypatch):
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, gemv, conc, packed: n * 1e-4)
    real = ops.highway

    def highway(x, weights, biases, proj_w, proj_b, gemv_max_rows=None):
        out = real(x, weights, biases, proj_w, proj_b, gemv_max_rows)
        clock.advance(1e-5 * x.shape[0])
        gemv = x.shape[0] <= (DEFAULT_GEMV_ROWS if gemv_max_rows is None else gemv_max_rows)
        return out + 0.5 if gemv else out  # the GEMV is wrong (and the fastest: no cost of its own)

    monkeypatch.setattr(calibration.ops, "highway", highway)
    gen = torch.Generator().manual_seed(3)
    F, P = 32, 16
    hw = (
        [torch.randn(2 * F, F, generator=gen) * 0.2 for _ in range(2)],
        [torch.randn(2 * F, generator=gen) * 0.1 for _ in range(2)],
        torch.randn(P, F, generator=gen) * 0.2,
        torch.randn(P, generator=gen) * 0.1,
    )
    out = calibration.calibrate(tiny_lstm(), hw, "fp32", chooser=chooser(clock), seed=1)
    left_out = {(e["candidate"], e["where"]) for e in out.excluded if e["where"].startswith("highway")}
    assert left_out == {
        ("default", "highway, fp32, 16 rows"),
        ("gemv", "highway, fp32, 16 rows"),
        ("gemv", "highway, fp32, 64 rows"),
    }
    assert out.tuning.highway_gemv_rows == 0 and out.highway == {"margin": None, "spread": None, "chosen": True}
