"""Build elmo-fast and its compiled extension ``elmo_fast._C``.

The CPU extension (csrc/*.cpp, csrc/cpu/*.cpp) is always built. The CUDA kernels (csrc/cuda/*.cu)
and their host bindings (csrc/cuda/*.cpp, which register TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m))
are added, making it a CUDAExtension, only when nvcc is found AND torch is a CUDA build AND
ELMO_FAST_SKIP_CUDA_BUILD is not 1. A visible GPU plays no part: a build box without one builds
the same extension as a GPU machine.

Environment:
    ELMO_FAST_SKIP_CUDA_BUILD=1     build the CPU extension only
    ELMO_FAST_CUDA_ARCHS="8.0;9.0"  SASS for each of these archs, plus PTX for the newest
    MAX_JOBS=N                      parallel compile jobs (read by torch's BuildExtension)

torch must already be installed, hence: pip install --no-build-isolation -e .
"""
import glob
import os
import re
import shutil

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import (
    CUDA_HOME,
    BuildExtension,
    CppExtension,
    CUDAExtension,
    is_ninja_available,
)

# Sources are relative to this file; pip runs setup.py from the source tree.
CSRC = "csrc"
# torch 2.13's headers use C++20 (e.g. bit-field initializers in c10/core/AutogradState.h) and its
# BuildExtension defaults to it; -std=c++17 only compiles as a GCC extension, with warnings.
CXX_STD = "-std=c++20"


def sources(pattern):
    return sorted(glob.glob(os.path.join(CSRC, pattern)))


def nvcc_path():
    """nvcc of the CUDA toolkit torch found (CUDA_HOME), else the one on PATH, else None."""
    if CUDA_HOME is not None and os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return os.path.join(CUDA_HOME, "bin", "nvcc")
    return shutil.which("nvcc")


def build_cuda():
    """Whether to compile the CUDA kernels, and why, decided only from the toolchain and env."""
    if os.environ.get("ELMO_FAST_SKIP_CUDA_BUILD", "0") == "1":
        return False, "ELMO_FAST_SKIP_CUDA_BUILD=1"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is not a CUDA build"
    if nvcc_path() is None:
        return False, "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return True, f"nvcc {nvcc_path()}, torch CUDA {torch.version.cuda}"


def cuda_archs():
    """ELMO_FAST_CUDA_ARCHS ("8.0;9.0", "80;90a" or "8.0 9.0") as sorted (major, minor, suffix)."""
    raw = os.environ.get("ELMO_FAST_CUDA_ARCHS", "8.0;9.0")
    archs = set()
    for item in re.split(r"[;,\s]+", raw.strip()):
        if not item:
            continue
        m = re.fullmatch(r"(\d+)\.?(\d)([af]?)", item)
        if m is None:
            raise SystemExit(f"ELMO_FAST_CUDA_ARCHS: cannot read {item!r}; expected e.g. '8.0;9.0' or '80;90a'")
        archs.add((int(m.group(1)), int(m.group(2)), m.group(3)))
    if not archs:
        raise SystemExit("ELMO_FAST_CUDA_ARCHS is empty")
    return sorted(archs)


def cuda_gencode_flags(archs):
    """SASS for every arch, PTX for the newest so that later GPUs can JIT it (as flash-attention).
    Passing any -gencode also stops torch from adding its own TORCH_CUDA_ARCH_LIST flags."""
    flags = []
    for major, minor, suffix in archs:
        flags += ["-gencode", f"arch=compute_{major}{minor}{suffix},code=sm_{major}{minor}{suffix}"]
    major, minor, _ = archs[-1]  # arch-specific (a/f) PTX would not run on later GPUs
    flags += ["-gencode", f"arch=compute_{major}{minor},code=compute_{major}{minor}"]
    return flags


def get_extensions():
    cxx_flags = [
        "-O3",
        CXX_STD,
        # As torch builds itself: lets GCC if-convert the kernels' selects and vectorize them.
        "-fno-math-errno",
        "-fno-trapping-math",
    ]
    link_flags = []
    # at::parallel_for is header code: without -fopenmp against an OpenMP build of torch it
    # compiles fine and silently runs on one thread. libgomp resolves to the copy torch loaded.
    if torch._C.has_openmp:
        cxx_flags.append("-fopenmp")
        link_flags.append("-fopenmp")

    with_cuda, reason = build_cuda()
    print(f"elmo-fast: building the {'CUDA' if with_cuda else 'CPU-only'} extension ({reason})")
    srcs = sources("*.cpp") + sources(os.path.join("cpu", "*.cpp"))
    kwargs = dict(
        include_dirs=[os.path.abspath(CSRC)],
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )
    if not with_cuda:
        return [CppExtension("elmo_fast._C", srcs, **kwargs)]

    archs = cuda_archs()
    print("elmo-fast: CUDA archs " + ", ".join(f"{a}.{b}{s}" for a, b, s in archs) + " (+PTX for the newest)")
    cxx_flags.append("-DELMO_FAST_WITH_CUDA")
    kwargs["extra_compile_args"]["nvcc"] = [
        "-O3",
        CXX_STD,
        "-DELMO_FAST_WITH_CUDA",
        "-lineinfo",
    ] + cuda_gencode_flags(archs)
    # .cu: kernels and launchers only (CUDA headers, no torch: nvcc stays fast); .cpp: the bindings.
    cuda_srcs = sources(os.path.join("cuda", "*.cu")) + sources(os.path.join("cuda", "*.cpp"))
    return [CUDAExtension("elmo_fast._C", srcs + cuda_srcs, **kwargs)]


setup(
    name="elmo-fast",
    version="0.1.0",
    description="Fast ELMo inference on PyTorch with C++/CUDA kernels",
    packages=find_packages(include=["elmo_fast", "elmo_fast.*"]),
    python_requires=">=3.10",
    install_requires=["torch", "numpy", "h5py", "tqdm"],
    extras_require={"test": ["pytest", "hypothesis"]},
    entry_points={"console_scripts": ["elmo-fast=elmo_fast.cli:main"]},
    ext_modules=get_extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=is_ninja_available())},
    zip_safe=False,
)
