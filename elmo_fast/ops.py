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


def bilstm(xg0: Tensor, token_index: Tensor, lengths: Tensor, weights: list[Tensor], cell_clip: float | None,
           proj_clip: float | None, h0: Tensor | None = None,
           c0: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """ELMo's stacked projected biLSTM, fused: the whole stack and time loop in C++.

    Same semantics as :func:`elmo_fast.reference.bilstm_ref`.

    xg0:         [U, 2, 4C] layer 0's input gates of the distinct tokens, bias included, gates
                 i, f, g, o (:func:`~elmo_fast.reference.layer0_gates_ref`); rows may be a slice of
                 a wider buffer. float32 or float64.
    token_index: [B, T] int64, the row of ``xg0`` at each position (ignored at t >= lengths[b]).
    lengths:     [B] int64 in [0, T], any order.
    weights:     8L tensors, weights[4 * (2l + d) + k]: w_ih [4C, P], w_hh [4C, P], bias [4C],
                 w_proj [P, C] (layer 0's w_ih and bias are unused: folded into ``xg0``); the
                 dtype of ``xg0``, or bfloat16 with a float32 ``xg0`` (biases bf16 or fp32): then the
                 GEMMs run in bf16 with fp32 accumulation while states, gates and outputs stay fp32.
    cell_clip, proj_clip: clip values, None or 0 for none.
    h0, c0:      [L, B, 2P], [L, B, 2C] initial states ([forward | backward]), or None (zeros).
    returns      outputs [L, B, T, 2P] (exactly 0 at t >= lengths[b]), h [L, B, 2P], c [L, B, 2C]
                 (each row's state after its last step; a row of length 0 keeps its initial state).
    """
    require_extension()
    return torch.ops.elmo_fast.bilstm.default(xg0, token_index, lengths, list(weights), cell_clip, proj_clip,
                                              h0, c0)


if HAS_EXTENSION:

    @torch.library.register_fake("elmo_fast::highway_gate")
    def _highway_gate_fake(projected: Tensor, x: Tensor) -> Tensor:
        torch._check(projected.dim() == 2 and x.dim() == 2, lambda: "highway_gate: projected and x must have 2 dims")
        torch._check(projected.shape[0] == x.shape[0], lambda: "highway_gate: projected and x must have the same N")
        torch._check(projected.shape[1] == 2 * x.shape[1], lambda: "highway_gate: projected must be [N, 2H]")
        torch._check(projected.dtype == x.dtype, lambda: "highway_gate: projected and x must have the same dtype")
        return x.new_empty(x.shape)

    @torch.library.register_fake("elmo_fast::bilstm")
    def _bilstm_fake(xg0: Tensor, token_index: Tensor, lengths: Tensor, weights: list[Tensor],
                     cell_clip: float | None, proj_clip: float | None, h0: Tensor | None,
                     c0: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        torch._check(len(weights) > 0 and len(weights) % 8 == 0,
                     lambda: "bilstm: weights must hold 8 tensors per layer")
        torch._check(xg0.dim() == 3 and token_index.dim() == 2 and lengths.dim() == 1,
                     lambda: "bilstm: xg0, token_index and lengths must have 3, 2 and 1 dims")
        num_layers = len(weights) // 8
        P, C = weights[3].shape
        B, T = token_index.shape
        torch._check(xg0.shape[1] == 2 and xg0.shape[2] == 4 * C, lambda: "bilstm: xg0 must be [U, 2, 4C]")
        torch._check(lengths.shape[0] == B, lambda: "bilstm: lengths must be [B]")
        return (xg0.new_empty(num_layers, B, T, 2 * P), xg0.new_empty(num_layers, B, 2 * P),
                xg0.new_empty(num_layers, B, 2 * C))
