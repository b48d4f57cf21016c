"""The model runs what the calibration chose, within its bounds: fp32 within 1e-5 of the reference with the
calibration on, bf16 within its stated bound, whether the choice was measured or forced."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from tolerances import MODEL_BOUNDS, TOL

from elmo_fast import ElmoBiLm, ElmoEmbedder, batch_to_ids
from elmo_fast.bilm import ops
from elmo_fast.tuning import cpu_tuning

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


@needs_extension
@pytest.mark.parametrize("packed", ["measured", "1"])
def test_model_with_a_real_calibration_stays_within_its_bounds(random_models, monkeypatch, tmp_path, packed):
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "refresh")
    monkeypatch.setenv("ELMO_FAST_CALIBRATION_BUDGET", "120")  # a busy machine: complete all the same
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    if packed == "1":  # forced: nothing measured, nothing stored
        monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    else:
        monkeypatch.delenv("ELMO_FAST_PACKED_WEIGHTS", raising=False)
    cpu_tuning.forget()
    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(_sentences(np.random.default_rng(5), 7, 1, 11))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        fp32 = ElmoBiLm(*files, backend="fast")
        bf16 = ElmoBiLm(*files, backend="fast", precision="bf16")
        got32, got16 = fp32(ids), bf16(ids)
    stored = list((tmp_path / "calibration").glob("*.json"))
    if packed == "1":
        assert stored == [] and bf16.cpu_tuning().packed == ops.packed_gemm_available(torch.bfloat16)
        # bf16 holds a copy of the LSTM's weights either way: packed (4 dims) where packing runs, else cast
        assert bf16._derived.holds("lstm") and (bf16._flat_lstm()[1].dim() == 4) == bf16.cpu_tuning().packed
    else:
        assert len(stored) == 2  # fp32 and bf16
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
