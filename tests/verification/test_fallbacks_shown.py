"""Every fallback is visible where the user looks: an op that failed its first-use self-check and runs its
reference twin is named by ``elmo-fast doctor``, by embed's closing line, by the server's ``/health``
(status "degraded", still 200: the answers are right, only slower) and by its ``/metrics`` (a gauge per op).

The fallback is made as a user's process would meet it: a kernel made wrong on purpose
(tests/support/broken_kernels.py) and the op's first use checked in mode ``all`` (the CPU's ops too, so that
it happens without a GPU)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
import torch
from broken_kernels import break_kernel

from elmo_fast.bilm import ops
from elmo_fast.cli import main
from elmo_fast.verification import first_use
from elmo_fast.verification.selfcheck_cases import OPS

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


@pytest.fixture
def char_cnn_fallen_back(monkeypatch, selfcheck_mode):
    """The char CNN's kernel off by 0.01, found out by its first use: it runs its twin from then on."""
    selfcheck_mode("all")
    break_kernel(monkeypatch, "char_cnn", lambda real, *a: real(*a) + 0.01)
    emb, w, b = torch.randn(20, 4), [torch.randn(3, 4, 2)], [torch.randn(3)]
    with pytest.warns(first_use.SelfCheckWarning, match="char_cnn gives wrong results on cpu"):
        ops.char_cnn(torch.randint(0, 20, (2, 5)), emb, w, b)
    assert first_use.fallbacks()["char_cnn"] == ["cpu"]


@needs_extension
def test_no_fallback_reported_when_none_happened(selfcheck_mode):
    selfcheck_mode("all")
    assert first_use.fallbacks() == {op: [] for op in OPS}
    assert first_use.fallback_summary() is None


@needs_extension
def test_the_embed_summary_names_the_op(tmp_path, random_models, char_cnn_fallen_back, capsys):
    options, weights = random_models("tiny")
    inp = tmp_path / "in.txt"
    inp.write_text("The cat sat .\nA dog .\n", encoding="utf-8")
    code = main(
        ["embed", str(inp), str(tmp_path / "o.h5"), "--top", "--options", str(options), "--weights", str(weights)]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    closing = [line for line in err.splitlines() if line.startswith("elmo-fast: ")][-1]
    assert closing.endswith(
        "; the plain-PyTorch reference for ops that failed their first-use self-check: char_cnn on cpu"
    ), closing


@needs_extension
def test_the_doctor_names_the_ops_this_process_runs_on_their_twins(char_cnn_fallen_back, capsys):
    assert main(["doctor", "--device", "cpu", "--no-model"]) == 1  # its own checks run the broken kernel
    out = capsys.readouterr().out
    assert "first-use self-check: ELMO_FAST_SELFCHECK=all" in out
    assert "this process runs the plain-PyTorch reference (failed the first-use check) for: char_cnn on cpu" in out
    assert main(["doctor", "--device", "cpu", "--no-model", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["selfcheck"]["mode"] == "all" and report["selfcheck"]["fallbacks"]["char_cnn"] == ["cpu"]


def _service():
    pytest.importorskip("starlette", reason="the server needs the [serve] extra: pip install elmo-fast[serve]")
    from elmo_fast.serve.app import ModelInfo, Service
    from elmo_fast.serve.metrics import Metrics
    from elmo_fast.serve.protocol import RequestLimits

    ready = threading.Event()
    ready.set()
    batcher = SimpleNamespace(ready=ready)
    return Service(batcher, Metrics(), ModelInfo("tiny", 32), RequestLimits())


def _health(service) -> tuple[int, dict]:
    """What GET /health answers: its status and body (Service.health_report, which the route sends)."""
    status, body = service.health_report()
    return status, json.loads(json.dumps(body))


@needs_extension
def test_health_is_ok_then_degraded_naming_the_op(selfcheck_mode, monkeypatch):
    service = _service()
    selfcheck_mode("all")
    assert _health(service) == (200, {"status": "ok", "model": "tiny", "dim": 32})
    break_kernel(monkeypatch, "char_cnn", lambda real, *a: real(*a) + 0.01)
    with pytest.warns(first_use.SelfCheckWarning):
        ops.char_cnn(torch.randint(0, 20, (2, 5)), torch.randn(20, 4), [torch.randn(3, 4, 2)], [torch.randn(3)])
    assert _health(service) == (
        200,
        {"status": "degraded", "model": "tiny", "dim": 32, "fallbacks": {"char_cnn": ["cpu"]}},
    )


@needs_extension
def test_metrics_has_a_fallback_gauge_per_op(char_cnn_fallen_back):
    text = _service().metrics.render()
    assert "# TYPE elmo_fast_op_fallback gauge" in text
    gauges = {
        line.split()[0]: line.split()[1] for line in text.splitlines() if line.startswith("elmo_fast_op_fallback{")
    }
    assert gauges == {f'elmo_fast_op_fallback{{op="{op}"}}': "1" if op == "char_cnn" else "0" for op in OPS}
