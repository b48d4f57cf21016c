"""Build elmo-fast and its compiled extension ``elmo_fast._C``.

The CPU extension (csrc/*.cpp, csrc/cpu/*.cpp) is always built. The CUDA kernels (csrc/cuda/*.cu)
and their host bindings (csrc/cuda/*.cpp, which register TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m))
are added, making it a CUDAExtension, only when torch is a CUDA build AND its CUDA toolkit is
complete and matches it (nvcc runs, same major CUDA version as torch, the CUDA headers and libcudart
are there, a test compile passes: build_support/elmo_fast_cuda.py) AND ELMO_FAST_SKIP_CUDA_BUILD is
not 1. Otherwise the CPU extension is built, and a CUDA torch whose toolkit is unusable gets one
warning line saying why. A visible GPU plays no part: a build box without one builds the same
extension as a GPU machine. The decision is made when build_ext runs (not for metadata or sdists),
and recorded with the torch version in elmo_fast/_build_info.py, which explains at run time an
extension that does not load (e.g. built against another torch).

Environment:
    ELMO_FAST_SKIP_CUDA_BUILD=1     build the CPU extension only
    ELMO_FAST_FORCE_CUDA_BUILD=1    an unusable CUDA toolkit is an error, not a CPU build
    ELMO_FAST_CUDA_ARCHS="8.0;9.0"  SASS for each of these archs, plus PTX for the newest
    ELMO_FAST_CUDA_PROBE=0          skip the test compile of the CUDA headers
    CUDA_HOME=/usr/local/cuda-X.Y   the CUDA toolkit (else torch finds it from nvcc on PATH)
    MAX_JOBS=N                      parallel compile jobs (read by torch's BuildExtension)

Developers: pip install --no-build-isolation -e .   (torch installed first; builds against it)
Users:      pip install .   (build isolation: build_support/elmo_fast_backend.py builds against the
            torch installed in the target environment, without downloading another)
"""

import glob
import os
import sys

import setuptools
from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "build_support"))
import elmo_fast_cuda  # noqa: E402  (build_support/, not installed)

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # fine for an sdist or metadata, not for a build
    torch = None
