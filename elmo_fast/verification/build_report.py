"""What this install runs: elmo-fast's version, torch's, and which backends of ``elmo_fast._C`` were
built (CPU always; CUDA with the CUDA release and the GPU architectures it was compiled for), as
``elmo-fast --version`` prints it on one line and ``elmo-fast doctor`` at the top of its report.

The facts come from the loaded extension (:mod:`elmo_fast.bilm.ops`) and from what setup.py recorded
when it built it (``elmo_fast/_build_info.py``, read by :mod:`elmo_fast._extension_info`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import torch

from .. import _extension_info
from ..bilm import ops


@dataclass(frozen=True)
class BuildReport:
    version: str
    torch: str
    #: the CUDA release torch was built with (None: a CPU-only torch)
    torch_cuda: str | None
    #: "loaded", "not built" or "does not load"
    extension: str
    #: why the extension is not loaded (None when it is)
    extension_error: str | None
    #: the torch release the extension was compiled against (None: no record)
    built_against_torch: str | None
    #: the compiled backends: ("cpu",) or ("cpu", "cuda"); () without an extension
    backends: tuple[str, ...]
    #: the CUDA release the CUDA kernels were compiled and linked with (torch's, at build time)
    cuda_runtime: str | None
    #: what the CUDA kernels were compiled for: sm_XY (SASS) and compute_XY (PTX), or None
    cuda_archs: tuple[str, ...] | None
    #: whether the CUDA build includes the training ops (the backward passes, lstm_layer)
    cuda_training_ops: bool
    #: why there are no CUDA kernels (None when there are)
    cuda_missing: str | None
    #: the GPUs torch sees, "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)", ...
    gpus: tuple[str, ...] = field(default=())

    def one_line(self) -> str:
        """``elmo-fast 0.1.0 (torch 2.13.0+cpu; extension: cpu [built against torch 2.13.0]; cuda: not built)``."""
        if self.extension != "loaded":
            ext = f"extension: {self.extension}"
        else:
            against = f" [built against torch {self.built_against_torch}]" if self.built_against_torch else ""
            ext = f"extension: {'+'.join(self.backends)}{against}"
        return f"elmo-fast {self.version} (torch {self.torch}; {ext}; cuda: {self.cuda_summary()})"

    def cuda_summary(self) -> str:
        """``built, CUDA 12.4, sm_80 sm_90 compute_90`` or ``not built``."""
        if "cuda" not in self.backends:
            return "not built"
        archs = " ".join(self.cuda_archs) if self.cuda_archs else "archs not recorded"
        runtime = f"CUDA {self.cuda_runtime}" if self.cuda_runtime else "CUDA release not recorded"
        training = "" if self.cuda_training_ops else ", without the training ops"
        return f"built, {runtime}, {archs}{training}"

    def to_dict(self) -> dict:
        return asdict(self)


def build_report() -> BuildReport:
    """The facts of this install (cheap: nothing runs on a device)."""
    from .. import __version__  # the package's own __init__, fully imported by the time this runs

    info = _extension_info.build_info()
    if ops.HAS_EXTENSION:
        extension, error = "loaded", None
    else:
        extension = "does not load" if ops.EXTENSION_LOAD_FAILED else "not built"
        error = ops.EXTENSION_IMPORT_ERROR
    archs = getattr(info, "CUDA_ARCHS", None)
    gpus = ()
    if torch.cuda.is_available():
        gpus = tuple(
            f"cuda:{i} {torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(torch.cuda.device_count())
        )
    return BuildReport(
        version=__version__,
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        extension=extension,
        extension_error=error,
        built_against_torch=getattr(info, "TORCH_VERSION", None),
        backends=(("cpu", "cuda") if ops.HAS_CUDA_KERNELS else ("cpu",)) if ops.HAS_EXTENSION else (),
        cuda_runtime=getattr(info, "TORCH_CUDA", None) if ops.HAS_CUDA_KERNELS else None,
        cuda_archs=tuple(archs) if archs is not None else None,
        cuda_training_ops=ops.HAS_CUDA_BACKWARD,
        cuda_missing=ops.cuda_kernels_missing_reason(),
        gpus=gpus,
    )


def arch_mismatch(archs: tuple[str, ...] | None, capability: tuple[int, int]) -> str | None:
    """Why kernels compiled for ``archs`` cannot run on a GPU of compute ``capability``, or None when
    one of them can (SASS sm_XY runs on X.Y and later minors of X; PTX compute_XY is JIT-compiled for
    X.Y and any newer GPU). None also when the archs were not recorded (nothing to say)."""
    if not archs:
        return None
    major, minor = capability
    for arch in archs:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch)
        if m is None:
            continue
        kind, a_major, a_minor, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if kind == "sm" and a_major == major and a_minor <= minor and (not suffix or a_minor == minor):
            return None
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return None
    return (
        f"elmo_fast._C's CUDA kernels were compiled for {' '.join(archs)}, none of which runs on a GPU of compute "
        f'capability {major}.{minor}: rebuild with ELMO_FAST_CUDA_ARCHS="{major}.{minor}" '
        "pip install --no-build-isolation -e ."
    )
