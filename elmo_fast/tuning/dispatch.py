"""What the CPU kernels dispatch on, as they see it: the instruction sets they pick their code by, and
whether this CPU runs packed weights now. The calibration's key names all of it
(:mod:`~elmo_fast.tuning.key`), and the calibration never offers packed weights that do not run.

* ``cpu``: the CPU's model name and logical CPUs;
* ``flags``: the instruction-set extensions PyTorch finds (cpuinfo: avx2, avx512, avx512_vnni,
  avx512_bf16, amx_tile, amx_fp16), the hardware's;
* ``aten``: ATen's kernel level (``torch.backends.cpu.get_cpu_capability()``: what ATen and the LSTM's own
  GEMV run, ``ATEN_CPU_CAPABILITY`` capping it);
* ``packed``: the dtypes whose packed GEMM runs here (``ops.packed_gemm_available``: oneDNN's BRGeMM as
  oneDNN sees the CPU, ``ONEDNN_MAX_CPU_ISA`` capping it, and ``torch.backends.mkldnn`` on);
* ``variables``: the dispatch variables that are set (:data:`~elmo_fast.tuning.environment.DISPATCH`).
"""

from __future__ import annotations

import functools
import os
import platform

import torch

from ..bilm import ops
from . import environment

#: torch.cpu's probes, by the flag's name
_FLAGS = ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_fp16")


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else the platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def isa_flags() -> tuple[str, ...]:
    """The instruction-set extensions PyTorch finds on this CPU (read once: the hardware's)."""
    found = []
    for flag in _FLAGS:
        probe = getattr(torch.cpu, f"_is_{'vnni' if flag == 'avx512_vnni' else flag}_supported", None)
        try:
            if probe is not None and probe():
                found.append(flag)
        except Exception:  # a probe this build lacks: not found
            pass
    return tuple(found)


def packed_available(dtype: torch.dtype) -> bool:
    """Whether packed weights of ``dtype`` run here now (False without the extension)."""
    return ops.HAS_EXTENSION and ops.packed_gemm_available(dtype)


def report() -> dict:
    """What the kernels dispatch on now (see the module's docstring); plain JSON values."""
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "flags": list(isa_flags()),
        "aten": torch.backends.cpu.get_cpu_capability(),
        "packed": [
            name for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)) if packed_available(dtype)
        ],
        "variables": environment.dispatch_variables(),
    }
