"""The chooser's timing (elmo_fast.tuning.measure): a warm-up run then interleaved rounds; a candidate's time is
a low quantile of its rounds; two candidates compare by the median of their per-round ratios, with the spread of
those ratios; a busy moment that hits one round hits every candidate of it; the gate leaves candidates out."""

from __future__ import annotations

import math

import pytest
import torch
from fake_clock import FakeClock, costing

from elmo_fast.tuning.measure import MIN_ROUNDS, Candidate, Chooser, Contention, Timings, quantile


def test_quantile_interpolates_between_order_statistics():
    assert quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.25) == 2.0
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert quantile([7.0], 0.25) == 7.0
    assert quantile([], 0.5) == math.inf


def test_rounds_are_interleaved_and_rotate():
    clock = FakeClock()
    order = []

    def run(name):
        def f():
            order.append(name)
            clock.advance(0.001)
            return torch.ones(1)

        return f

    Chooser(clock=clock, rounds=3).measure([Candidate(n, run(n)) for n in "abc"])
    warm_up, rounds = order[:3], order[3:]
    assert warm_up == ["a", "b", "c"]
    assert rounds == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # every round runs each, the start rotates


def test_a_busy_round_slows_every_candidate_alike_and_the_ratio_survives_it():
    clock = FakeClock()
    # b is 20% faster than a; round 2 (the third timed run) is hit by a burst of other work: 10x for both
    a = [1.0, 1.0, 1.0, 10.0, 1.0, 1.0]  # warm-up, then 5 rounds
    b = [0.8, 0.8, 0.8, 8.0, 0.8, 0.8]
    t = Chooser(clock=clock, budget_s=100).measure(
        [Candidate("a", costing(clock, a)), Candidate("b", costing(clock, b))]
    )
    cmp = t.compare("b", "a")
    assert cmp.ratio == pytest.approx(0.8) and cmp.spread == pytest.approx(0.0) and cmp.rounds == 5
    assert t.stat("a") == pytest.approx(1.0) and t.stat("b") == pytest.approx(0.8)  # the burst is not the time


def test_the_spread_says_how_far_a_comparison_can_be_trusted():
    clock = FakeClock()
    a = [1.0] * 6
    b = [1.0, 0.9, 1.1, 0.95, 1.05, 1.0]  # as fast, give or take 10%
    t = Chooser(clock=clock, budget_s=100).measure(
        [Candidate("a", costing(clock, a)), Candidate("b", costing(clock, b))]
    )
    cmp = t.compare("b", "a")
    assert cmp.ratio == pytest.approx(1.0) and cmp.spread == pytest.approx(0.1)


def test_hopeless_candidates_stop_after_min_rounds_but_kept_ones_never_do():
    clock = FakeClock()
    t = Chooser(clock=clock, budget_s=100, rounds=5).measure(
        [
            Candidate("default", costing(clock, 3.0)),
            Candidate("fast", costing(clock, 1.0)),
            Candidate("slow", costing(clock, 2.0)),
        ],
        keep=["default"],
    )
    assert len(t.rounds["slow"]) == MIN_ROUNDS and len(t.rounds["default"]) == 5 and len(t.rounds["fast"]) == 5
    assert t.stat("slow") == pytest.approx(2.0)  # measured, in its rounds
    assert t.compare("slow", "fast") is not None


def test_failing_and_gated_candidates_are_left_out_and_said():
    clock = FakeClock()
    chooser = Chooser(clock=clock)

    def broken():
        clock.advance(0.001)
        raise RuntimeError("pack_weight: no such kernel\nsecond line")

    def gate(candidate, out):
        return None if bool((out == 1).all()) else {"error": 0.5, "bound": "1e-05", "detail": "off by 0.5"}

    t = chooser.measure(
        [
            Candidate("good", costing(clock, 0.02)),
            Candidate("broken", broken),
            Candidate("wrong", costing(clock, 0.001, torch.full((3,), 1.5))),
        ],
        gate=gate,
        where="bilstm, fp32, 4 rows",
    )
    assert set(t.rounds) == {"good"}  # fast but wrong never competes
    assert chooser.notes[0] == "broken: failed (RuntimeError: pack_weight: no such kernel)"
    assert chooser.notes[1] == "wrong (bilstm, fp32, 4 rows): left out, off by 0.5"
    assert chooser.excluded == [
        {"candidate": "wrong", "where": "bilstm, fp32, 4 rows", "error": 0.5, "bound": "1e-05", "detail": "off by 0.5"}
    ]


def test_the_budget_ends_rounds_early_and_starts_no_new_group():
    clock = FakeClock()
    chooser = Chooser(clock=clock, budget_s=1.2, rounds=5)
    t = chooser.measure([Candidate("a", costing(clock, 0.125)), Candidate("b", costing(clock, 0.125))])
    # 0.25 s of warm-up, then rounds of 0.25 s: past 1.2 s after the 4th round
    assert len(t.rounds["a"]) == 4 and chooser.complete
    assert not chooser.measure([Candidate("c", costing(clock, 0.001))])
    assert chooser.notes == ["budget of 1.2 s spent: c not measured"] and not chooser.complete
    # a group the budget cuts before MIN_ROUNDS is not measured at all: a busy machine overruns by one round
    clock = FakeClock()
    chooser = Chooser(clock=clock, budget_s=0.75)
    t = chooser.measure([Candidate("a", costing(clock, 0.125)), Candidate("b", costing(clock, 0.125))])
    assert not t and clock.now == 0.75 and not chooser.complete
    assert chooser.notes == ["budget of 0.75 s spent: a, b measured 2 round(s) only, not enough (a group)"]


def test_timings_compare_needs_min_rounds():
    t = Timings({"a": [1.0, 1.0], "b": [1.0, 1.0]})
    assert t.compare("a", "b") is None and t.stat("a") == math.inf


def test_contention_is_a_share_of_the_time_the_threads_could_run():
    c = Contention()
    c.start()
    sum(i * i for i in range(20000))
    c.stop()
    assert 0.0 <= c.share <= 1.0 and c.possible > 0
