"""Nothing machine-specific travels with a model: pickling, torch.save of the module, copy.deepcopy and the
state dict of ElmoBiLm, ElmoEmbedder and the compat Elmo carry no kernel choices, no packed or low-precision
copies of the weights, no CUDA graphs; a model loaded elsewhere asks that machine for its choices."""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import sys

import cli_process
import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from tolerances import TOL

from elmo_fast import ElmoEmbedder
from elmo_fast.bilm import ops
from elmo_fast.bilm.cpu_choices import ALWAYS, CpuTuning
from elmo_fast.compat.allennlp import Elmo
from elmo_fast.tuning import cpu_tuning, store
from elmo_fast.tuning.calibration import Outcome
from elmo_fast.tuning.key import calibration_key, model_shapes

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


def _pickle(obj):
    return pickle.loads(pickle.dumps(obj))


def _torch_save(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


COPIES = {"pickle": _pickle, "torch.save": _torch_save, "deepcopy": copy.deepcopy}


def _machine_state(bilm) -> dict:
    return {
        "derived": len(bilm._derived),
        "graphs": len(bilm._graphs),
        "tunings": "_tunings" in bilm.__dict__,
    }


@needs_extension
@pytest.mark.parametrize("how", list(COPIES))
def test_a_copied_embedder_carries_nothing_of_this_machine(random_models, monkeypatch, how):
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")  # packed copies of the LSTM's weights, made at first use
    files = random_models("tiny")
    sentences = _sentences(np.random.default_rng(3), 4, 1, 7)
    embedder = ElmoEmbedder(*files, precision="bf16" if ops.packed_gemm_available(torch.bfloat16) else "fp32")
    want = embedder.embed_batch(sentences)
    assert embedder.elmo_bilm._derived.holds("lstm")  # this machine's packed weights, held
    state_keys = set(embedder.elmo_bilm.state_dict())
    got = COPIES[how](embedder)
    assert _machine_state(got.elmo_bilm) == {"derived": 0, "graphs": 0, "tunings": False}
    assert set(got.elmo_bilm.state_dict()) == state_keys  # the state dict: the weights, nothing derived
    assert all(not k.startswith(("_derived", "_graphs")) for k in state_keys)
    for a, b in zip(want, got.embed_batch(sentences)):  # remade where it runs, the same vectors
        assert np.array_equal(a, b)
    assert _machine_state(embedder.elmo_bilm)["derived"] > 0  # the original keeps its own


@needs_extension
def test_a_copied_compat_elmo_carries_nothing_of_this_machine(random_models, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_PACKED_WEIGHTS", "1")
    files = random_models("tiny")
    elmo = Elmo(*files, num_output_representations=1, dropout=0.0).eval()
    from elmo_fast import batch_to_ids

    ids = batch_to_ids(_sentences(np.random.default_rng(4), 3, 1, 6))
    with torch.no_grad():
        want = elmo(ids)["elmo_representations"][0]
    bilm = elmo._elmo_lstm
    assert len(bilm._derived) > 0
    for how, make in COPIES.items():
        got = make(elmo)
        assert _machine_state(got._elmo_lstm) == {"derived": 0, "graphs": 0, "tunings": False}, how
        assert set(got.state_dict()) == set(elmo.state_dict()), how
        with torch.no_grad():
            assert (got(ids)["elmo_representations"][0] - want).abs().max() <= TOL[torch.float32]["atol"]


UNPICKLE = """
import json, pickle, sys, torch
torch.set_num_threads({threads})
with open(sys.argv[1], "rb") as f:
    embedder = pickle.load(f)
embedder.embed_batch([["a", "few", "words"], ["more"]])
bilm = embedder.elmo_bilm
print(json.dumps({{"tuning": bilm.cpu_tuning().to_dict(), "packed": bilm._derived.holds("lstm")}}))
"""


def _store(directory, files, tuning: CpuTuning) -> None:
    from elmo_fast import ElmoBiLm

    bilm = ElmoBiLm(*files)
    emb = bilm.token_embedder
    highway = (emb.highways.weights(), emb.highways.biases(), emb.projection.weight, emb.projection.bias)
    key = calibration_key(model_shapes(bilm.encoder.flat_weights(), highway), "fp32", torch.get_num_threads())
    store.save(key, Outcome(tuning, margin=0.5, spread=0.0, check=None, busy=0.0), 0.1, directory / "calibration")


@needs_extension
@pytest.mark.slow
def test_an_unpickled_model_uses_the_calibration_of_the_machine_it_runs_on(random_models, monkeypatch, tmp_path):
    """Pickled after a forward with this store's choice (packed weights, no GEMV), unpickled in a process whose
    store holds another (plain weights, the GEMV always): the new process runs its own."""
    files = random_models("tiny")
    here, there = tmp_path / "here", tmp_path / "there"
    ours = CpuTuning(lstm=(0, 0, 0), linear_gemv_rows=0, highway_gemv_rows=0, packed=True)
    theirs = CpuTuning(lstm=(ALWAYS, ALWAYS, 0), linear_gemv_rows=ALWAYS, highway_gemv_rows=ALWAYS, packed=False)
    _store(here, files, ours)
    _store(there, files, theirs)
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "on")
    monkeypatch.setenv("ELMO_FAST_CACHE", str(here))
    monkeypatch.delenv("ELMO_FAST_PACKED_WEIGHTS", raising=False)
    cpu_tuning.forget()
    try:
        embedder = ElmoEmbedder(*files)
        embedder.embed_batch([["some", "words"]])
        assert embedder.elmo_bilm.cpu_tuning() == ours and embedder.elmo_bilm._derived.holds("lstm")
        path = tmp_path / "embedder.pkl"
        path.write_bytes(pickle.dumps(embedder))
    finally:
        cpu_tuning.forget()
    env = {**os.environ, "ELMO_FAST_CALIBRATION": "on", "ELMO_FAST_CACHE": str(there)}
    env.pop("ELMO_FAST_PACKED_WEIGHTS", None)
    out = cli_process.run(
        [sys.executable, "-c", UNPICKLE.format(threads=torch.get_num_threads()), str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert CpuTuning.from_dict(got["tuning"]) == theirs and got["packed"] is False
