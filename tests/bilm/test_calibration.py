"""The CPU calibration (elmo_fast.bilm.calibration, calibration_store, cpu_tuning): the chooser picks
the faster candidate on a fake clock and falls back safely; choices derive from timings as stated; the
disk store never trusts a file it cannot vouch for; the model runs what was chosen, within its bounds.
(conftest.py turns calibration off for the rest of the suite; these tests turn it on.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from tolerances import MODEL_BOUNDS, TOL

from elmo_fast import ElmoBiLm, ElmoEmbedder, batch_to_ids
from elmo_fast.bilm import calibration, calibration_store, cpu_tuning, ops
from elmo_fast.bilm.calibration import ALWAYS, DEFAULT, UNSET, Candidate, Chooser, CpuTuning

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


class FakeClock:
    """A clock that only moves when a candidate 'runs' (advance)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def costing(clock: FakeClock, seconds, result=None):
    """A candidate run that takes ``seconds`` (a number, or a list consumed one per run) of fake time."""
    times = list(seconds) if isinstance(seconds, (list, tuple)) else None
    value = torch.ones(3) if result is None else result

    def run():
        clock.advance(times.pop(0) if times is not None else seconds)
        return value

    return run


# --- the chooser ----------------------------------------------------------------------------------------


def test_chooser_picks_the_faster_candidate_by_its_best_run():
    clock = FakeClock()
    chooser = Chooser(clock=clock, repeats=2)
    # "b" has a slow first run (a kernel generated, say) but is the faster one afterwards
    t = chooser.measure(
        [Candidate("a", costing(clock, [0.010, 0.009, 0.011])), Candidate("b", costing(clock, [0.050, 0.004, 0.005]))]
    )
    assert t == {"a": pytest.approx(0.009), "b": pytest.approx(0.004)}
    assert min(t, key=t.get) == "b" and chooser.notes == []


def test_chooser_runs_hopeless_candidates_once_after_its_first_group():
    clock = FakeClock()
    chooser = Chooser(clock=clock, repeats=1)
    # first group: every candidate runs twice (first runs may pay one-time costs)
    assert chooser.measure(
        [Candidate("a", costing(clock, [0.1, 0.01])), Candidate("b", costing(clock, [0.02, 0.02]))]
    ) == {"a": pytest.approx(0.01), "b": pytest.approx(0.02)}
    # later groups: "slow" (over 1.5x the best first run) is not run again, even if it would have improved
    runs = {"fast": costing(clock, [0.010, 0.010]), "slow": costing(clock, [0.016, 0.001])}
    t = chooser.measure([Candidate(name, run) for name, run in runs.items()])
    assert t == {"fast": pytest.approx(0.010), "slow": pytest.approx(0.016)}


def test_chooser_leaves_out_failing_and_disagreeing_candidates():
    clock = FakeClock()
    chooser = Chooser(clock=clock)

    def broken():
        clock.advance(0.001)
        raise RuntimeError("pack_weight: no such kernel\nsecond line")

    t = chooser.measure(
        [
            Candidate("ref", costing(clock, 0.02)),
            Candidate("broken", broken),
            Candidate("wrong", costing(clock, 0.001, torch.full((3,), 1.5)), tolerance=0.1),
            Candidate("nan", costing(clock, 0.001, torch.tensor([1.0, math.nan, 1.0])), tolerance=0.1),
            Candidate("close", costing(clock, 0.01, torch.full((3,), 1.05)), tolerance=0.1),
        ]
    )
    assert set(t) == {"ref", "close"}  # fast but wrong never wins
    assert chooser.notes[0] == "broken: failed (RuntimeError: pack_weight: no such kernel)"
    assert chooser.notes[1] == "wrong: result differs from ref's beyond 0.1: left out"
    assert chooser.notes[2].startswith("nan: result differs")


def test_chooser_stops_measuring_when_its_budget_is_spent():
    clock = FakeClock()
    chooser = Chooser(clock=clock, budget_s=0.05)
    assert chooser.measure([Candidate("a", costing(clock, 0.03)), Candidate("b", costing(clock, 0.02))])
    assert chooser.measure([Candidate("c", costing(clock, 0.001))]) == {}
    assert chooser.notes == ["budget of 0.05 s spent: c not measured"]


