"""Build the CPU emulation of the CUDA kernels and bindings as the op library ``elmo_fast_emu``.

    from cuda_emulation.build import load_emulation   # (tests/ on sys.path)
    load_emulation()   # then torch.ops.elmo_fast_emu.{highway_gate, highway, char_cnn, bilstm}

Compiles csrc/cuda/*_kernels.cuh (through emulator.h) and csrc/cuda/*_cuda.cpp (with
-DELMO_FAST_EMULATE_CUDA) with the host compiler; needs the CUDA headers (for the bf16/fp16 types
and cuda_runtime.h), not a GPU, nor nvcc. Cached by torch.utils.cpp_extension between runs.
ELMO_FAST_EMULATION_ASAN=1 builds with AddressSanitizer (run python under
LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0).
"""
from __future__ import annotations

import glob
import hashlib
import os
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


def load_emulation(verbose: bool = False) -> None:
    import torch
    from torch.utils import cpp_extension

    inc = cuda_include_dir()
    if inc is None:
        raise RuntimeError("the CUDA emulation needs the CUDA headers (cuda_runtime_api.h); set CUDA_HOME")
    sources = sorted(str(p) for p in HERE.glob("emu_*.cpp")) + sorted(glob.glob(str(CSRC / "cuda" / "*_cuda.cpp")))
    flags = ["-O1", "-g", "-std=c++20", "-pthread", "-DELMO_FAST_EMULATE_CUDA", "-fno-fast-math",
             "-ffp-contract=off"]
    ldflags = ["-pthread"]
    # torch's JIT versioning hashes only the listed sources: a hash of every header in the flags
    # makes an edited .cuh/.h rebuild too.
    digest = hashlib.sha1()
    for path in sorted(glob.glob(str(CSRC / "**" / "*"), recursive=True)) + sorted(glob.glob(str(HERE / "*"))):
        if os.path.isfile(path) and path.endswith((".h", ".cuh", ".cpp")):
            digest.update(Path(path).read_bytes())
    flags.append(f"-DELMO_FAST_EMULATION_SOURCES={digest.hexdigest()[:16]}")
    name = "elmo_fast_emu"
    if os.environ.get("ELMO_FAST_EMULATION_ASAN") == "1":
        flags += ["-fsanitize=address", "-fno-omit-frame-pointer"]
        ldflags += ["-fsanitize=address"]
        name += "_asan"
    cpp_extension.load(name=name, sources=sources, extra_cflags=flags, extra_ldflags=ldflags,
                       extra_include_paths=[str(CSRC), str(HERE), inc], is_python_module=False, verbose=verbose)
    assert hasattr(torch.ops.elmo_fast_emu, "bilstm")


if __name__ == "__main__":
    load_emulation(verbose=True)
    print("elmo_fast_emu loaded")
