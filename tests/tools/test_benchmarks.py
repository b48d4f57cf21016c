"""The benchmark scripts run (smallest settings, a tiny model): a refactor that breaks one shows here,
not on the day its numbers are needed. Nothing here times anything."""

import sys

import cli_process
import pytest
from cpu_features import packed_bf16_available
from repo_paths import REPO

from elmo_fast.bilm.ops import HAS_EXTENSION

pytestmark = pytest.mark.skipif(not HAS_EXTENSION, reason="the benchmarks measure the fast path: build the extension")


def _run(script, *args, timeout=300):
    r = cli_process.run(
        [sys.executable, str(REPO / "benchmarks" / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "not measured" not in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
def test_bench_cpu(tmp_path):
    out = _run(
        "bench_cpu.py",
        "--presets",
        "tiny",
        "--batch-sizes",
        "2",
        "--backends",
        "fast,reference",
        "--dtypes",
        "fp32",
        "--seconds",
        "0.2",
        "--sentences",
        "8",
        "--gemm-size",
        "64",
        "--gemm-repeats",
        "1",
        "--cache-dir",
        tmp_path,
    )
    assert "| fast | fp32 | 2 | off |" in out and "| reference | fp32 | 2 |" in out


@pytest.mark.slow
def test_bench_lstm_step():
    out = _run("bench_lstm_step.py", "--preset", "tiny", "--rows", "1,5", "--steps", "2", "--repeats", "1")
    assert "| 5 | fp32 packed |" in out and "| 1 | fp32 BLAS |" in out
    if packed_bf16_available():
        assert "| 5 | bf16 packed |" in out
    else:  # said, not left out silently
        assert "| bf16 packed |" not in out and "# bf16 packed: left out, this CPU cannot run" in out


@pytest.mark.slow
def test_bench_calibration(tmp_path):
    out = _run(
        "bench_calibration.py",
        "--busy-preset",
        "tiny",
        "--cost-presets",
        "tiny",
        "--seconds",
        "0.2",
        "--repeats",
        "1",
        "--cache-dir",
        tmp_path,
        timeout=600,
    )
    assert "| busy | " in out and "| quiet | " in out and "| off (the kernels' defaults) |" in out
    assert "of the quiet choice's speed (target >= 95%)" in out and "| `tiny` (" in out and "| bf16 |" in out


@pytest.mark.slow
def test_bench_train():
    out = _run(
        "bench_train.py",
        "--presets",
        "tiny,default",
        "--batch",
        "4",
        "--vocab",
        "200",
        "--negative-samples",
        "16",
        "--repeats",
        "1",
        "--ref-repeats",
        "1",
    )
    assert out.count("fast / reference") == 2


@pytest.mark.slow
def test_bench_train_ops():
    out = _run("bench_train_ops.py", "--preset", "tiny", "--batch", "4", "--repeats", "1", "--ref-repeats", "1")
    assert "whole biLM" in out and "train/infer" in out


@pytest.mark.slow
def test_bench_simple_elmo(tmp_path):
    # elmo-fast's row only: simple_elmo's needs TensorFlow in a side environment, which CI does not have
    out = _run("bench_simple_elmo.py", "--quick", "--systems", "elmo-fast", "--cache-dir", tmp_path)
    assert "| elmo-fast (fast) |" in out and "vectors not compared" in out


@pytest.mark.slow
def test_bench_serve():
    out = _run("bench_serve.py", "--quick", "--seconds", "0.3", "--warmup", "0.2", "--offline-seconds", "0.1")
    assert "| server, batching | 1 | " in out and "| batch 1: " in out and "% time |" in out
    assert "| server, batching | 4 | " in out and "| batch 64: " in out
    assert "| server, batching off | 2 | " in out and "output all as .npy | 1 | " in out
    assert "| orjson (the server) |" in out and "errors)" not in out


@pytest.mark.slow
@pytest.mark.cluster  # (the benchmark starts a Ray of its own, as its users run it)
def test_bench_ray(tmp_path):
    pytest.importorskip("ray", reason='Ray is not installed: pip install "elmo-fast[ray]"')
    out = _run(
        "bench_ray.py",
        "--sentences",
        "40",
        "--preset",
        "tiny",
        "--repeats",
        "1",
        "--wait-quiet",
        "0",
        "--runs",
        "ray",
        "--ray-batch-size",
        "10",
        "--dir",
        tmp_path,
    )
    assert "| Ray Data, 2 actors x 1 thread | " in out and "Ray's run: ray.init " in out


@pytest.mark.slow
def test_bench_selfcheck():
    out = _run("bench_selfcheck.py", "--repeats", "1", "--preset", "tiny")
    assert "all ops" in out and "fp32:" in out and "bilstm (" in out and "every later call" in out


@pytest.mark.slow
def test_bench_parity(tmp_path, bilm_tf_tiny):
    out = _run(
        "bench_parity.py", "--models", "golden", "--precisions", "fp32", "--fixture", bilm_tf_tiny, "--cache", tmp_path
    )
    assert "| golden | fp32 | on |" in out and "| golden | fp32 | off |" in out


@pytest.mark.slow
def test_bench_onnx(tmp_path):
    pytest.importorskip("onnxruntime", reason='needs the [onnx] extra: pip install "elmo-fast[onnx]"')
    out = _run(
        "bench_onnx.py",
        *("--export-presets", "tiny", "--speed-preset", "tiny", "--batch-sizes", "1", "--seconds", "0.2"),
        *("--rounds", "1", "--sentences", "8", "--cache-dir", tmp_path),
        timeout=600,
    )
    for graph in ("fp32", "int8", "int8-vnni"):
        assert f"| tiny | {graph} | " in out
    for path in ("reference", "fast fp32", "fast bf16", "onnx fp32", "onnx int8", "onnx int8-vnni"):
        assert f"| {path} | 1 | 8 | " in out
    assert "failed:" not in out and ("VNNI: yes" in out or "VNNI: no" in out)