def test_thresholds_from_timings():
    rows = (1, 4, 16, 64)
    fast, slow = 1.0, 2.0
    g = calibration.gemv_threshold
    assert g(rows, {1: fast, 4: fast, 16: slow}, {1: slow, 4: slow, 16: fast}) == 8  # between 4 and 16
    assert g(rows, {1: slow}, {1: fast}) == 0  # never the GEMV
    assert g(rows, dict.fromkeys(rows, fast), dict.fromkeys(rows, slow)) == 128  # always: twice the last
    assert g(rows, {1: fast, 4: fast}, {1: slow, 4: slow}) is None  # budget ran out: unknown
    c = calibration.concurrent_from
    assert c(rows, dict.fromkeys(rows, fast), dict.fromkeys(rows, slow)) == 0  # never concurrent
    assert c(rows, dict.fromkeys(rows, slow), dict.fromkeys(rows, fast)) == 1  # always
    assert c(rows, {1: fast, 4: fast, 16: slow, 64: slow}, {1: slow, 4: slow, 16: fast, 64: fast}) == 8
    # a win at 4 that does not last is no threshold: concurrent past the last loss (16), before 64
    assert c(rows, {1: fast, 4: slow, 16: fast, 64: slow}, {1: slow, 4: fast, 16: slow, 64: fast}) == 32
    assert c(rows, {1: fast}, {1: slow}) is None  # not measured everywhere


# --- calibrate() on a real op, its clock driven by the candidates ------------------------------------------


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


def fake_costs(monkeypatch, clock, cost):
    """ops.bilstm (as calibration calls it) really runs, then moves the fake clock by cost(n, tuning, packed)."""
    real = ops.bilstm

    def timed(xg0, token_index, lengths, weights, *args):
        out = real(xg0, token_index, lengths, weights, *args)
        clock.advance(cost(token_index.shape[0], args[-1], weights[1].dim() == 4))
        return out

    monkeypatch.setattr(calibration.ops, "bilstm", timed)


@needs_extension
def test_calibrate_chooses_what_was_fastest(monkeypatch):
    clock = FakeClock()

    # GEMV faster up to 16 rows in turn, never concurrently; concurrent faster from 16 rows on
    def cost(n, tuning, packed):
        gemv = tuning[0] == ALWAYS
        concurrent = tuning[2] == 1
        t = n * (1.0 if not concurrent or n < 16 else 0.5)
        if gemv:
            t *= 0.8 if (n <= 16 and not concurrent) else 1.5
        return t * 1e-4

    fake_costs(monkeypatch, clock, cost)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    tuning, report = calibration.calibrate(tiny_lstm(), None, "fp32", chooser=Chooser(clock=clock))
    assert tuning == CpuTuning(lstm=(32, 0, 8), linear_gemv_rows=32, highway_gemv_rows=None, packed=False)
    assert report["notes"] == [] and set(report["lstm"]) == {1, 4, 16, 64}
    # the GEMV lost concurrently at 1 row: never timed concurrently again
    assert "plain/concurrent/gemv" not in report["lstm"][4]


@needs_extension
def test_calibrate_packs_bf16_weights_when_that_is_faster(monkeypatch):
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, tuning, packed: (0.5 if packed else 1.0) * n * 1e-4)
    tuning, report = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=Chooser(clock=clock))
    assert tuning.packed and tuning.linear_gemv_rows is None and report["scores"]["packed"] < report["scores"]["plain"]
    clock = FakeClock()
    fake_costs(monkeypatch, clock, lambda n, tuning, packed: (2.0 if packed else 1.0) * n * 1e-4)
    assert not calibration.calibrate(tiny_lstm(), None, "bf16", chooser=Chooser(clock=clock))[0].packed


@needs_extension
def test_calibrate_falls_back_to_the_defaults(monkeypatch):
    # packed weights failing (a CPU without the kernel), then the budget spent after one row count:
    # whatever was not decided is the kernels' default (UNSET), never a guess.
    clock = FakeClock()
    real_pack = ops.pack_weight

    def no_pack(w):
        raise RuntimeError("this CPU has no bf16 micro-kernel")

    monkeypatch.setattr(calibration.ops, "pack_weight", no_pack)
    fake_costs(monkeypatch, clock, lambda n, tuning, packed: 0.25)  # binary fractions: exact sums
    tuning, report = calibration.calibrate(tiny_lstm(), None, "bf16", chooser=Chooser(clock=clock, budget_s=1.0))
    assert not tuning.packed and tuning.lstm == (UNSET, UNSET, UNSET)
    assert report["notes"][0].startswith("packed: not available (RuntimeError: this CPU has no bf16 micro-kernel)")
    assert any(n.startswith("budget of 1 s spent") for n in report["notes"]) and not report["complete"]
    monkeypatch.setattr(calibration.ops, "pack_weight", real_pack)
    # precisions it does not measure: the defaults outright
    assert calibration.calibrate(tiny_lstm(), None, "tf32")[0] == DEFAULT


