"""Typed Python entry points to the compiled ops of ``elmo_fast._C``.

Importing ``elmo_fast._C`` loads the shared library, whose static initializers register the ops
with the dispatcher as ``torch.ops.elmo_fast.*`` (schemas in csrc/elmo_fast.cpp, kernels in
csrc/cpu/ and csrc/cuda/). This module never fails to import: when the extension is missing,
``HAS_EXTENSION`` is False and every op raises :class:`ExtensionNotBuiltError` saying how to build.

Each op has a twin ``<op>_ref`` in :mod:`elmo_fast.bilm.reference` with the same signature.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ExtensionNotBuiltError

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


#: Whether the fast ops have backward passes (register_autograd), so that training can run them.
HAS_BACKWARD = False


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
    """Highway stack and projection (twin of :func:`elmo_fast.bilm.reference.highway_ref`).

    x:               [N, F] char CNN output.
    highway_weights: L tensors [2F, F] ([W_transform; -W_carry]); highway_biases: L tensors [2F].
    proj_weight:     [P, F]; proj_bias: [P]. All of x's dtype and device.
    returns          [N, P]: GEMMs through ATen's BLAS, each layer's gating one fused pass.
    """
    _require_kernels_for(x)
    return torch.ops.elmo_fast.highway.default(x, list(highway_weights), list(highway_biases), proj_weight, proj_bias)


def char_cnn(char_ids: Tensor, char_embedding: Tensor, conv_weights: list[Tensor], conv_biases: list[Tensor],
             activation: str = "relu") -> Tensor:
    """Character CNN: one token vector per row of character ids (fused; twin of ``char_cnn_ref``).

    char_ids:       [N, L] int64, ids in [0, V) (+1 shifted ids; any strides). L is 50 for allennlp's
                    ids, max_characters_per_token for ELMoForManyLangs models (CUDA: L <= 64).
    char_embedding: [V, D] float32 or float64 (V = 262 for allennlp's ids; thousands of rows for
                    ELMoForManyLangs models).
    conv_weights:   K tensors [n_k, D, w_k], 1 <= w_k <= L; conv_biases: K tensors [n_k]; all
                    of char_embedding's dtype.
    activation:     "relu" or "tanh", applied after the max over the L - w_k + 1 windows.
    returns         [N, sum n_k] contiguous, in char_embedding's dtype: for each k in order,
                    ``act(amax(conv1d(embedding(char_ids).transpose(1, 2), W_k, b_k), -1))``.
    """
    _require_kernels_for(char_ids, char_embedding)
    return torch.ops.elmo_fast.char_cnn.default(char_ids, char_embedding, list(conv_weights), list(conv_biases),
                                                activation)


def bilstm(xg0: Tensor, token_index: Tensor, lengths: Tensor, weights: list[Tensor], cell_clip: float | None,
           proj_clip: float | None, h0: Tensor | None = None,
           c0: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """ELMo's stacked projected biLSTM, fused: the whole stack and time loop in C++.

    Same semantics as :func:`elmo_fast.bilm.reference.bilstm_ref`.

    xg0:         [U, 2, 4C] layer 0's input gates of the distinct tokens, bias included, gates
                 i, f, g, o (:func:`~elmo_fast.bilm.reference.layer0_gates_ref`); rows may be a slice of
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
    _require_kernels_for(xg0, token_index)
    return torch.ops.elmo_fast.bilstm.default(xg0, token_index, lengths, list(weights), cell_clip, proj_clip,
                                              h0, c0)


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

    @torch.library.register_fake("elmo_fast::char_cnn")
    def _char_cnn_fake(char_ids: Tensor, char_embedding: Tensor, conv_weights: list[Tensor],
                       conv_biases: list[Tensor], activation: str) -> Tensor:
        torch._check(char_ids.dim() == 2 and char_ids.shape[1] >= 1, lambda: "char_cnn: char_ids must be [N, L]")
        torch._check(char_embedding.dim() == 2, lambda: "char_cnn: char_embedding must be [V, D]")
        torch._check(len(conv_weights) == len(conv_biases) and len(conv_weights) > 0,
                     lambda: "char_cnn: conv_weights and conv_biases must have the same, non-zero length")
        for w, b in zip(conv_weights, conv_biases):
            torch._check(w.dim() == 3 and w.shape[1] == char_embedding.shape[1] and w.shape[2] <= char_ids.shape[1],
                         lambda: "char_cnn: conv_weights[k] must be [n_k, D, w_k], w_k <= L")
            torch._check(b.dim() == 1 and b.shape[0] == w.shape[0], lambda: "char_cnn: conv_biases[k] must be [n_k]")
        torch._check(activation in ("relu", "tanh"), lambda: "char_cnn: activation must be 'relu' or 'tanh'")
        return char_embedding.new_empty((char_ids.shape[0], sum(w.shape[0] for w in conv_weights)))
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