NO_TORCH = (
    "elmo-fast: building elmo_fast._C needs torch; install torch first "
    "(https://pytorch.org/get-started/locally/), then build again"
)
if torch is None and {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"} & set(sys.argv[1:]):
    raise SystemExit(NO_TORCH)  # rather than a wheel without its extension

# Sources are relative to this file; pip runs setup.py from the source tree.
CSRC = "csrc"
# torch 2.13's headers use C++20 (e.g. bit-field initializers in c10/core/AutogradState.h) and its
# BuildExtension defaults to it; -std=c++17 only compiles as a GCC extension, with warnings.
CXX_STD = "-std=c++20"
EXT_NAME = "elmo_fast._C"
SERVE_REQUIRES = ["starlette>=0.40", "uvicorn>=0.30", "httptools>=0.6", "orjson>=3.9"]
# [ray]: elmo_fast.ray (Ray Data's ElmoBatchEmbedder, the Ray Serve app): from 2.60, the release tested (older
# ones are not), which the tests pin. A cluster's Ray and its clients' must be one release: no upper bound here.
RAY_REQUIRES = ["ray[data,serve]>=2.60.0", *SERVE_REQUIRES]
RAY_TESTED = "ray[data,serve]==2.60.0"
# [hub]: models on the Hugging Face Hub (--model hf:OWNER/REPO), through huggingface_hub's own functions
# (list_repo_files, snapshot_download with allow_patterns / local_files_only, huggingface_hub.errors: 0.24 on);
# the tests run the release they pin: the newest one that flair's transformers accepts (huggingface_hub < 1.0),
# since the tests run flair in the same environment
HUB_REQUIRES = ["huggingface_hub>=0.24"]
HUB_TESTED = "huggingface_hub==0.36.2"
# [onnx]: `elmo-fast export onnx` (torch's ONNX exporter needs onnxscript; onnx checks the file) and
# `--backend onnx` (ONNX Runtime, CPU; its quantizer for --quantize int8). Tested with onnx 1.23,
# onnxruntime 1.32 and onnxscript 0.7 on torch 2.13.
ONNX_REQUIRES = ["onnx", "onnxruntime", "onnxscript"]
BUILD_INFO = "_build_info.py"
# [test]'s linters, pinned: another release formats some lines differently (.ci/run runs both; CONTRIBUTING.md)
LINT_TOOLS = ["ruff==0.17.6", "clang-format==23.1.5"]

# The code's licence: Apache-2.0, the text in LICENSE (shipped in sdists and wheels). Each bundled model's
# MODEL_CARD.md and MODEL_INFO.json (elmo_fast/pretrained/<name>/) state its weights' terms: default's are
# Apache-2.0 too, default-v1's are not. setuptools >= 77 writes the licence as an SPDX License-Expression (metadata 2.4) and deprecates the
# licence classifiers; older ones write the License field, and get the classifier.
LICENSE = "Apache-2.0"
if int(setuptools.__version__.split(".")[0]) >= 77:
    LICENSE_METADATA, LICENSE_CLASSIFIERS = {"license_expression": LICENSE}, []
else:
    LICENSE_METADATA = {"license": LICENSE}
    LICENSE_CLASSIFIERS = ["License :: OSI Approved :: Apache Software License"]


def sources(pattern):
    return sorted(glob.glob(os.path.join(CSRC, pattern)))


def cpu_extension():
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
    srcs = sources("*.cpp") + sources(os.path.join("cpu", "*.cpp"))
    return cpp_extension.CppExtension(
        EXT_NAME,
        srcs,
        include_dirs=[os.path.abspath(CSRC)],
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )


def cuda_extension(cpu_ext):
    """The CPU extension plus the CUDA kernels and bindings, with the same host flags."""
    archs = elmo_fast_cuda.cuda_archs()
    print("elmo-fast: CUDA archs " + ", ".join(f"{a}.{b}{s}" for a, b, s in archs) + " (+PTX for the newest)")
    cxx_flags = list(cpu_ext.extra_compile_args["cxx"]) + ["-DELMO_FAST_WITH_CUDA"]
    nvcc_flags = ["-O3", CXX_STD, "-DELMO_FAST_WITH_CUDA", "-lineinfo"] + elmo_fast_cuda.cuda_gencode_flags(archs)
    # .cu: kernels and launchers only (CUDA headers, no torch: nvcc stays fast); .cpp: the bindings.
    cuda_srcs = sources(os.path.join("cuda", "*.cu")) + sources(os.path.join("cuda", "*.cpp"))
    cpu_srcs = [s for s in cpu_ext.sources if s not in cuda_srcs]
    return cpp_extension.CUDAExtension(
        EXT_NAME,
        cpu_srcs + cuda_srcs,
        include_dirs=[os.path.abspath(CSRC)],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=list(cpu_ext.extra_link_args),
    )


def write_build_info(directory, decision):
    """elmo_fast/_build_info.py next to the extension: what it was built against (read by elmo_fast._extension_info)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, BUILD_INFO), "w") as f:
        f.write('"""Written by setup.py when elmo_fast._C was built: what it was built against."""\n')
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"TORCH_CUDA = {torch.version.cuda!r}\n")
        f.write(f"WITH_CUDA = {decision.with_cuda!r}\n")
        f.write(f"CUDA_DECISION = {decision.reason!r}\n")
        # what the CUDA kernels were compiled for: sm_XY (SASS, runs on compute capability X.Y and later
        # minors of X) and compute_XY (PTX, JIT-compiled on X.Y and newer), e.g. ['sm_80', 'sm_90', 'compute_90']
        archs = None
        if decision.with_cuda:
            flags = elmo_fast_cuda.cuda_gencode_flags(elmo_fast_cuda.cuda_archs())
            archs = [flag.split("code=", 1)[1] for flag in flags if flag.startswith("arch=")]
        f.write(f"CUDA_ARCHS = {archs!r}\n")
        f.write(f"PYTHON = {'.'.join(map(str, sys.version_info[:2]))!r}\n")


# The opt-in allennlp import path (elmo_fast/as_allennlp.py): a .pth file in site-packages whose one line
# imports it at interpreter start when ELMO_FAST_AS_ALLENNLP is set (not "" or "0"), and does nothing
# otherwise (os is imported already there). Shipped by build_py in wheels, and written beside the
# editable finder by editable installs (PEP 660, or the legacy `develop`).
PTH_NAME = "elmo_fast_as_allennlp.pth"
PTH_LINE = (
    "import os; os.environ.get('ELMO_FAST_AS_ALLENNLP', '0') not in ('', '0') and __import__('elmo_fast.as_allennlp')\n"
)


def write_pth(directory):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, PTH_NAME), "w") as f:
        f.write(PTH_LINE)


class BuildPy(build_py):
    def run(self):
        super().run()
        write_pth(self.build_lib)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH_NAME)]


CMDCLASS = {"build_py": BuildPy}
try:  # setuptools >= 64: PEP 660 editable installs
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheel(editable_wheel):
        def _install_namespaces(self, installation_dir, pth_prefix):  # what lands beside the editable finder
            super()._install_namespaces(installation_dir, pth_prefix)
            write_pth(installation_dir)

    CMDCLASS["editable_wheel"] = EditableWheel
except ImportError:
    pass
try:  # `setup.py develop` (older setuptools' editable installs)
    from setuptools.command.develop import develop

    class Develop(develop):
        def run(self):
            super().run()
            if not getattr(self, "uninstall", False):
                write_pth(self.install_dir)

    CMDCLASS["develop"] = Develop
except ImportError:
    pass


if torch is not None:
    _BuildExtensionBase = cpp_extension.BuildExtension.with_options(use_ninja=cpp_extension.is_ninja_available())
else:
    from setuptools.command.build_ext import build_ext as _BuildExtensionBase


class BuildExt(_BuildExtensionBase):
    """Decides CPU vs CUDA once, when the extension is really built, and records it."""

    def run(self):
        if torch is None:
            raise SystemExit(NO_TORCH)
        try:
            decision = elmo_fast_cuda.decide(
                torch_version=torch.__version__,
                torch_cuda=torch.version.cuda,
                torch_hip=getattr(torch.version, "hip", None),
                cuda_home=cpp_extension.CUDA_HOME,
            )
        except elmo_fast_cuda.CudaBuildError as exc:
            raise SystemExit(f"elmo-fast: error: {exc}") from None
        print(decision.message(), file=sys.stderr if decision.warn else sys.stdout, flush=True)
        if decision.with_cuda:
            for ext in self.extensions:
                if ext.name == EXT_NAME:
                    # In place: build_ext.finalize_options already recorded this object (paths, stubs).
                    for key, value in vars(cuda_extension(ext)).items():
                        if not key.startswith("_"):
                            setattr(ext, key, value)
        inplace = self.inplace or getattr(self, "editable_mode", False)
        super().run()
        package_dir = os.path.join(*EXT_NAME.split(".")[:-1])
        write_build_info(os.path.join(self.build_lib, package_dir), decision)
        if inplace:  # editable install / build_ext --inplace: the extension lands in the source tree
            write_build_info(os.path.join(HERE, package_dir), decision)


setup(
    name="elmo-fast",
    version="0.1.0",
    description="Fast ELMo inference on PyTorch with C++/CUDA kernels",
    license_files=["LICENSE"],
    **LICENSE_METADATA,
    classifiers=[
        *LICENSE_CLASSIFIERS,
        "Programming Language :: Python :: 3",
        "Programming Language :: C++",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # Every folder under elmo_fast/ (subpackages, and data folders without __init__.py), with its
    # data files (*.json, *.hdf5, *.txt: e.g. a bundled model; MANIFEST.in puts them in the sdist).
    packages=find_namespace_packages(include=["elmo_fast", "elmo_fast.*"], exclude=["*.__pycache__"]),
    include_package_data=True,
    package_data={
        "elmo_fast": ["**/*.json", "**/*.hdf5", "**/*.txt", "pretrained/default/*", "pretrained/default-v1/*"]
    },
    exclude_package_data={"": ["*.so", "*.pyd", "*.o"]},
    python_requires=">=3.10",
    install_requires=["torch", "numpy", "h5py", "tqdm"],
    # [serve]: `elmo-fast serve` (Starlette on uvicorn, httptools for uvicorn's fast HTTP parser, orjson for
    # the vectors); in [test] too, so that CI runs the server's tests; and Ray, for the Ray room's;
    # and [onnx], for the export room's and the onnx backend's
    extras_require={
        "serve": SERVE_REQUIRES,
        "ray": RAY_REQUIRES,
        "hub": HUB_REQUIRES,
        "onnx": ONNX_REQUIRES,
        # schemathesis: the servers fuzzed from their OpenAPI description; cryptography: test certificates
        "test": [
            "pytest",
            "pytest-timeout",
            "hypothesis",
            "schemathesis>=4.0",
            "cryptography",
            *SERVE_REQUIRES,
            RAY_TESTED,
            HUB_TESTED,
            *ONNX_REQUIRES,
            *LINT_TOOLS,
        ],
    },
    entry_points={"console_scripts": ["elmo-fast=elmo_fast.cli:main"]},
    ext_modules=[cpu_extension()] if torch is not None else [],
    cmdclass={"build_ext": BuildExt, **CMDCLASS},
    zip_safe=False,
)