def test_tuning_from_a_dict_is_checked():
    t = CpuTuning(lstm=(0, 0, 9), linear_gemv_rows=128, highway_gemv_rows=32, packed=True)
    assert CpuTuning.from_dict(json.loads(json.dumps(t.to_dict()))) == t
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


# --- the disk store ---------------------------------------------------------------------------------------


def test_store_round_trip_and_what_it_never_trusts(tmp_path):
    key = calibration_store.calibration_key({"lstm": [2, 16, 16]}, "fp32", 2)
    assert {"cpu", "logical_cpus", "torch", "elmo_fast", "extension", "shapes", "precision", "threads"} <= set(key)
    tuning = CpuTuning(lstm=(8, 0, 4), linear_gemv_rows=8)
    path = calibration_store.save(key, tuning, {"lstm": {1: {"a": 0.5, "b": math.inf}}}, 0.25, tmp_path)
    assert calibration_store.load(key, tmp_path) == tuning
    stored = json.loads(path.read_text())
    assert stored["report"]["lstm"]["1"] == {"a": 0.5, "b": None} and stored["seconds"] == 0.25
    # another version, thread count or shape: another key, nothing found
    for other in [{**key, "torch": "0.0"}, {**key, "threads": 3}, {**key, "shapes": {"lstm": [2, 16, 32]}}]:
        assert calibration_store.load(other, tmp_path) is None
    # a file under the right name that is not the right file: cut short, another key, a bad tuning
    for text in [
        path.read_text()[:40],
        json.dumps({**stored, "key": {**key, "torch": "0.0"}}),
        json.dumps({**stored, "tuning": {**stored["tuning"], "lstm": [1]}}),
        "[]",
        "\x00\xff",
    ]:
        path.write_text(text)
        assert calibration_store.load(key, tmp_path) is None, text[:30]


@pytest.fixture
def calibrating(monkeypatch, tmp_path):
    """Calibration on, the store in tmp_path, this process's memory empty; counts calibrations."""
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "on")
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    monkeypatch.delenv("ELMO_FAST_PACKED_WEIGHTS", raising=False)
    cpu_tuning.forget()
    calls = []
    chosen = CpuTuning(lstm=(4, 0, 2), linear_gemv_rows=4, highway_gemv_rows=16, packed=False)

    def fake(lstm_weights, highway, precision, chooser=None):
        calls.append(precision)
        return chosen, {"lstm": {}, "notes": []}

    monkeypatch.setattr(cpu_tuning.calibration, "calibrate", fake)
    yield calls, chosen, tmp_path
    cpu_tuning.forget()


def test_calibrated_once_then_remembered_then_read_from_disk(calibrating, monkeypatch):
    calls, chosen, tmp_path = calibrating
    w = tiny_lstm()
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == chosen
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == chosen and calls == ["fp32"]  # this process remembers
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 1
    cpu_tuning.forget()  # a later process: read from disk, not measured again
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == chosen and calls == ["fp32"]
    assert cpu_tuning.cpu_tuning(w, None, "bf16") == chosen and calls == ["fp32", "bf16"]  # another key
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "refresh")
    cpu_tuning.forget()
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == chosen and calls == ["fp32", "bf16", "fp32"]
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "off")
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == DEFAULT
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "on")
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    assert cpu_tuning.cpu_tuning(w, None, "bf16").packed and cpu_tuning.cpu_tuning(w, None, "fp32").packed
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "0")
    assert not cpu_tuning.cpu_tuning(w, None, "bf16").packed
    # weights it cannot pack stay plain, said once
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    with pytest.warns(RuntimeWarning, match="cannot be packed in bf16"):
        assert not cpu_tuning.cpu_tuning(tiny_lstm(P=15, C=16), None, "bf16").packed


def test_a_corrupt_store_is_measured_again_and_rewritten(calibrating):
    calls, chosen, tmp_path = calibrating
    w = tiny_lstm()
    cpu_tuning.cpu_tuning(w, None, "fp32")
    (path,) = (tmp_path / "calibration").glob("*.json")
    path.write_text('{"key": {}, "tuning": {"lstm": [1, 2, 3], "linear_gemv_rows": 1}}')
    cpu_tuning.forget()
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == chosen and calls == ["fp32", "fp32"]
    assert calibration_store.load(json.loads(path.read_text())["key"], tmp_path / "calibration") == chosen


def test_a_store_that_cannot_be_written_costs_nothing_but_a_note(calibrating, monkeypatch, caplog):
    calls, chosen, tmp_path = calibrating
    (tmp_path / "calibration").write_text("a file where the folder should be")
    assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == chosen
    assert "could not store the CPU calibration" in caplog.text


