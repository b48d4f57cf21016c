"""When the CPU kernels' choices are measured, read, re-checked or forced (elmo_fast.tuning.cpu_tuning), and the
environment variables that steer it (elmo_fast.tuning.environment): a variable that forces a schedule turns
measuring and storing off for the process; a malformed one is a one-line error naming it and what it takes."""

from __future__ import annotations

import json
import sys
import threading
import warnings

import cli_process
import pytest
import torch

from elmo_fast.bilm import ops
from elmo_fast.bilm.cpu_choices import DEFAULT, CpuTuning
from elmo_fast.errors import ElmoFastError
from elmo_fast.run_lock import RunLock
from elmo_fast.tuning import CalibrationWarning, cpu_tuning, environment, recheck, store
from elmo_fast.tuning.calibration import Outcome
from elmo_fast.tuning.key import calibration_key, model_shapes

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


def tiny_lstm(P=16, C=16, L=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = []
    for _ in range(2 * L):
        w += [torch.randn(4 * C, P, generator=gen) * 0.2, torch.randn(4 * C, P, generator=gen) * 0.2]
        w += [torch.randn(4 * C, generator=gen) * 0.1, torch.randn(P, C, generator=gen) * 0.2]
    return w


CHOSEN = CpuTuning(lstm=(4, 0, 2), linear_gemv_rows=4, highway_gemv_rows=16, packed=False)


@pytest.fixture
def calibrating(monkeypatch, tmp_path):
    """Calibration on, the store in tmp_path, this process's memory empty; counts calibrations (fake ones,
    choosing CHOSEN with a margin of 20% and a check at 4 rows), and re-checks (which hold, on a quiet machine)."""
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "on")
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    for name in (*environment.FORCING, environment.BUDGET, *environment.DISPATCH):
        monkeypatch.delenv(name, raising=False)
    cpu_tuning.forget()
    calls = []

    def fake(lstm_weights, highway, precision, chooser=None, packed_available=True):
        calls.append(precision)
        return Outcome(CHOSEN, margin=0.2, spread=0.01, check={"rows": 4, "ratio": 0.8}, busy=0.0)

    rechecks = []

    def fake_recheck(lstm_weights, precision, tuning, rows):
        rechecks.append(rows)
        return recheck.Recheck(0.8, 0.01, True, 0.0)

    monkeypatch.setattr(cpu_tuning.calibration, "calibrate", fake)
    monkeypatch.setattr(cpu_tuning.recheck, "recheck", fake_recheck)
    monkeypatch.setattr(cpu_tuning.measure, "cpu_pressure", lambda: 0.0)  # a quiet machine, whatever this one is
    yield calls, rechecks, tmp_path
    cpu_tuning.forget()


def stored(tmp_path) -> list:
    return sorted((tmp_path / "calibration").glob("*.json"))


def test_calibrated_once_then_remembered_then_read_and_rechecked(calibrating, monkeypatch):
    calls, rechecks, tmp_path = calibrating
    w = tiny_lstm()
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == ["fp32"]  # this process remembers
    assert len(stored(tmp_path)) == 1 and rechecks == []  # it measured: nothing to re-check
    cpu_tuning.forget()  # a later process: read from disk, re-checked once, not measured again
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == ["fp32"] and rechecks == [4]
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and rechecks == [4]
    assert cpu_tuning.cpu_tuning(w, None, "bf16") == CHOSEN and calls == ["fp32", "bf16"]  # another key
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "refresh")
    cpu_tuning.forget()
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == ["fp32", "bf16", "fp32"]
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "off")
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == DEFAULT


def test_a_stored_choice_that_no_longer_holds_is_measured_again(calibrating, monkeypatch):
    calls, rechecks, tmp_path = calibrating
    w = tiny_lstm()
    cpu_tuning.cpu_tuning(w, None, "fp32")
    cpu_tuning.forget()
    monkeypatch.setattr(cpu_tuning.recheck, "recheck", lambda *a: recheck.Recheck(1.3, 0.02, False, 0.0))
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == ["fp32", "fp32"]
    assert "ran at 1.30x the default's time at 4 rows" in next(iter(cpu_tuning.activity.values()))


