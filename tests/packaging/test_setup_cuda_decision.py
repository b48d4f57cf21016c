"""setup.py's choice between the CUDA and the CPU extension (build_support/elmo_fast_cuda.py), on
fake CUDA toolkits in temporary directories: a half-usable toolkit gives the CPU extension and one
warning line, never a failed build, unless ELMO_FAST_FORCE_CUDA_BUILD=1."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from repo_paths import REPO as ROOT

sys.path.insert(0, str(ROOT / "build_support"))
import elmo_fast_cuda as cuda  # noqa: E402

CUDA_TORCH = dict(torch_version="2.14.1+cu130", torch_cuda="13.0")
ENV: dict[str, str] = {}  # no ELMO_FAST_* variables, whatever the test runner's environment


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def make_toolkit(
    root: Path,
    release: str | None = "13.0",
    headers=cuda.REQUIRED_HEADERS,
    libcudart: bool = True,
    nvcc: bool = True,
    version_exit: int = 0,
    compile_error: str | None = None,
) -> Path:
    """A fake toolkit: bin/nvcc answers --version with `release` and logs any other call to nvcc.log
    (failing with `compile_error` when given); include/ holds `headers`; lib64/ libcudart.so."""
    root.mkdir(parents=True, exist_ok=True)
    if nvcc:
        version = (
            f"echo 'Cuda compilation tools, release {release}, V{release}.1'"
            if release
            else "echo 'nvcc: something else'"
        )
        compile_step = f"echo 'probe.cu(1): error: {compile_error}' >&2; exit 1" if compile_error else "exit 0"
        _script(
            root / "bin" / "nvcc",
            f'if [ "$1" = "--version" ]; then {version}; exit {version_exit}; fi\n'
            f'echo "$@" >> "{root}/nvcc.log"\n{compile_step}\n',
        )
    (root / "include").mkdir(exist_ok=True)
    for header in headers:
        (root / "include" / header).write_text("")
    if libcudart:
        (root / "lib64").mkdir(exist_ok=True)
        (root / "lib64" / "libcudart.so").write_text("")
    return root


def no_probe(*args):
    return ""


def decide(cuda_home, env=None, probe=no_probe, candidates=(), **torch):
    return cuda.decide(
        **{**CUDA_TORCH, **torch},
        cuda_home=None if cuda_home is None else str(cuda_home),
        env=ENV if env is None else env,
        probe=probe,
        candidates=candidates,
    )


def assert_one_warning_line(decision, *fragments):
    assert not decision.with_cuda and decision.warn
    message = decision.message()
    assert "\n" not in message and message.startswith("elmo-fast: WARNING: building the CPU-only extension")
    for fragment in fragments + ("ELMO_FAST_SKIP_CUDA_BUILD=1", "ELMO_FAST_FORCE_CUDA_BUILD=1", "CUDA_HOME"):
        assert fragment in message, (fragment, message)


def test_complete_matching_toolkit_builds_cuda(tmp_path):
    decision = decide(make_toolkit(tmp_path / "cuda"))
    assert decision.with_cuda and not decision.warn
    assert decision.message().startswith("elmo-fast: building the CUDA extension (nvcc 13.0 at ")


def test_minor_version_difference_is_fine_as_for_torch(tmp_path):
    assert decide(make_toolkit(tmp_path / "cuda", release="13.2")).with_cuda


def test_cpu_torch_builds_cpu_without_warning(tmp_path):
    decision = decide(make_toolkit(tmp_path / "cuda"), torch_version="2.13.0+cpu", torch_cuda=None)
    assert not decision.with_cuda and not decision.warn
    assert decision.message() == "elmo-fast: building the CPU-only extension (torch 2.13.0+cpu is a CPU-only build)"


def test_skip_variable_wins_over_a_good_toolkit(tmp_path):
    decision = decide(make_toolkit(tmp_path / "cuda"), env={"ELMO_FAST_SKIP_CUDA_BUILD": "1"})
    assert not decision.with_cuda and not decision.warn
    assert "ELMO_FAST_SKIP_CUDA_BUILD=1" in decision.message()


@pytest.mark.parametrize("missing", cuda.REQUIRED_HEADERS)
def test_missing_header_falls_back_with_one_warning(tmp_path, missing):
    headers = [h for h in cuda.REQUIRED_HEADERS if h != missing]
    decision = decide(make_toolkit(tmp_path / "cuda", headers=headers))
    assert_one_warning_line(decision, missing, "not a complete toolkit", str(tmp_path / "cuda" / "include"))


def test_nvcc_wrapper_without_headers_is_the_reported_failure(tmp_path):
    # A reported failure: nvcc on PATH is /usr/local/bin/nvcc (a wrapper), so torch's CUDA_HOME is
    # /usr/local, which has no CUDA headers; the real toolkit is elsewhere and gets suggested.
    wrapper_home = make_toolkit(tmp_path / "usr_local", headers=())
    real = make_toolkit(tmp_path / "cuda-13.0")
    decision = decide(wrapper_home, candidates=[str(real)])
    assert_one_warning_line(decision, "cuda_runtime_api.h", f"set CUDA_HOME={real}")


def test_suggestion_only_names_a_toolkit_of_torchs_major_version(tmp_path):
    wrapper_home = make_toolkit(tmp_path / "usr_local", headers=())
    other = make_toolkit(tmp_path / "cuda-12.8", release="12.8")
    decision = decide(wrapper_home, candidates=[str(other)])
    assert_one_warning_line(decision, "install a complete CUDA 13.x toolkit")
    assert str(other) not in decision.message()


def test_major_version_mismatch_falls_back(tmp_path):
    decision = decide(make_toolkit(tmp_path / "cuda", release="12.8"))
    assert_one_warning_line(
        decision, "CUDA 12.8", "torch 2.14.1+cu130 was built with CUDA 13.0", "major versions must match"
    )


def test_no_toolkit_at_all_falls_back(tmp_path):
    assert_one_warning_line(decide(None), "no CUDA toolkit was found")


def test_toolkit_without_nvcc_falls_back(tmp_path):
    assert_one_warning_line(decide(make_toolkit(tmp_path / "cuda", nvcc=False)), "has no bin/nvcc")


def test_nvcc_that_fails_falls_back(tmp_path):
    assert_one_warning_line(decide(make_toolkit(tmp_path / "cuda", version_exit=3)), "--version failed (exit 3")


def test_nvcc_without_a_release_number_falls_back(tmp_path):
    assert_one_warning_line(decide(make_toolkit(tmp_path / "cuda", release=None)), "does not say which CUDA release")


def test_no_libcudart_falls_back(tmp_path):
    assert_one_warning_line(decide(make_toolkit(tmp_path / "cuda", libcudart=False)), "libcudart")


def test_libcudart_in_lib_is_found_as_torch_finds_it(tmp_path):
    home = make_toolkit(tmp_path / "cuda", libcudart=False)
    (home / "lib").mkdir()
    (home / "lib" / "libcudart.so").write_text("")
    assert decide(home).with_cuda


def test_headers_from_cuda_inc_path_count(tmp_path):
    home = make_toolkit(tmp_path / "cuda", headers=())
    extra = tmp_path / "extra_include"
    extra.mkdir()
    for header in cuda.REQUIRED_HEADERS:
        (extra / header).write_text("")
    assert decide(home, env={"CUDA_INC_PATH": str(extra)}).with_cuda


def test_failed_test_compile_falls_back(tmp_path):
    decision = decide(make_toolkit(tmp_path / "cuda"), probe=lambda nvcc, incs, env: "a test compile failed (x)")
    assert_one_warning_line(decision, "a test compile failed (x)")


def test_probe_compiles_with_nvcc_and_the_host_compiler(tmp_path):
    home = make_toolkit(tmp_path / "cuda")
    cxx = _script(tmp_path / "fake-c++", f'echo "$@" >> "{tmp_path}/cxx.log"\nexit 0\n')
    decision = decide(home, env={"CXX": str(cxx), "ELMO_FAST_CUDA_ARCHS": "8.0"}, probe=cuda.probe_compile)
    assert decision.with_cuda
    nvcc_call = (home / "nvcc.log").read_text()
    assert f"-I{home / 'include'}" in nvcc_call and "arch=compute_80,code=sm_80" in nvcc_call
    assert f"-I{home / 'include'}" in (tmp_path / "cxx.log").read_text()


def test_probe_failure_reports_the_compiler_error(tmp_path):
    home = make_toolkit(tmp_path / "cuda", compile_error="unsupported GNU version!")
    cxx = _script(tmp_path / "fake-c++", "exit 0\n")
    decision = decide(home, env={"CXX": str(cxx)}, probe=cuda.probe_compile)
    assert_one_warning_line(decision, "test compile", "unsupported GNU version!")


def test_probe_can_be_switched_off(tmp_path):
    decision = decide(
        make_toolkit(tmp_path / "cuda"), env={"ELMO_FAST_CUDA_PROBE": "0"}, probe=lambda *a: pytest.fail("probe ran")
    )
    assert decision.with_cuda


def test_rocm_torch_falls_back_with_warning(tmp_path):
    decision = decide(None, torch_version="2.14.1+rocm7.0", torch_cuda=None, torch_hip="7.0")
    assert not decision.with_cuda and decision.warn and "ROCm" in decision.message()


@pytest.mark.parametrize("case", ["missing header", "mismatch", "no toolkit", "cpu torch"])
def test_force_turns_each_problem_into_an_error(tmp_path, case):
    force = {"ELMO_FAST_FORCE_CUDA_BUILD": "1"}
    kwargs = {
        "missing header": dict(cuda_home=make_toolkit(tmp_path / "a", headers=("cuda_runtime.h",))),
        "mismatch": dict(cuda_home=make_toolkit(tmp_path / "b", release="12.4")),
        "no toolkit": dict(cuda_home=None),
        "cpu torch": dict(cuda_home=make_toolkit(tmp_path / "c"), torch_version="2.13.0+cpu", torch_cuda=None),
    }[case]
    with pytest.raises(cuda.CudaBuildError, match="ELMO_FAST_FORCE_CUDA_BUILD=1 but the CUDA kernels cannot be built"):
        decide(env=force, **kwargs)


def test_force_with_a_good_toolkit_builds_cuda(tmp_path):
    assert decide(make_toolkit(tmp_path / "cuda"), env={"ELMO_FAST_FORCE_CUDA_BUILD": "1"}).with_cuda


def test_force_and_skip_together_is_an_error(tmp_path):
    with pytest.raises(cuda.CudaBuildError, match="both"):
        decide(None, env={"ELMO_FAST_FORCE_CUDA_BUILD": "1", "ELMO_FAST_SKIP_CUDA_BUILD": "1"})


def test_cuda_archs_and_gencode_flags():
    archs = cuda.cuda_archs({"ELMO_FAST_CUDA_ARCHS": "90a;8.0"})
    assert archs == [(8, 0, ""), (9, 0, "a")]
    assert cuda.cuda_gencode_flags(archs) == [
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90a,code=sm_90a",
        "-gencode",
        "arch=compute_90,code=compute_90",
    ]
    with pytest.raises(SystemExit, match="cannot read"):
        cuda.cuda_archs({"ELMO_FAST_CUDA_ARCHS": "sm_80"})


@pytest.mark.skipif(not os.path.isfile("/usr/local/cuda/bin/nvcc"), reason="no CUDA toolkit at /usr/local/cuda")
def test_real_toolkit_if_any():
    """On a machine with a toolkit at /usr/local/cuda, the decision for a matching CUDA torch runs end to end."""
    version, why = cuda.nvcc_version("/usr/local/cuda/bin/nvcc")
    assert version is not None, why
    decision = cuda.decide(
        torch_version="x", torch_cuda=f"{version[0]}.0", cuda_home="/usr/local/cuda", env={}, probe=None
    )
    assert "\n" not in decision.message()
