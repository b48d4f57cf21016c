"""The calibration's key (elmo_fast.tuning.key: the machine as its kernels see it, the versions, the shapes,
precision and threads) and its store (elmo_fast.tuning.store: one record per key, never trusting a file it
cannot vouch for)."""

from __future__ import annotations

import json
import math
import sys

import cli_process
import pytest
import torch

from elmo_fast.bilm import ops
from elmo_fast.bilm.cpu_choices import CpuTuning
from elmo_fast.tuning import key as calibration_key
from elmo_fast.tuning import store
from elmo_fast.tuning.calibration import Outcome

SHAPES = {"lstm": [2, 16, 16]}


CHOSEN = CpuTuning(lstm=(8, 0, 4), linear_gemv_rows=8)


def outcome(tuning=CHOSEN, **kwargs) -> Outcome:
    fields = dict(margin=0.25, spread=0.01, check={"rows": 4, "ratio": 0.7}, busy=0.02)
    fields.update(kwargs)
    return Outcome(tuning, report={"lstm": {1: {"a": [0.5, math.inf]}}}, **fields)


def test_the_key_names_what_the_kernels_dispatch_on():
    key = calibration_key.calibration_key(SHAPES, "fp32", 2)
    assert {"dispatch", "torch", "elmo_fast", "extension", "shapes", "precision", "threads"} <= set(key)
    d = key["dispatch"]
    assert {"cpu", "logical_cpus", "flags", "aten", "packed", "variables"} <= set(d)
    assert d["aten"] == torch.backends.cpu.get_cpu_capability()
    if ops.HAS_EXTENSION:
        assert ("bf16" in d["packed"]) == ops.packed_gemm_available(torch.bfloat16) and "fp32" in d["packed"]
    assert set(d["flags"]) <= {"avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_fp16"}


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built")
def test_the_key_changes_with_what_changes_the_dispatch(monkeypatch):
    base = calibration_key.calibration_key(SHAPES, "fp32", 2)
    monkeypatch.setenv("ELMO_FAST_CPU_ISA", "avx2")
    capped = calibration_key.calibration_key(SHAPES, "fp32", 2)
    assert capped["dispatch"]["variables"] == {"ELMO_FAST_CPU_ISA": "avx2"} and capped != base
    monkeypatch.delenv("ELMO_FAST_CPU_ISA")
    with torch.backends.mkldnn.flags(enabled=False):  # oneDNN off: packed bf16 weights do not run
        off = calibration_key.calibration_key(SHAPES, "fp32", 2)
    assert "bf16" not in off["dispatch"]["packed"]
    if ops.packed_gemm_available(torch.bfloat16):
        assert off != base


@pytest.mark.slow
def test_oneDNN_isa_cap_is_in_the_key_as_the_kernels_see_it():
    """ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's own variable) caps what oneDNN runs: the key names the variable and
    the packed kernels that no longer run, seen by a fresh process."""
    code = "import json; from elmo_fast.tuning import key; print(json.dumps(key.calibration_key({}, 'bf16', 1)))"
    got = json.loads(
        cli_process.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**__import__("os").environ, "ONEDNN_MAX_CPU_ISA": "AVX2"},
        ).stdout
    )
    assert got["dispatch"]["variables"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    if ops.HAS_EXTENSION:
        assert got["dispatch"]["packed"] == ["fp32"]


def test_store_round_trip_and_what_it_never_trusts(tmp_path):
    key = calibration_key.calibration_key(SHAPES, "fp32", 2)
    path = store.save(key, outcome(), 0.25, tmp_path)
    record = store.load(key, tmp_path)
    assert record.tuning == CpuTuning(lstm=(8, 0, 4), linear_gemv_rows=8)
    assert (record.margin, record.spread, record.check, record.busy) == (0.25, 0.01, {"rows": 4, "ratio": 0.7}, 0.02)
    stored = json.loads(path.read_text())
    assert stored["report"]["lstm"]["1"] == {"a": [0.5, None]} and stored["seconds"] == 0.25 and stored["complete"]
    # another version, thread count, shape or dispatch: another key, nothing found
    for other in [
        {**key, "torch": "0.0"},
        {**key, "threads": 3},
        {**key, "shapes": {"lstm": [2, 16, 32]}},
        {**key, "dispatch": {**key["dispatch"], "flags": []}},
    ]:
        assert store.load(other, tmp_path) is None
    # a file under the right name that is not the right file: cut short, another key, a bad tuning or check
    for text in [
        path.read_text()[:40],
        json.dumps({**stored, "key": {**key, "torch": "0.0"}}),
        json.dumps({**stored, "tuning": {**stored["tuning"], "lstm": [1]}}),
        json.dumps({**stored, "check": {"rows": "4"}}),
        json.dumps({**stored, "margin": "big"}),
        "[]",
        "\x00\xff",
    ]:
        path.write_text(text)
        assert store.load(key, tmp_path) is None, text[:30]
    assert [r is None for _, r in store.records(tmp_path)] == [True]
    assert store.remove([path]) == 1 and store.records(tmp_path) == []
