"""Whether setup.py compiles elmo-fast's CUDA kernels: only with a complete toolkit that matches torch.

A CUDA build needs all of: a CUDA build of torch; the toolkit torch's cpp_extension will use
(its CUDA_HOME: $CUDA_HOME or $CUDA_PATH, else the parent of the `nvcc` on PATH, else
/usr/local/cuda) with a bin/nvcc that runs and whose major CUDA version is torch's (the rule
torch.utils.cpp_extension._check_cuda_version enforces: a major mismatch is an error, a minor one a
warning); the CUDA headers csrc/cuda includes, in the include directories torch passes to the
compilers; a libcudart to link; and a test compile of those headers by nvcc and the host compiler.
When one is missing, :func:`decide` says so in one line and the CPU extension is built instead;
ELMO_FAST_FORCE_CUDA_BUILD=1 turns that into an error, ELMO_FAST_SKIP_CUDA_BUILD=1 skips CUDA.

No torch import here (setup.py passes what it read from torch), so the logic is unit-tested with
fake toolkits: tests/packaging/test_setup_cuda_decision.py.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: The CUDA headers csrc/cuda/*.cu, *.cuh, *.h and *.cpp include (the bindings compile with the host
#: compiler, which only sees the include directories torch passes: not nvcc's own).
REQUIRED_HEADERS = ("cuda_runtime_api.h", "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h")

SKIP_VAR = "ELMO_FAST_SKIP_CUDA_BUILD"
FORCE_VAR = "ELMO_FAST_FORCE_CUDA_BUILD"
#: ELMO_FAST_CUDA_PROBE=0 skips the test compile (the other checks still run).
PROBE_VAR = "ELMO_FAST_CUDA_PROBE"
ARCHS_VAR = "ELMO_FAST_CUDA_ARCHS"

_PROBE_SOURCE = (
    "".join(f"#include <{h}>\n" for h in REQUIRED_HEADERS)
    + """
__global__ void elmo_fast_probe(__nv_bfloat16* out, const __half* in) {
  out[threadIdx.x] = __float2bfloat16(__half2float(in[threadIdx.x]));
}
"""
)
_HOST_PROBE_SOURCE = (
    "".join(f"#include <{h}>\n" for h in REQUIRED_HEADERS)
    + """
int elmo_fast_probe() { return static_cast<int>(cudaSuccess); }
"""
)


class CudaBuildError(RuntimeError):
    """ELMO_FAST_FORCE_CUDA_BUILD=1 was set but the CUDA kernels cannot be built (or both variables were set)."""


@dataclass(frozen=True)
class CudaDecision:
    with_cuda: bool
    #: what was found (with_cuda) or why CUDA was skipped, in a few words
    reason: str
    #: a skip that deserves a warning: torch is a GPU build but its toolkit is unusable
    warn: bool = False
    #: how to get the CUDA kernels (only with warn)
    hint: str = ""

    def message(self) -> str:
        """The one line setup.py prints."""
        if self.with_cuda:
            return f"elmo-fast: building the CUDA extension ({self.reason})"
        if not self.warn:
            return f"elmo-fast: building the CPU-only extension ({self.reason})"
        return (
            f"elmo-fast: WARNING: building the CPU-only extension, without the CUDA kernels: {self.reason}. "
            f"{self.hint} {SKIP_VAR}=1 silences this warning; {FORCE_VAR}=1 makes it an error."
        )


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def cuda_archs(env: Mapping[str, str] = os.environ) -> list[tuple[int, int, str]]:
    """ELMO_FAST_CUDA_ARCHS ("8.0;9.0", "80;90a" or "8.0 9.0") as sorted (major, minor, suffix)."""
    raw = env.get(ARCHS_VAR, "8.0;9.0")
    archs = set()
    for item in re.split(r"[;,\s]+", raw.strip()):
        if not item:
            continue
        m = re.fullmatch(r"(\d+)\.?(\d)([af]?)", item)
        if m is None:
            raise SystemExit(f"{ARCHS_VAR}: cannot read {item!r}; expected e.g. '8.0;9.0' or '80;90a'")
        archs.add((int(m.group(1)), int(m.group(2)), m.group(3)))
    if not archs:
        raise SystemExit(f"{ARCHS_VAR} is empty")
    return sorted(archs)


def cuda_gencode_flags(archs: Sequence[tuple[int, int, str]]) -> list[str]:
    """SASS for every arch, PTX for the newest so that later GPUs can JIT it (as flash-attention).
    Passing any -gencode also stops torch from adding its own TORCH_CUDA_ARCH_LIST flags."""
    flags = []
    for major, minor, suffix in archs:
        flags += ["-gencode", f"arch=compute_{major}{minor}{suffix},code=sm_{major}{minor}{suffix}"]
    major, minor, _ = archs[-1]  # arch-specific (a/f) PTX would not run on later GPUs
    flags += ["-gencode", f"arch=compute_{major}{minor},code=compute_{major}{minor}"]
    return flags


def nvcc_version(nvcc: str) -> tuple[tuple[int, int] | None, str]:
    """((major, minor), "") from `nvcc --version`, or (None, why not)."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{nvcc} --version does not run ({type(exc).__name__}: {exc})"
    if proc.returncode != 0:
        return None, f"{nvcc} --version failed (exit {proc.returncode}: {_last_line(proc.stderr or proc.stdout)})"
    m = re.search(r"release (\d+)\.(\d+)", proc.stdout)
    if m is None:
        return None, f"{nvcc} --version does not say which CUDA release it is ({_last_line(proc.stdout)!r})"
    return (int(m.group(1)), int(m.group(2))), ""


