"""The GPU run's tooling, checked without a GPU: tools/gpu_check.sh (its dry run, its test selections),
tools/gpu_check_summary.py (the figures read back from logs) and scripts/prebuilt_extension.py (does a
prebuilt elmo_fast._C fit this interpreter). A GPU run is rare and short: whatever can break here must."""

import ast
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import cli_process
import pytest
import torch
from repo_paths import REPO as ROOT

SCRIPT = ROOT / "tools" / "gpu_check.sh"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prebuilt = _load(ROOT / "scripts" / "prebuilt_extension.py")
summary = _load(ROOT / "tools" / "gpu_check_summary.py")


def _dry_run(tmp_path, *options, **env):
    out = cli_process.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path), *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **env),
    )
    return out


def _budgets(stdout: str) -> dict[str, int]:
    return {name: int(b) for name, b in re.findall(r"^=+ (\w+) \(budget (\d+)s\)", stdout, flags=re.M)}


def test_dry_run_lists_every_phase_most_telling_first(tmp_path):
    out = _dry_run(tmp_path)
    assert out.returncode == 0, out.stderr
    budgets = _budgets(out.stdout)
    assert list(budgets) == ["device", "extension", "doctor", "kernels", "model", "bench", "sanitizer", "more_tests"]
    assert sum(budgets.values()) <= 12 * 60  # each phase's cap, no budget given
    assert "bench_gpu.py --preset original --batches 64,256,1" in out.stdout  # the functions' bodies are shown
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count(" ok ") == 8 and "budget none" in summary


def test_a_budget_is_an_option_and_bounds_the_phases(tmp_path):
    """--budget SECONDS keeps the run within it: each phase capped at what is left less the summary's 10 s,
    a phase with under 15 s left skipped (a dry run spends no time, so the caps show the arithmetic)."""
    out = _dry_run(tmp_path, "--budget", "480", "--phases", "device,extension,doctor,kernels,model,bench")
    assert out.returncode == 0, out.stderr
    budgets = _budgets(out.stdout)
    assert list(budgets) == ["device", "extension", "doctor", "kernels", "model", "bench"]
    assert sum(budgets.values()) <= 480
    assert "budget 480" in (tmp_path / "summary.txt").read_text()
    short = _dry_run(tmp_path, "--budget=100", "--phases=bench")
    # extension always (the others need it); caps are what is left when the phase starts, so a loaded
    # machine's dry run may have spent a second or two of the 100
    caps = _budgets(short.stdout)
    assert list(caps) == ["extension", "bench"] and caps["extension"] == 30 and 87 <= caps["bench"] <= 90, caps
    none = _dry_run(tmp_path, "--budget", "20")
    assert none.returncode == 1 and "skipped (out of time)" in (tmp_path / "summary.txt").read_text()


def test_a_narrower_run_leaves_out_what_the_core_phases_ran(tmp_path):
    out = _dry_run(tmp_path, GPU_CHECK_PHASES="extension,sanitizer,more_tests", GPU_CHECK_BUDGET="230")
    assert out.returncode == 0, out.stderr
    budgets = _budgets(out.stdout)
    assert list(budgets) == ["extension", "sanitizer", "more_tests"]  # the environment's settings, as the options'
    assert sum(budgets.values()) <= 230
    assert "--deselect tests/bilm/test_highway_cuda.py::test_highway[" in out.stdout