@pytest.mark.slow
def test_one_process_measures_while_the_others_wait_for_its_result(calibrating, monkeypatch):
    import threading

    from elmo_fast.run_lock import RunLock

    calls, chosen, tmp_path = calibrating
    w = tiny_lstm()
    key = calibration_store.calibration_key(cpu_tuning.model_shapes(w, None), "fp32", torch.get_num_threads())
    path = calibration_store.path_for(key)
    path.parent.mkdir(parents=True)
    theirs = CpuTuning(lstm=(1, 2, 3), linear_gemv_rows=1)
    with RunLock(path.with_suffix(".lock"), "another process's calibration"):  # another process measuring
        timer = threading.Timer(0.3, calibration_store.save, (key, theirs, {}, 0.3))
        timer.start()
        assert cpu_tuning.cpu_tuning(w, None, "fp32") == theirs and calls == []  # waited, then read theirs
        timer.join()
    # a holder that never stores anything (stopped mid-measurement): measured after a few budgets
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "0.01")
    cpu_tuning.forget()
    key = calibration_store.calibration_key(cpu_tuning.model_shapes(w, None), "bf16", torch.get_num_threads())
    with RunLock(calibration_store.path_for(key).with_suffix(".lock"), "a stopped calibration"):
        assert cpu_tuning.cpu_tuning(w, None, "bf16") == chosen and calls == ["bf16"]


def test_a_partial_calibration_is_not_stored(calibrating, monkeypatch):
    calls, chosen, tmp_path = calibrating
    partial = {"lstm": {}, "notes": [], "complete": False}
    monkeypatch.setattr(
        cpu_tuning.calibration, "calibrate", lambda *a, **k: (calls.append("partial") or chosen, partial)
    )
    assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == chosen and calls == ["partial"]
    assert not list((tmp_path / "calibration").glob("*.json"))  # a later process measures again


def test_a_failing_calibration_gives_the_defaults(calibrating, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cpu_tuning.calibration, "calibrate", broken)
    with pytest.warns(RuntimeWarning, match="calibrating the CPU kernels failed .*boom.*; using the defaults"):
        assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == DEFAULT


def test_an_unknown_mode_is_said_and_taken_as_on(calibrating, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "sometimes")
    with pytest.warns(RuntimeWarning, match="ELMO_FAST_CALIBRATION='sometimes' is none of on, off, refresh"):
        assert cpu_tuning.mode() == "on"
    assert cpu_tuning.budget() == 1.0
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "2.5")
    assert cpu_tuning.budget() == 2.5
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "-1")
    with pytest.warns(RuntimeWarning, match="ELMO_FAST_CALIBRATION_BUDGET='-1' is not a positive number of seconds"):
        assert cpu_tuning.budget() == 1.0


# --- the model runs what was chosen ------------------------------------------------------------------------


@needs_extension
@pytest.mark.parametrize("packed", ["0", "1"])
@pytest.mark.slow
def test_model_with_a_real_calibration_stays_within_its_bounds(random_models, monkeypatch, tmp_path, packed):
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "refresh")
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "120")  # a busy machine: complete, hence stored
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", packed)
    cpu_tuning.forget()
    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(_sentences(np.random.default_rng(5), 7, 1, 11))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        fp32 = ElmoBiLm(*files, backend="fast")
        bf16 = ElmoBiLm(*files, backend="fast", precision="bf16")
        got32, got16 = fp32(ids), bf16(ids)
    assert bf16.cpu_tuning().packed == (packed == "1") and bf16._derived.holds("lstm")
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 2  # fp32 and bf16
    mask = ref["mask"]
    for r, x32, x16 in zip(ref["activations"], got32["activations"], got16["activations"]):
        r, x32, x16 = r[mask].double(), x32[mask].double(), x16[mask].double()
        assert (x32 - r).abs().max() <= TOL[torch.float32]["atol"]
        assert (x16 - r).abs().max() <= MODEL_BOUNDS["bf16"]["max_rel"] * r.abs().max()
    cpu_tuning.forget()


@needs_extension
def test_embedder_outputs_do_not_depend_on_being_calibrated(random_models, monkeypatch, tmp_path):
    # Calibration off runs the kernels' defaults; a calibration may choose other kernels: the same
    # vectors within fp32's bound.
    files = random_models("tiny")
    sentences = _sentences(np.random.default_rng(8), 5, 1, 9)
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "off")
    off = ElmoEmbedder(*files).embed_batch(sentences)
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "refresh")
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "120")
    cpu_tuning.forget()
    on = ElmoEmbedder(*files).embed_batch(sentences)
    for a, b in zip(off, on):
        assert np.abs(a - b).max() <= TOL[torch.float32]["atol"]
    cpu_tuning.forget()