def test_a_choice_stored_on_a_busy_machine_is_measured_again_once_it_is_quiet(calibrating, monkeypatch):
    calls, rechecks, tmp_path = calibrating
    w = tiny_lstm()
    key = calibration_key(model_shapes(w, None), "fp32", torch.get_num_threads())
    store.save(key, Outcome(DEFAULT, margin=0.01, spread=0.4, busy=0.6, complete=False), 4.0)
    # still busy: the stored choice is used (no process pays a calibration the machine cannot give it)
    monkeypatch.setattr(cpu_tuning.recheck, "recheck", lambda *a: recheck.Recheck(1.0, 0.3, True, 0.5))
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == DEFAULT and calls == []
    cpu_tuning.forget()
    monkeypatch.setattr(cpu_tuning.recheck, "recheck", lambda *a: recheck.Recheck(1.0, 0.01, True, 0.01))
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == ["fp32"]
    assert store.load(key).busy == 0.0


def test_a_stored_choice_is_neither_rechecked_nor_measured_on_a_machine_busy_now(calibrating, monkeypatch):
    calls, rechecks, tmp_path = calibrating
    w = tiny_lstm()
    key = calibration_key(model_shapes(w, None), "fp32", torch.get_num_threads())
    store.save(key, Outcome(CHOSEN, margin=0.2, spread=0.01, check={"rows": 4, "ratio": 0.8}, busy=0.6), 1.0)
    monkeypatch.setattr(cpu_tuning.measure, "cpu_pressure", lambda: 0.9)
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == [] and rechecks == []
    assert "not re-checked, the machine is busy (90% CPU pressure)" in next(iter(cpu_tuning.activity.values()))
    # a re-check that itself waited for a CPU decides nothing either
    cpu_tuning.forget()
    monkeypatch.setattr(cpu_tuning.measure, "cpu_pressure", lambda: None)  # no pressure information
    monkeypatch.setattr(cpu_tuning.recheck, "recheck", lambda *a: recheck.Recheck(1.5, 0.4, False, 0.5))
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == []


@pytest.mark.parametrize(
    "name, value",
    [
        ("ELMO_FAST_BILSTM_THREADS", "sequential"),
        ("ELMO_FAST_BILSTM_GEMV_ROWS", "0"),
        ("ELMO_FAST_PACKED_WEIGHTS", "0"),
    ],
)
def test_a_variable_that_forces_a_schedule_turns_measuring_and_storing_off(
    calibrating, monkeypatch, caplog, name, value
):
    """Measured under a forced schedule, every candidate would time that schedule, and the store would keep
    the noise for every later process without the variable."""
    calls, rechecks, tmp_path = calibrating
    monkeypatch.setenv(name, value)
    assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == DEFAULT
    assert calls == [] and rechecks == [] and stored(tmp_path) == []
    assert f"{name}={value} forces the CPU kernels' schedule" in caplog.text
    monkeypatch.delenv(name)  # the same process without it: measured and stored
    assert (
        cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == CHOSEN and calls == ["fp32"] and len(stored(tmp_path)) == 1
    )


