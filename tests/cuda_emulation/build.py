"""Build the CPU emulation of the CUDA kernels and bindings as the op library ``elmo_fast_emu``.

    from cuda_emulation.build import load_emulation   # (tests/ on sys.path)
    load_emulation()   # then torch.ops.elmo_fast_emu.{highway_gate, highway, char_cnn, bilstm, ...}

Compiles csrc/cuda/*_kernels.cuh (through emulator.h, which says what the emulator checks) and
csrc/cuda/*_cuda.cpp (with -DELMO_FAST_EMULATE_CUDA: csrc/cuda/backend.h's strict stand-ins) with the
host compiler, and tests/cuda_emulation/emu_*.cpp: the op library, and the test-only library
``elmo_fast_emu_test`` of deliberately broken kernels and bindings that the emulator must catch
(emu_strictness.cpp). Needs the CUDA headers (for the bf16/fp16 types and cuda_runtime.h), not a
GPU, nor nvcc. Floating-point contraction is on (-ffp-contract=fast, with FMA instructions on x86
CPUs that have them), as nvcc's default --fmad=true fuses a*b + c on the GPU.

Built in this checkout's build/cuda_emulation/ (ELMO_FAST_EMULATION_BUILD_DIR elsewhere), not in torch's
shared extension cache, where checkouts of other sources would rebuild it in turn: the first build takes
a minute or two on two cores, a later process loads it in a second unless a source or header changed.

ELMO_FAST_EMULATION_ASAN=1 builds with AddressSanitizer (run python under
LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0);
ELMO_FAST_EMULATION_TSAN=1 with ThreadSanitizer (see .ci/emulator_tsan.sh).
"""

from __future__ import annotations

import glob
import hashlib
import os
import platform
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "csrc"


def cuda_include_dir() -> str | None:
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "include" / "cuda_runtime_api.h").exists():
            return str(Path(candidate) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        inc = Path(nvcc).resolve().parents[1] / "include"
        if (inc / "cuda_runtime_api.h").exists():
            return str(inc)
    return None


def cpu_has_fma() -> bool:
    """Whether this x86 CPU has FMA instructions (other architectures: contraction needs no flag)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " fma " in flags.replace("\n", " ")


def fp_flags() -> list[str]:
    """Contraction on, as nvcc's --fmad=true: a*b + c fused where the compiler sees one."""
    flags = ["-fno-fast-math", "-ffp-contract=fast", "-fexpensive-optimizations"]  # (-O1 forms no FMA without it)
    if platform.machine() in ("x86_64", "AMD64", "i686") and cpu_has_fma():
        flags.append("-mfma")
    return flags


def variant() -> tuple[str, list[str], list[str]]:
    """The library's name and extra compile / link flags: plain, or under a sanitizer (with debug information,
    for its reports' source lines; the plain build has none: -g costs 60% more compile time on the torch
    headers every file includes)."""
    if os.environ.get("ELMO_FAST_EMULATION_TSAN") == "1":
        return "elmo_fast_emu_tsan", ["-g", "-fsanitize=thread", "-fno-omit-frame-pointer"], ["-fsanitize=thread"]
    if os.environ.get("ELMO_FAST_EMULATION_ASAN") == "1":
        return "elmo_fast_emu_asan", ["-g", "-fsanitize=address", "-fno-omit-frame-pointer"], ["-fsanitize=address"]
    return "elmo_fast_emu", [], []


_loaded: list[str] = []  # the library this process loaded: loading another build of it would register its ops twice


def load_emulation(verbose: bool = False) -> None:
    import torch
    from torch.utils import cpp_extension

    if _loaded:
        return

    inc = cuda_include_dir()
    if inc is None:
        raise RuntimeError("the CUDA emulation needs the CUDA headers (cuda_runtime_api.h); set CUDA_HOME")
    sources = sorted(str(p) for p in HERE.glob("emu_*.cpp")) + sorted(glob.glob(str(CSRC / "cuda" / "*_cuda.cpp")))
    name, extra_flags, extra_ldflags = variant()
    flags = ["-O1", "-std=c++20", "-pthread", "-DELMO_FAST_EMULATE_CUDA", *fp_flags(), *extra_flags]
    ldflags = ["-pthread", *extra_ldflags]
    # torch's JIT versioning hashes only the listed sources: a hash of every header in the flags
    # makes an edited .cuh/.h rebuild too.
    digest = hashlib.sha1()
    for path in sorted(glob.glob(str(CSRC / "**" / "*"), recursive=True)) + sorted(glob.glob(str(HERE / "*"))):
        if os.path.isfile(path) and path.endswith((".h", ".cuh", ".cpp")):
            digest.update(Path(path).read_bytes())
    flags.append(f"-DELMO_FAST_EMULATION_SOURCES={digest.hexdigest()[:16]}")
    build_dir = Path(os.environ.get("ELMO_FAST_EMULATION_BUILD_DIR") or ROOT / "build" / "cuda_emulation") / name
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=name,
        sources=sources,
        extra_cflags=flags,
        extra_ldflags=ldflags,
        extra_include_paths=[str(CSRC), str(HERE), inc],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=verbose,
    )
    assert hasattr(torch.ops.elmo_fast_emu, "bilstm")
    _loaded.append(name)


if __name__ == "__main__":
    load_emulation(verbose=True)
    print("elmo_fast_emu loaded")