@pytest.mark.parametrize(
    "options, said",
    [
        (["--budget", "soon"], "--budget: expected whole seconds, got 'soon'"),
        (["--phases", "device,warp"], "--phases: unknown phase 'warp'"),
        (["--rehearsal=gpu"], "--rehearsal: expected nothing or =emulated"),
        (["--bogus"], "unknown option --bogus"),
        (["--out"], "--out needs a folder"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path, options, said):
    out = _dry_run(tmp_path, *options)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"gpu_check.sh: {said}") and line.endswith("(--help lists the options)")


def test_help_is_the_scripts_header():
    out = cli_process.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("The GPU check: on a machine with an NVIDIA GPU")
    assert "--budget SECONDS" in out.stdout and "rsync -a prebuilt/" in out.stdout


def _selection(name: str) -> list[str]:
    text = SCRIPT.read_text()
    block = re.search(rf"^{name}=\((.*?)^\)", text, flags=re.M | re.S).group(1)
    return block.split()


@pytest.mark.parametrize("name", ["KERNEL_TESTS", "MODEL_TESTS", "MORE_TESTS"])
@pytest.mark.slow
def test_the_selected_tests_exist(name):
    """A renamed or moved test must fail here, not silently leave the GPU run's selection empty."""
    for node in _selection(name):
        if "::" not in node:  # a whole file
            assert (ROOT / node).is_file(), node
            continue
        path, func = node.split("::")
        tree = ast.parse((ROOT / path).read_text())
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, node


# --- the summary -----------------------------------------------------------------------------------------


def test_summary_reads_counts_failures_and_the_doctors_verdict(tmp_path):
    (tmp_path / "device.log").write_text(
        "GPU: NVIDIA H100 80GB HBM3, 132 SMs, 79.2 GiB, capability 9.0\n"
        "python 3.12.3 (.cpython-312-x86_64-linux-gnu.so), torch 2.11.0+cu130\n"
    )
    (tmp_path / "doctor.log").write_text(
        "op  reference\nchar_cnn  char_cnn_ref  cuda:0  float32  forward  3.1e-01  1e-05  "
        "inf  FAIL (N=7 L=9)\n\nFAIL: 1 of 40 checks on cuda:0 ...\n"
    )
    (tmp_path / "kernels.log").write_text(
        "..F\nFAILED tests/bilm/test_char_cnn_cuda.py::test_char_cnn[cuda-x] - "
        "AssertionError: big\n==== 1 failed, 2 passed in 3.0s ====\n"
    )
    (tmp_path / "model.log").write_text("..\n!!! KeyboardInterrupt !!!\n==== 2 passed in 110.0s ====\n")
    text = "\n".join(
        summary.device(tmp_path)
        + summary.doctor(tmp_path)
        + summary.pytest_phase(tmp_path, "kernels")
        + summary.pytest_phase(tmp_path, "model")
    )
    assert "GPU: NVIDIA H100" in text
    assert "doctor: FAIL: 1 of 40 checks" in text and "char_cnn  char_cnn_ref  cuda:0" in text
    assert "kernels: 1 failed, 2 passed in 3.0s" in text
    assert "tests/bilm/test_char_cnn_cuda.py::test_char_cnn[cuda-x] - AssertionError: big" in text
    assert "model: 2 passed in 110.0s (interrupted at its budget)" in text


def test_summary_compares_the_bench_with_the_targets(tmp_path):
    rows = [
        {"config": "model-fp32", "batch": 64, "words_per_s": 2e5, "p50_ms": 5.0, "peak_gb": 1.0},
        {"config": "model-bf16", "batch": 256, "words_per_s": 5e5, "p50_ms": 9.0},
        {"config": "model-graphs", "batch": 1, "words_per_s": 2e4, "p50_ms": 1.2},
        {"config": "fast-bf16", "batch": 1, "error": "RuntimeError: x"},
    ]
    (tmp_path / "bench.json").write_text(json.dumps({"machine": {"device": "H100"}, "rows": rows}))
    text = "\n".join(summary.bench(tmp_path))
    assert "batch 64 fp32 >= 150k tokens/s: 200000 tokens/s (model-fp32) met" in text
    assert "batch 256 bf16 >= 1M tokens/s: 500000 tokens/s (model-bf16) NOT met" in text
    assert "one sentence fp32 <= 1.5 ms: 1.20 ms (model-graphs) met" in text
    assert "one sentence bf16 <= 0.5 ms: not measured" in text
    assert "RuntimeError: x" in text
    (tmp_path / "bench.json").unlink()  # a bench killed before it wrote its json: its printed lines
    (tmp_path / "bench.log").write_text(
        "bench_gpu: fast-fp32   batch   64: p50      2.50 ms,     160000 words/s, diff 1e-06\n"
    )
    assert "160000" in "\n".join(summary.bench(tmp_path))


def test_summary_of_an_empty_folder_says_nothing_and_succeeds(tmp_path):
    assert summary.main([str(tmp_path)]) == 0


# --- the prebuilt extension --------------------------------------------------------------------------------


def test_prebuilt_record_check_install(tmp_path, monkeypatch, capsys):
    lib = tmp_path / "lib" / "elmo_fast"
    lib.mkdir(parents=True)
    name = "_C" + prebuilt.ext_suffix()
    (lib / name).write_bytes(b"not really a library")
    (lib / "_build_info.py").write_text("WITH_CUDA = True\nCUDA_ARCHS = ['sm_90', 'compute_90']\n")
    dest = tmp_path / "prebuilt"
    manifest = prebuilt.record(tmp_path / "lib", dest, 12.0)
    assert manifest["torch"] == torch.__version__ and manifest["cuda_archs"] == ["sm_90", "compute_90"]
    assert prebuilt.check(dest) == 0  # recorded by this interpreter, from these sources: it fits
    assert "  fits" in capsys.readouterr().out
    changed = dict(manifest, torch="1.0.0+cu999", ext_suffix=".cpython-39-x86_64-linux-gnu.so", sources="0" * 16)
    (dest / prebuilt.MANIFEST).write_text(json.dumps(changed))
    assert prebuilt.check(dest) == 3
    said = capsys.readouterr().out
    assert "this machine:  torch " + torch.__version__ in said
    assert "does NOT fit: torch 1.0.0+cu999 != " in said and "Python ABI" in said and "other sources" in said
    assert prebuilt.check(tmp_path / "none") == 2
    (dest / prebuilt.MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(prebuilt, "ROOT", tmp_path)
    (tmp_path / "elmo_fast").mkdir()
    prebuilt.install(dest)
    assert (tmp_path / "elmo_fast" / name).read_bytes() == b"not really a library"
    assert "WITH_CUDA = True" in (tmp_path / "elmo_fast" / "_build_info.py").read_text()


def test_prebuilt_refuses_a_cpu_only_build(tmp_path):
    lib = tmp_path / "elmo_fast"
    lib.mkdir()
    (lib / ("_C" + prebuilt.ext_suffix())).write_bytes(b"x")
    (lib / "_build_info.py").write_text("WITH_CUDA = False\nCUDA_DECISION = 'no nvcc'\n")
    with pytest.raises(SystemExit, match="without its CUDA kernels .no nvcc"):
        prebuilt.record(tmp_path, tmp_path / "prebuilt", None)


def test_prebuilt_local_version_tags_alone_fit():
    built = prebuilt.here()
    assert prebuilt.mismatches(dict(built, torch=built["torch"].split("+")[0] + "+other"), built) == []
    assert prebuilt.mismatches(dict(built, cxx11_abi=not built["cxx11_abi"]), built)


def test_prebuilt_describe_names_what_to_build_for_this_machine(monkeypatch):
    if torch.version.cuda is None:
        assert prebuilt.describe().startswith(f"prebuilt: torch {torch.__version__} here is not a CUDA build")
        monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: [(9, 0), (8, 6)][i])
    line = prebuilt.describe()
    assert line.startswith("bash scripts/prepare_gpu_run.sh --torch " + torch.__version__.split("+")[0])
    assert "--cuda 13.0" in line and '--archs "8.6;9.0"' in line
    assert f"--python python{sys.version_info[0]}.{sys.version_info[1]}" in line


def test_prepare_script_parses_and_says_how_to_run():
    script = ROOT / "scripts" / "prepare_gpu_run.sh"
    assert cli_process.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "rsync -a prebuilt/" in text and "bash tools/gpu_check.sh" in text
    help_ = cli_process.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "--torch VERSION" in help_.stdout and "describe" in help_.stdout
    bad = cli_process.run(["bash", str(script), "--python", "pypy"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected an interpreter named python3.X" in bad.stderr


@pytest.mark.slow
def test_a_rehearsal_of_the_extension_phase_loads_this_trees_extension(tmp_path):
    """Not a dry run: the extension phase's own Python, on this machine's CPU, with this tree's extension."""
    from elmo_fast.bilm import ops

    if not ops.HAS_EXTENSION:
        pytest.skip("elmo_fast._C is not built here (pip install --no-build-isolation -e .)")
    out = cli_process.run(
        [
            "bash",
            str(SCRIPT),
            "--rehearsal",
            "--phases",
            "extension",
            "--python",
            sys.executable,
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "elmo_fast._C loaded from " in (tmp_path / "extension.log").read_text()