def include_dirs(cuda_home: str, env: Mapping[str, str] = os.environ) -> list[str]:
    """The CUDA include directories torch's cpp_extension.include_paths("cuda") passes to the compilers."""
    dirs = [os.path.join(cuda_home, "include")]
    if env.get("CUDA_INC_PATH"):
        dirs.append(env["CUDA_INC_PATH"])
    return dirs


def library_dir(cuda_home: str) -> str:
    """The directory torch's cpp_extension.library_paths("cuda") links libcudart from (lib64, else lib)."""
    lib64 = os.path.join(cuda_home, "lib64")
    if not os.path.exists(lib64) and os.path.exists(os.path.join(cuda_home, "lib")):
        return os.path.join(cuda_home, "lib")
    return lib64


def probe_compile(nvcc: str, incs: Sequence[str], env: Mapping[str, str] = os.environ) -> str:
    """Compile a kernel that includes REQUIRED_HEADERS with nvcc (for ELMO_FAST_CUDA_ARCHS), and the
    headers alone with the host C++ compiler as the bindings are; "" when both succeed, else why not."""
    inc_flags = [f"-I{d}" for d in incs]
    host_cxx = env.get("CXX") or "c++"
    with tempfile.TemporaryDirectory(prefix="elmo_fast_cuda_probe_") as tmp:
        cu = os.path.join(tmp, "probe.cu")
        cpp = os.path.join(tmp, "probe.cpp")
        with open(cu, "w") as f:
            f.write(_PROBE_SOURCE)
        with open(cpp, "w") as f:
            f.write(_HOST_PROBE_SOURCE)
        ccbin = ["-ccbin", env["CC"]] if env.get("CC") else []
        commands = [
            [
                nvcc,
                "-c",
                cu,
                "-o",
                os.path.join(tmp, "probe.o"),
                "-std=c++20",
                *ccbin,
                *inc_flags,
                *cuda_gencode_flags(cuda_archs(env)),
            ],
            [host_cxx, "-fsyntax-only", "-std=c++20", *inc_flags, cpp],
        ]
        for cmd in commands:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
            except (OSError, subprocess.SubprocessError) as exc:
                return f"the test compile `{' '.join(cmd[:1])}` does not run ({type(exc).__name__}: {exc})"
            if proc.returncode != 0:
                return (
                    f"a test compile of the CUDA headers failed ({os.path.basename(cmd[0])}, exit {proc.returncode}: "
                    f"{_first_error(proc.stderr or proc.stdout)})"
                )
    return ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _first_error(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "no output"


def _default_candidates() -> list[str]:
    return sorted(set(glob.glob("/usr/local/cuda") + glob.glob("/usr/local/cuda-*") + glob.glob("/opt/cuda*")))


def suggest_cuda_home(major: int, exclude: str | None, candidates: Sequence[str] | None = None) -> str | None:
    """A toolkit directory with nvcc of CUDA `major`, the headers and libcudart, to name in the hint."""
    for home in _default_candidates() if candidates is None else candidates:
        if exclude and os.path.realpath(home) == os.path.realpath(exclude):
            continue
        nvcc = os.path.join(home, "bin", "nvcc")
        if not os.path.isfile(nvcc):
            continue
        if not all(os.path.isfile(os.path.join(home, "include", h)) for h in REQUIRED_HEADERS):
            continue
        version, _ = nvcc_version(nvcc)
        if version is not None and version[0] == major:
            return home
    return None


def decide(
    *,
    torch_version: str,
    torch_cuda: str | None,
    cuda_home: str | None,
    torch_hip: str | None = None,
    env: Mapping[str, str] = os.environ,
    probe: Callable[..., str] | None = probe_compile,
    candidates: Sequence[str] | None = None,
) -> CudaDecision:
    """Whether to build the CUDA kernels, from torch's build (version, torch.version.cuda/.hip), the
    CUDA_HOME torch's cpp_extension found (cpp_extension.CUDA_HOME; None for a CPU torch) and the
    environment. probe: the test compile (None: skip it; ELMO_FAST_CUDA_PROBE=0 skips it too).
    candidates: toolkit directories to suggest in the warning (default: /usr/local/cuda*, /opt/cuda*).

    Raises CudaBuildError when ELMO_FAST_FORCE_CUDA_BUILD=1 and the kernels cannot be built."""
    skip, force = _flag(env, SKIP_VAR), _flag(env, FORCE_VAR)
    if skip and force:
        raise CudaBuildError(f"both {SKIP_VAR}=1 and {FORCE_VAR}=1 are set; unset one")
    if skip:
        return CudaDecision(False, f"{SKIP_VAR}=1")
    decision = _check_toolkit(torch_version, torch_cuda, cuda_home, torch_hip, env, probe, candidates)
    if force and not decision.with_cuda:
        raise CudaBuildError(f"{FORCE_VAR}=1 but the CUDA kernels cannot be built: {decision.reason}. {decision.hint}")
    return decision


def _check_toolkit(torch_version, torch_cuda, cuda_home, torch_hip, env, probe, candidates) -> CudaDecision:
    if torch_hip:
        return CudaDecision(
            False,
            f"torch {torch_version} is a ROCm build and elmo-fast has CUDA kernels only",
            warn=True,
            hint="The CPU extension runs on the CPU.",
        )
    if not torch_cuda:
        return CudaDecision(False, f"torch {torch_version} is a CPU-only build")
    torch_major = int(torch_cuda.split(".")[0])

    def skipped(reason: str, home: str | None = cuda_home) -> CudaDecision:
        better = suggest_cuda_home(torch_major, home, candidates)
        hint = (
            f"To build them, set CUDA_HOME={better} (a complete CUDA {torch_major} toolkit found there) and rebuild."
            if better
            else f"To build them, install a complete CUDA {torch_major}.x toolkit (nvcc, headers, libcudart), point "
            "CUDA_HOME at it and rebuild."
        )
        return CudaDecision(False, reason, warn=True, hint=hint)

    if not cuda_home:
        return skipped(
            f"torch {torch_version} is a CUDA {torch_cuda} build but no CUDA toolkit was found "
            "(CUDA_HOME and CUDA_PATH unset, no nvcc on PATH, no /usr/local/cuda)"
        )
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if not os.path.isfile(nvcc):
        return skipped(f"the CUDA toolkit torch found, CUDA_HOME={cuda_home}, has no bin/nvcc")
    version, why = nvcc_version(nvcc)
    if version is None:
        return skipped(why)
    if version[0] != torch_major:
        return skipped(
            f"{nvcc} is CUDA {version[0]}.{version[1]} but torch {torch_version} was built with CUDA "
            f"{torch_cuda} (the major versions must match)"
        )
    incs = include_dirs(cuda_home, env)
    missing = [h for h in REQUIRED_HEADERS if not any(os.path.isfile(os.path.join(d, h)) for d in incs)]
    if missing:
        return skipped(
            f"CUDA_HOME={cuda_home} (nvcc {version[0]}.{version[1]}) is not a complete toolkit: "
            f"{', '.join(missing)} not in {os.pathsep.join(incs)}"
        )
    libdir = library_dir(cuda_home)
    if not any(os.path.exists(os.path.join(libdir, name)) for name in ("libcudart.so", "libcudart.a")):
        return skipped(f"CUDA_HOME={cuda_home} has no libcudart.so to link against in {libdir}")
    if probe is not None and env.get(PROBE_VAR, "1").strip() != "0":
        failure = probe(nvcc, incs, env)
        if failure:
            return skipped(f"{failure} (nvcc {nvcc}, CUDA {version[0]}.{version[1]})")
    return CudaDecision(True, f"nvcc {version[0]}.{version[1]} at {nvcc}, torch {torch_version} CUDA {torch_cuda}")
