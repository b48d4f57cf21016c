"""Packed weights only where this CPU runs them: oneDNN's BRGeMM micro-kernel for bf16 needs AVX-512 with BF16 (or
AMX) as oneDNN sees the CPU, and torch.backends.mkldnn on. A CPU without it is simulated with oneDNN's own cap
(ONEDNN_MAX_CPU_ISA=AVX2, read once per process: a subprocess) and by switching oneDNN off in this process: the
op says so in one line, the calibration never offers them, and a forced or stored choice of them runs plain."""

from __future__ import annotations

import json
import os
import sys

import cli_process
import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from cpu_features import needs_packed_bf16
from tolerances import MODEL_BOUNDS

from elmo_fast import ElmoBiLm, batch_to_ids
from elmo_fast.bilm import ops
from elmo_fast.tuning import cpu_tuning

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)

NO_BF16_BRGEMM = """
import json, sys, warnings
import torch
from elmo_fast import ElmoBiLm, batch_to_ids
from elmo_fast.bilm import ops
from elmo_fast.tuning import calibration, dispatch
from elmo_fast.tuning.measure import Chooser

out = {"bf16": ops.packed_gemm_available(torch.bfloat16), "fp32": ops.packed_gemm_available(torch.float32)}
try:
    ops.pack_weight(torch.randn(32, 8).bfloat16())
    out["pack"] = None
except RuntimeError as e:
    out["pack"] = str(e)
bilm = ElmoBiLm(sys.argv[1], sys.argv[2], precision="bf16")
emb = bilm.token_embedder
result = calibration.calibrate(bilm.encoder.flat_weights(), None, "bf16", chooser=Chooser(budget_s=30),
                               packed_available=dispatch.packed_available(torch.bfloat16))
out["offered"] = sorted({name for t in result.report["lstm"].values() for name in t})
out["notes"] = result.notes
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ids = batch_to_ids([["a", "few", "words"], ["and", "more"]])
    got = bilm(ids)["activations"][-1]  # ELMO_FAST_PACKED_WEIGHTS=1 in this process
    ref = ElmoBiLm(sys.argv[1], sys.argv[2], backend="reference")(ids)["activations"][-1]
out["warnings"] = [str(w.message) for w in caught]
out["packed_used"] = bilm.cpu_tuning().packed
out["rel_error"] = ((got - ref).abs().max() / ref.abs().max()).item()
print(json.dumps(out))
"""


@needs_extension
@pytest.mark.slow
def test_a_cpu_without_the_bf16_micro_kernel(random_models, tmp_path):
    files = random_models("tiny", exercise_clips=True)
    env = {
        **os.environ,
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ELMO_FAST_PACKED_WEIGHTS": "1",
        "ELMO_FAST_CACHE": str(tmp_path),
    }
    proc = cli_process.run(
        [sys.executable, "-c", NO_BF16_BRGEMM, *map(str, files)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bf16"] is False and out["fp32"] is True
    assert (
        out["pack"]
        .splitlines()[0]
        .startswith(
            "pack_weight: this CPU cannot run packed bfloat16 weights (oneDNN's BRGeMM micro-kernel needs AVX-512"
        )
    )
    assert out["offered"] and not any(name.startswith("packed/") for name in out["offered"])
    assert "packed: not offered (this CPU does not run them)" in out["notes"]
    assert any("cannot run packed bf16 weights now" in w for w in out["warnings"])
    assert out["packed_used"] is False and out["rel_error"] <= MODEL_BOUNDS["bf16"]["max_rel"]


@needs_extension
@needs_packed_bf16
def test_onednn_switched_off_in_a_process_runs_packed_choices_plain(random_models, monkeypatch, tmp_path):
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    cpu_tuning.forget()
    files = random_models("tiny")
    ids = batch_to_ids(_sentences(np.random.default_rng(2), 4, 1, 8))
    bilm = ElmoBiLm(*files, precision="bf16")
    ref = ElmoBiLm(*files, backend="reference")
    with torch.inference_mode():
        want = ref(ids)["activations"]
        with torch.backends.mkldnn.flags(enabled=False):
            assert not ops.packed_gemm_available(torch.bfloat16)
            with pytest.warns(RuntimeWarning, match="cannot run packed bf16 weights now"):
                got = bilm(ids)["activations"]
            assert not bilm.cpu_tuning().packed
            with pytest.raises(RuntimeError, match=r"^pack_weight: this CPU cannot run packed bfloat16 weights"):
                ops.pack_weight(torch.randn(32, 8).bfloat16())
    for r, x in zip(want, got):
        assert (x - r).abs().max() <= MODEL_BOUNDS["bf16"]["max_rel"] * r.abs().max()
    cpu_tuning.forget()


@needs_extension
def test_packed_bf16_weights_refuse_to_run_once_onednn_is_off():
    """Packed while oneDNN was on, called with it off: one line naming the cause, not ATen's internal one."""
    if not ops.packed_gemm_available(torch.bfloat16):
        pytest.skip("this CPU does not run packed bf16 weights")
    packed = ops.pack_weight(torch.randn(32, 8).bfloat16())
    with torch.backends.mkldnn.flags(enabled=False):
        with pytest.raises(RuntimeError) as info:
            ops.linear(torch.randn(3, 8), packed, None)
    assert str(info.value).splitlines()[0] == (
        "linear: bfloat16 weights packed for oneDNN's BRGeMM micro-kernel cannot run now (torch.backends.mkldnn is "
        "disabled, or this CPU lacks AVX-512 with BF16 or AMX): use weights that are not packed"
    )
