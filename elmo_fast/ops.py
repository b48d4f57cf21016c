"""Typed Python entry points to the compiled ops of ``elmo_fast._C``.

Importing ``elmo_fast._C`` loads the shared library, whose static initializers register the ops
with the dispatcher as ``torch.ops.elmo_fast.*`` (schemas in csrc/elmo_fast.cpp, kernels in
csrc/cpu/ and csrc/cuda/). This module never fails to import: when the extension is missing,
``HAS_EXTENSION`` is False and every op raises :class:`ExtensionNotBuiltError` saying how to build.

Each op has a twin ``<op>_ref`` in :mod:`elmo_fast.reference` with the same signature.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .errors import ExtensionNotBuiltError

try:
    from elmo_fast import _C  # noqa: F401  (imported for its op registrations)
except ImportError as exc:  # not built, or built against another torch/Python
    HAS_EXTENSION = False
    EXTENSION_IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
    HAS_CUDA_KERNELS = False
else:
    HAS_EXTENSION = True
    EXTENSION_IMPORT_ERROR = None
    # Whether csrc/cuda/*.cu were compiled in (a build-time fact; says nothing about a GPU).
    HAS_CUDA_KERNELS = bool(getattr(_C, "WITH_CUDA", 0))


def require_extension() -> None:
    """Raise :class:`ExtensionNotBuiltError` unless ``elmo_fast._C`` was imported."""
    if not HAS_EXTENSION:
        raise ExtensionNotBuiltError(
            "the compiled extension elmo_fast._C is not available; build it from the source tree with "
            "`pip install --no-build-isolation -e .` (torch must already be installed in this "
            f"environment). Import error: {EXTENSION_IMPORT_ERROR}"
        )


def cuda_kernels_missing_reason() -> str | None:
    """Why this install cannot run the ops on CUDA tensors, with the fix; None when it can."""
    if not HAS_EXTENSION:
        return (f"the compiled extension elmo_fast._C is not available ({EXTENSION_IMPORT_ERROR}); build it with "
                "`pip install --no-build-isolation -e .` from the source tree")
    if HAS_CUDA_KERNELS:
        return None
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build, so elmo_fast._C was built without its CUDA "
                "kernels. Install a CUDA build of torch (https://pytorch.org/get-started/locally/), make sure "
                "nvcc is found (CUDA_HOME or PATH), then rebuild from the source tree with "
                "`pip install --no-build-isolation -e .`")
    return (f"elmo_fast._C was built without its CUDA kernels although torch {torch.__version__} is a CUDA "
            f"{torch.version.cuda} build: the build found no nvcc, or ELMO_FAST_SKIP_CUDA_BUILD=1 was set. Make "
            "sure nvcc is found (CUDA_HOME or PATH), unset ELMO_FAST_SKIP_CUDA_BUILD, then rebuild from the "
            "source tree with `pip install --no-build-isolation -e .`")


def require_cuda_kernels() -> None:
    """Raise :class:`ExtensionNotBuiltError`, saying how to get them, unless the CUDA kernels are built in."""
    reason = cuda_kernels_missing_reason()
    if reason is not None:
        raise ExtensionNotBuiltError(f"elmo-fast's CUDA kernels are not available: {reason}")


def _require_kernels_for(*tensors: Tensor) -> None:
    """The extension, and its CUDA kernels when any input is a CUDA tensor: a clear error instead of
    the dispatcher's "Could not run 'elmo_fast::...' with arguments from the 'CUDA' backend"."""
    require_extension()
    if not HAS_CUDA_KERNELS and any(t.is_cuda for t in tensors):
        require_cuda_kernels()


def highway_gate(projected: Tensor, x: Tensor) -> Tensor:
    """One highway layer's gating, given its affine output (fused, one pass over memory).

    projected: [N, 2H], ``[transform | gate]`` (rows may be a slice of a wider buffer).
    x:         [N, H], the layer's input; same dtype (float32, float64, bfloat16) and device.
    returns    [N, H] contiguous, ``g * x + (1 - g) * relu(transform)`` with ``g = sigmoid(gate)``;
               bfloat16 (and float16, on CUDA) is computed in float32 and rounded once.
    """
    _require_kernels_for(projected, x)
    return torch.ops.elmo_fast.highway_gate.default(projected, x)


def highway(x: Tensor, highway_weights: list[Tensor], highway_biases: list[Tensor], proj_weight: Tensor,
            proj_bias: Tensor) -> Tensor:
    """Highway stack and projection (twin of :func:`elmo_fast.reference.highway_ref`).

    x:               [N, F] char CNN output.
    highway_weights: L tensors [2F, F] ([W_transform; -W_carry]); highway_biases: L tensors [2F].
    proj_weight:     [P, F]; proj_bias: [P]. All of x's dtype and device.
    returns          [N, P]: GEMMs through ATen's BLAS, each layer's gating one fused pass.
    """
    _require_kernels_for(x)
    return torch.ops.elmo_fast.highway.default(x, list(highway_weights), list(highway_biases), proj_weight, proj_bias)


if HAS_EXTENSION:

    @torch.library.register_fake("elmo_fast::highway")
    def _highway_fake(x, highway_weights, highway_biases, proj_weight, proj_bias):
        torch._check(x.dim() == 2, lambda: "highway: x must have 2 dims")
        torch._check(proj_weight.dim() == 2 and proj_weight.shape[1] == x.shape[1],
                     lambda: "highway: proj_weight must be [P, F]")
        return x.new_empty((x.shape[0], proj_weight.shape[0]))

    @torch.library.register_fake("elmo_fast::highway_gate")
    def _highway_gate_fake(projected: Tensor, x: Tensor) -> Tensor:
        torch._check(projected.dim() == 2 and x.dim() == 2, lambda: "highway_gate: projected and x must have 2 dims")
        torch._check(projected.shape[0] == x.shape[0], lambda: "highway_gate: projected and x must have the same N")
        torch._check(projected.shape[1] == 2 * x.shape[1], lambda: "highway_gate: projected must be [N, 2H]")
        torch._check(projected.dtype == x.dtype, lambda: "highway_gate: projected and x must have the same dtype")
        return x.new_empty(x.shape)
