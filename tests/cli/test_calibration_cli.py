"""``elmo-fast calibration show|clear|refresh`` and what ``doctor`` says of the stored calibrations: the key, the
choice, its margin over the defaults, the candidates the reference gate left out; exit 2 for bad input."""

from __future__ import annotations

import json

import pytest
import torch

from elmo_fast import ElmoBiLm
from elmo_fast.bilm import ops
from elmo_fast.bilm.cpu_choices import CpuTuning
from elmo_fast.cli import main
from elmo_fast.tuning import cpu_tuning, store
from elmo_fast.tuning.calibration import Outcome
from elmo_fast.tuning.key import calibration_key, model_shapes

LEFT_OUT = {
    "candidate": "plain/in turn/gemv",
    "where": "bilstm, fp32, 1 rows",
    "error": 0.5,
    "bound": "1e-05 + 0 |ref|",
    "detail": "max error 0.5 against the reference twin, beyond the float32 bound 1e-05 + 0 |ref|",
}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    cpu_tuning.forget()
    yield tmp_path
    cpu_tuning.forget()


def seed_record(files, **changes) -> dict:
    bilm = ElmoBiLm(*files)
    key = calibration_key(model_shapes(bilm.encoder.flat_weights(), None), "fp32", 2)
    key.update(changes)
    outcome = Outcome(
        CpuTuning(lstm=(0, 0, 8), linear_gemv_rows=0, packed=True),
        margin=0.2,
        spread=0.01,
        check={"rows": 16, "ratio": 0.75},
        excluded=[LEFT_OUT],
        busy=0.03,
    )
    store.save(key, outcome, 1.5)
    return key


def test_show_clear_and_what_they_print(cache, random_models, capsys):
    assert main(["calibration", "show"]) == 0
    assert capsys.readouterr().out.startswith("no stored calibration of this machine in ")
    files = random_models("tiny")
    seed_record(files)
    elsewhere = seed_record(files, dispatch={"cpu": "Another CPU", "flags": [], "packed": []})
    assert main(["calibration", "show"]) == 0
    out = capsys.readouterr().out
    assert "Another CPU" not in out and out.count(".json: ") == 1
    assert ", fp32, 2 threads:" in out and "ATen " in out  # the key: CPU and dispatch, shapes, precision, threads
    assert "choice: LSTM GEMV rows in turn 0, concurrent 0, directions concurrent from 8 rows" in out
    assert "margin: 20.0% less time than the defaults (measured spread 1.0%), chosen" in out
    assert "re-checked on first use at 16 rows (measured: 0.75x the default's time)" in out
    assert "left out: plain/in turn/gemv (bilstm, fp32, 1 rows): max error 0.5 against the reference twin" in out
    assert "3% of the time waiting for a CPU" in out
    assert main(["calibration", "show", "--all", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["records"]) == 2 and {r["key"]["dispatch"]["cpu"] for r in shown["records"]} >= {"Another CPU"}
    assert main(["calibration", "clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 1 stored calibration(s)")
    assert [r.key for _, r in store.records()] == [elsewhere]  # another CPU's record stays
    assert main(["calibration", "clear", "--all"]) == 0 and store.records() == []


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built")
def test_doctor_prints_the_stored_choice_its_key_and_margin(cache, random_models, capsys):
    seed_record(random_models("tiny"))
    assert main(["doctor", "--device", "cpu", "--no-model", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("CPU calibration (1 stored in ") : out.index("\nop ")]
    assert "fp32, 2 threads:" in section and "margin: 20.0% less time than the defaults" in section
    assert "left out: plain/in turn/gemv (bilstm, fp32, 1 rows)" in section
    assert main(["doctor", "--device", "cpu", "--no-model", "--seed", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (record,) = report["calibration"]
    assert record["margin"] == 0.2 and record["excluded"] == [LEFT_OUT] and record["key"]["precision"] == "fp32"


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built")
def test_refresh_measures_one_model_again_and_stores_it(cache, random_models, monkeypatch, capsys):
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "3")
    options, weights = random_models("tiny")
    assert main(["calibration", "refresh", "--model-dir", str(options.parent), "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert ", fp32, " in out and "choice: " in out and "margin: " in out
    ((path, record),) = store.records()
    assert record.key["precision"] == "fp32" and record.key["threads"] == torch.get_num_threads()


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--options", "x.json"], {}, "give --options F and --weights F together"),
        (["--threads", "0"], {}, "--threads must be >= 1"),
        ([], {"ELMO_FAST_BILSTM_THREADS": "sequential"}, "ELMO_FAST_BILSTM_THREADS=sequential forces the CPU kernels"),
        ([], {"ELMO_FAST_BILSTM_GEMV_ROWS": "abc"}, "ELMO_FAST_BILSTM_GEMV_ROWS='abc' is not a row count"),
    ],
)
def test_refresh_refuses_bad_input_with_exit_2(cache, monkeypatch, capsys, args, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["calibration", "refresh", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_help_and_unknown_actions(capsys):
    with pytest.raises(SystemExit) as info:
        main(["calibration", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(word in out for word in ("show", "clear", "refresh"))
    with pytest.raises(SystemExit) as info:
        main(["calibration", "forget"])
    assert info.value.code == 2