def test_packed_weights_forced_or_not(calibrating, monkeypatch):
    calls, _, _ = calibrating
    w = tiny_lstm()
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CpuTuning(packed=True) and calls == []
    if ops.HAS_EXTENSION and ops.packed_gemm_available(torch.bfloat16):
        assert cpu_tuning.cpu_tuning(w, None, "bf16").packed
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "0")
    assert not cpu_tuning.cpu_tuning(w, None, "bf16").packed
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    with pytest.warns(RuntimeWarning, match="cannot be packed in bf16"):  # weights it cannot pack stay plain
        assert not cpu_tuning.cpu_tuning(tiny_lstm(P=15, C=16), None, "bf16").packed


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "ELMO_FAST_BILSTM_GEMV_ROWS",
            "abc",
            "ELMO_FAST_BILSTM_GEMV_ROWS='abc' is not a row count: expected an integer from 0 to 2147483647 (or unset)",
        ),
        ("ELMO_FAST_BILSTM_GEMV_ROWS", "-3", "ELMO_FAST_BILSTM_GEMV_ROWS='-3' is not a row count"),
        (
            "ELMO_FAST_BILSTM_THREADS",
            "both",
            "ELMO_FAST_BILSTM_THREADS='both' is not a schedule: expected sequential or directions (or unset)",
        ),
        (
            "ELMO_FAST_PACKED_WEIGHTS",
            "yes",
            "ELMO_FAST_PACKED_WEIGHTS='yes' is not a choice: expected 0 (plain) or 1 (packed) (or unset)",
        ),
        (
            "ELMO_FAST_CALIBRATION",
            "sometimes",
            "ELMO_FAST_CALIBRATION='sometimes' is not a calibration mode: expected on, off or refresh (or unset)",
        ),
        (
            "ELMO_FAST_CALIBRATION_BUDGET",
            "-1",
            "ELMO_FAST_CALIBRATION_BUDGET='-1' is not a number of seconds: expected a number > 0 (or unset)",
        ),
        ("ELMO_FAST_CPU_ISA", "sse9", "ELMO_FAST_CPU_ISA='sse9' is not an ISA cap: expected avx512, avx2 or base"),
    ],
)
def test_a_malformed_variable_is_a_one_line_error_naming_it(calibrating, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ElmoFastError) as info:
        cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32")
    assert message in str(info.value) and "\n" not in str(info.value)
    if name == "ELMO_FAST_CALIBRATION_BUDGET":
        with pytest.raises(ElmoFastError):
            environment.budget()


@needs_extension
@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "ELMO_FAST_BILSTM_GEMV_ROWS",
            "abc",
            "bilstm: ELMO_FAST_BILSTM_GEMV_ROWS='abc' is not a row count: expected "
            "an integer from 0 to 2147483647 (or unset)",
        ),
        ("ELMO_FAST_BILSTM_GEMV_ROWS", "12x", "bilstm: ELMO_FAST_BILSTM_GEMV_ROWS='12x' is not a row count"),
        (
            "ELMO_FAST_BILSTM_THREADS",
            "both",
            "bilstm: ELMO_FAST_BILSTM_THREADS='both' is not a schedule: expected sequential or directions (or unset)",
        ),
    ],
)
def test_the_kernels_refuse_a_malformed_override_too(monkeypatch, name, value, message):
    """The op read by itself (no model, no calibration): before, ``abc`` silently became 0 rows."""
    monkeypatch.setenv(name, value)
    w = tiny_lstm(L=1)
    xg0, index, lengths = torch.randn(2, 2, 64), torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 2])
    with pytest.raises(RuntimeError) as info:
        ops.bilstm(xg0, index, lengths, w, None, None)
    assert str(info.value).splitlines()[0].startswith(message)


def test_a_store_that_cannot_be_written_costs_nothing_but_a_note(calibrating, caplog):
    calls, _, tmp_path = calibrating
    (tmp_path / "calibration").write_text("a file where the folder should be")
    assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == CHOSEN
    assert "could not store the CPU calibration" in caplog.text


def test_a_corrupt_store_is_measured_again_and_rewritten(calibrating):
    calls, _, tmp_path = calibrating
    w = tiny_lstm()
    cpu_tuning.cpu_tuning(w, None, "fp32")
    (path,) = stored(tmp_path)
    path.write_text('{"key": {}, "tuning": {"lstm": [1, 2, 3], "linear_gemv_rows": 1}}')
    cpu_tuning.forget()
    assert cpu_tuning.cpu_tuning(w, None, "fp32") == CHOSEN and calls == ["fp32", "fp32"]
    assert store.load(json.loads(path.read_text())["key"]).tuning == CHOSEN


