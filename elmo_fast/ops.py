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


def highway_gate(projected: Tensor, x: Tensor) -> Tensor:
    """One highway layer's gating, given its affine output (fused, one pass over memory).

    projected: [N, 2H], ``[transform | gate]`` (rows may be a slice of a wider buffer).
    x:         [N, H], the layer's input; same dtype (float32, float64, bfloat16) and device.
    returns    [N, H] contiguous, ``g * x + (1 - g) * relu(transform)`` with ``g = sigmoid(gate)``;
               bfloat16 is computed in float32 and rounded once.
    """
    require_extension()
    return torch.ops.elmo_fast.highway_gate.default(projected, x)


def highway(x: Tensor, highway_weights: list[Tensor], highway_biases: list[Tensor], proj_weight: Tensor,
            proj_bias: Tensor) -> Tensor:
    """Highway stack and projection (twin of :func:`elmo_fast.reference.highway_ref`).

    x:               [N, F] char CNN output.
    highway_weights: L tensors [2F, F] ([W_transform; -W_carry]); highway_biases: L tensors [2F].
    proj_weight:     [P, F]; proj_bias: [P]. All of x's dtype and device.
    returns          [N, P]: GEMMs through ATen's BLAS, each layer's gating one fused pass.
    """
    require_extension()
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