@pytest.mark.slow
def test_one_process_measures_while_the_others_wait_for_its_result(calibrating, monkeypatch):
    calls, _, tmp_path = calibrating
    w = tiny_lstm()
    key = calibration_key(model_shapes(w, None), "fp32", torch.get_num_threads())
    path = store.path_for(key)
    path.parent.mkdir(parents=True)
    theirs = Outcome(CpuTuning(lstm=(1, 2, 3), linear_gemv_rows=1), margin=0.1, spread=0.0)
    with RunLock(path.with_suffix(".lock"), "another process's calibration"):  # another process measuring
        timer = threading.Timer(0.3, store.save, (key, theirs, 0.3))
        timer.start()
        assert cpu_tuning.cpu_tuning(w, None, "fp32") == theirs.tuning and calls == []  # waited, then read theirs
        timer.join()
    # a holder that never stores anything (stopped mid-measurement): measured after a few budgets
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "0.01")
    cpu_tuning.forget()
    key = calibration_key(model_shapes(w, None), "bf16", torch.get_num_threads())
    with RunLock(store.path_for(key).with_suffix(".lock"), "a stopped calibration"):
        assert cpu_tuning.cpu_tuning(w, None, "bf16") == CHOSEN and calls == ["bf16"]


def test_a_calibration_cut_short_is_stored_with_how_busy_the_machine_was(calibrating, monkeypatch):
    calls, _, tmp_path = calibrating
    monkeypatch.setattr(
        cpu_tuning.calibration,
        "calibrate",
        lambda *a, **k: calls.append("partial") or Outcome(DEFAULT, busy=0.7, complete=False),
    )
    assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == DEFAULT and calls == ["partial"]
    (path,) = stored(tmp_path)
    data = json.loads(path.read_text())
    assert data["complete"] is False and data["busy"] == 0.7  # a later quiet process measures again


def test_a_failing_calibration_gives_the_defaults(calibrating, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cpu_tuning.calibration, "calibrate", broken)
    with pytest.warns(RuntimeWarning, match="calibrating the CPU kernels failed .*boom.*; using the defaults"):
        assert cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32") == DEFAULT


def test_a_candidate_left_out_by_the_gate_is_said_once_and_recorded(calibrating, monkeypatch):
    calls, _, tmp_path = calibrating
    left_out = {
        "candidate": "plain/in turn/gemv",
        "where": "bilstm, fp32, 1 rows",
        "error": 0.5,
        "bound": "1e-05 + 0 |ref|",
        "detail": "max error 0.5 against the reference twin, beyond the float32 bound",
    }
    monkeypatch.setattr(
        cpu_tuning.calibration,
        "calibrate",
        lambda *a, **k: Outcome(DEFAULT, excluded=[left_out], margin=0.0, spread=0.0),
    )
    with pytest.warns(
        CalibrationWarning, match=r"plain/in turn/gemv \(bilstm, fp32, 1 rows\) disagrees with its reference"
    ):
        cpu_tuning.cpu_tuning(tiny_lstm(), None, "fp32")
    with pytest.warns(CalibrationWarning) as again:  # another shape, the same candidate and words: said once
        cpu_tuning.cpu_tuning(tiny_lstm(C=32), None, "fp32")
        warnings.warn("sentinel", CalibrationWarning, stacklevel=1)
    assert [str(w.message) for w in again] == ["sentinel"]
    assert json.loads(stored(tmp_path)[0].read_text())["excluded"] == [left_out]


@needs_extension
def test_recheck_times_the_chosen_schedule_against_the_default():
    w = tiny_lstm()
    r = recheck.recheck(w, "fp32", CpuTuning(lstm=(0, 0, 0)), 4)
    assert r.ratio > 0 and r.spread >= 0 and 0 <= r.busy <= 1 and isinstance(r.holds, bool)


def test_calibration_variables_are_documented():
    """docs/precision-and-speed.md names every variable the tuning room reads."""
    from repo_paths import REPO

    text = (REPO / "docs" / "precision-and-speed.md").read_text()
    for name in (environment.MODE, environment.BUDGET, *environment.FORCING, environment.CPU_ISA):
        assert f"`{name}" in text, name


@pytest.mark.slow
def test_importing_the_model_installs_the_tuning_room():
    code = (
        "from elmo_fast.bilm import cpu_choices\n"
        "from elmo_fast.bilm.model import ElmoBiLm\n"
        "from elmo_fast.tuning.cpu_tuning import cpu_tuning\n"
        "assert cpu_choices._provider is cpu_tuning, cpu_choices._provider\n"
    )
    cli_process.run([sys.executable, "-c", code], check=True)
