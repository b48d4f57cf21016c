"""Typed Python entry points to the compiled ops of ``elmo_fast._C``.

Importing ``elmo_fast._C`` loads the shared library, whose static initializers register the ops
with the dispatcher as ``torch.ops.elmo_fast.*`` (schemas in csrc/elmo_fast.cpp, kernels in
csrc/cpu/ and csrc/cuda/). This module never fails to import: when the extension is missing,
``HAS_EXTENSION`` is False and every op raises :class:`ExtensionNotBuiltError` saying how to build.

Each op has a twin ``<op>_ref`` in :mod:`elmo_fast.bilm.reference` with the same signature.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _extension_status
from .._extension_status import TRAINING_OPS  # noqa: F401  (public here)
from ..errors import ExtensionNotBuiltError  # noqa: F401  (the error the checks raise; public here)

# Whether the extension loaded, and if not why (see elmo_fast._extension_status, which owns these
# facts and their messages; they are read from here, where tests may change them)
HAS_EXTENSION, EXTENSION_LOAD_FAILED, EXTENSION_IMPORT_ERROR, HAS_CUDA_KERNELS = _extension_status.load()
#: Whether the fast ops have backward passes (register_autograd) on CPU tensors, so that training
#: and fine-tuning can run them; on CUDA tensors see :data:`HAS_CUDA_BACKWARD`.
HAS_BACKWARD = HAS_EXTENSION
#: Whether the CUDA kernels include the training ops (csrc/cuda: backward passes of char_cnn and
#: highway_gate, the trainable LSTM layer): then training and fine-tuning on a GPU run the fast ops
#: as on the CPU; without them (a CPU-only build, or one from older sources), the reference stages
#: under autograd.
HAS_CUDA_BACKWARD = HAS_CUDA_KERNELS and _extension_status.has_kernels("CUDA")


#: Called as ``hook(op, tensor, schedule)`` (the op's name, its main input, :func:`_schedule` of the
#: call) at every op call when set: the first-use self-check of :mod:`elmo_fast.verification.first_use`
#: (ELMO_FAST_SELFCHECK, on for CUDA ops by default). It returns None (run the kernel) or, for an op
#: that failed its check on that device in that schedule, a callable taking the op's arguments (its
#: reference twin) whose result the op returns instead.
_first_use_hook: Callable[[str, Tensor, tuple | None], Callable | None] | None = None


def set_first_use_hook(hook: Callable[[str, Tensor, tuple | None], Callable | None] | None) -> None:
    """Install (or, with None, remove) the hook every op calls first (see ``_first_use_hook``)."""
    global _first_use_hook
    _first_use_hook = hook


def _schedule(
    weight: Tensor | None = None, gemv_rows: int | None = None, tuning: list[int] | None = None
) -> tuple | None:
    """How a call runs besides its values, as the first-use hook is told it: None for the kernels'
    defaults, else ``(packed weights' dtype or None, gemv_max_rows, tuning as a tuple or None)``."""
    packed = weight.dtype if weight is not None and weight.dim() == 4 else None
    if packed is None and gemv_rows is None and tuning is None:
        return None
    return packed, gemv_rows, None if tuning is None else tuple(tuning)


def require_extension() -> None:
    """Raise :class:`ExtensionNotBuiltError` unless ``elmo_fast._C`` was imported."""
    _extension_status.require_extension(HAS_EXTENSION, EXTENSION_LOAD_FAILED, EXTENSION_IMPORT_ERROR)


def cuda_kernels_missing_reason() -> str | None:
    """Why this install cannot run the ops on CUDA tensors, with the fix; None when it can."""
    return _extension_status.cuda_kernels_missing_reason(HAS_EXTENSION, HAS_CUDA_KERNELS, EXTENSION_IMPORT_ERROR)


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

    Differentiable (CPU; CUDA where :data:`HAS_CUDA_BACKWARD`): the backward is one fused pass
    (``highway_gate_backward``).
    """
    if _first_use_hook is not None and (twin := _first_use_hook("highway_gate", x, None)) is not None:
        return twin(projected, x)
    _require_kernels_for(projected, x)
    return torch.ops.elmo_fast.highway_gate.default(projected, x)


def highway(
    x: Tensor,
    highway_weights: list[Tensor],
    highway_biases: list[Tensor],
    proj_weight: Tensor,
    proj_bias: Tensor,
    gemv_max_rows: int | None = None,
) -> Tensor:
    """Highway stack and projection (twin of :func:`elmo_fast.bilm.reference.highway_ref`).

    x:               [N, F] char CNN output.
    highway_weights: L tensors [2F, F] ([W_transform; -W_carry]); highway_biases: L tensors [2F].
    proj_weight:     [P, F]; proj_bias: [P]. All of x's dtype and device.
    gemv_max_rows:   CPU, float32: GEMMs of at most this many rows take the op's own GEMV (None: a
                     default from the weights' size; :mod:`elmo_fast.tuning.calibration` measures it).
    returns          [N, P]: GEMMs through ATen's BLAS, each layer's gating one fused pass.

    Differentiable: with gradients needed, the steps run one by one under autograd (the same
    kernels and values), and the gates' backward is one fused pass each.
    """
    if (
        _first_use_hook is not None
        and (twin := _first_use_hook("highway", x, _schedule(None, gemv_max_rows))) is not None
    ):
        return twin(x, highway_weights, highway_biases, proj_weight, proj_bias)
    _require_kernels_for(x)
    if torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, *highway_weights, *highway_biases, proj_weight, proj_bias)
    ):
        # Training: the op's own steps (the same GEMMs and fused gate, hence the same values), one by one,
        # so that autograd keeps every layer's [transform | gate] for the gate's fused backward
        # (highway_gate_backward); the op's own backward would have to recompute them.
        # Under autocast (bf16 training) F.linear gives bf16: the gate, elementwise, runs in x's dtype.
        for w, b in zip(highway_weights, highway_biases):
            x = highway_gate(F.linear(x, w, b).to(x.dtype), x)
        return F.linear(x, proj_weight, proj_bias)
    return torch.ops.elmo_fast.highway.default(
        x, list(highway_weights), list(highway_biases), proj_weight, proj_bias, gemv_max_rows
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, gemv_max_rows: int | None = None) -> Tensor:
    """``x @ weight.T + bias`` (twin of :func:`elmo_fast.bilm.reference.linear_ref`, i.e. ``F.linear``).

    x: [n, K]; weight: [N, K]; bias: [N] or None; one dtype. returns [n, N].
    On the CPU in float32, few rows against large weights (up to ``gemv_max_rows``; None: 128 rows
    for weights of 16 MB and more, else 32) take the LSTM steps' GEMV, which reads the weights once
    at memory speed where BLAS's GEMM reads them several times slower; the rest, and other devices,
    take ATen's GEMM. On the CPU, ``weight`` may also be packed (:func:`pack_weight`) with float32
    x and bias: a GEMM in the packed weight's dtype with a float32 result (inference only).
    Differentiable (the usual formulas, through ATen).
    """
    if (
        _first_use_hook is not None
        and (twin := _first_use_hook("linear", x, _schedule(weight, gemv_max_rows))) is not None
    ):
        return twin(x, weight, bias)
    if x.device.type != "cpu":
        return F.linear(x, weight, bias)
    require_extension()
    return torch.ops.elmo_fast.linear.default(x, weight, bias, gemv_max_rows)


def pack_weight(weight: Tensor) -> Tensor:
    """A GEMM weight [N, K] (float32, or bfloat16 with K even; N a multiple of 16) packed, in its dtype,
    for the CPU's BRGeMM micro-kernels (oneDNN's: AMX tiles or AVX512-BF16 for bf16, FMAs for float32):
    [N / nb, K / g, nb, g], ``packed[j, k // g, c, k % g] = weight[j * nb + c, k]``, g = 2 for bf16, 1
    for float32 (csrc/packed_weight.h). :func:`linear` and :func:`bilstm` take it in place of the plain
    weight, on the CPU; made once per model."""
    require_extension()
    return torch.ops.elmo_fast.pack_weight.default(weight)


def packed_gemm_available(dtype: torch.dtype) -> bool:
    """Whether this CPU runs GEMMs of weights packed (:func:`pack_weight`) in ``dtype`` now: float32 always;
    bfloat16 where oneDNN's BRGeMM micro-kernel runs (AVX-512 with BF16 or AMX, as oneDNN sees the CPU:
    ``ONEDNN_MAX_CPU_ISA`` caps it) and ``torch.backends.mkldnn`` is enabled; no other dtype. Elsewhere
    :func:`pack_weight` refuses bfloat16 weights, and the calibration never offers them packed."""
    require_extension()
    return bool(torch.ops.elmo_fast.packed_gemm_available.default(dtype))


def layer0_gates_packed(tokens: Tensor, packed: list[Tensor], biases: list[Tensor]) -> Tensor:
    """Layer 0's input gates [U, 2, 4C] of token vectors [U, P] with both directions' w_ih packed
    (:func:`pack_weight`) and their float32 biases: GEMMs in the packed weights' dtype, a float32 result
    (see :func:`layer0_gates`; each GEMM is a :func:`linear`, checked as one)."""
    return torch.stack([linear(tokens, packed[d], biases[d]) for d in range(2)], dim=1)


def layer0_gates(tokens: Tensor, weights: list[Tensor], gemv_max_rows: int | None = None) -> Tensor:
    """Layer 0's input gates of distinct tokens, both directions: [U, P] -> [U, 2, 4C] (twin of
    :func:`elmo_fast.bilm.reference.layer0_gates_ref`), each direction one :func:`linear`."""
    if (
        _first_use_hook is not None
        and (twin := _first_use_hook("layer0_gates", tokens, _schedule(None, gemv_max_rows))) is not None
    ):
        return twin(tokens, weights)
    return torch.stack([linear(tokens, weights[4 * d], weights[4 * d + 2], gemv_max_rows) for d in range(2)], dim=1)


def char_cnn(
    char_ids: Tensor,
    char_embedding: Tensor,
    conv_weights: list[Tensor],
    conv_biases: list[Tensor],
    activation: str = "relu",
) -> Tensor:
    """Character CNN: one token vector per row of character ids (fused; twin of ``char_cnn_ref``).

    char_ids:       [N, L] int64, ids in [0, V) (+1 shifted ids; any strides). L is 50 for allennlp's
                    ids, max_characters_per_token for ELMoForManyLangs models; every backend takes any L >= 1.
    char_embedding: [V, D] float32 or float64 (V = 262 for allennlp's ids; thousands of rows for
                    ELMoForManyLangs models).
    conv_weights:   K tensors [n_k, D, w_k], 1 <= w_k <= L; conv_biases: K tensors [n_k]; all
                    of char_embedding's dtype.
    activation:     "relu" or "tanh", applied after the max over the L - w_k + 1 windows.
    returns         [N, sum n_k] contiguous, in char_embedding's dtype: for each k in order,
                    ``act(amax(conv1d(embedding(char_ids).transpose(1, 2), W_k, b_k), -1))``.

    Differentiable in char_embedding, conv_weights and conv_biases (CPU; CUDA where
    :data:`HAS_CUDA_BACKWARD`, deterministic there too): each filter's gradient goes
    to its max window, recomputed by the backward (``char_cnn_backward``). Equal windows: the first
    one takes it; windows that hold the same ids (ELMo's padding) give the same gradient whichever
    takes it, as the reference's amax, which shares it among them.
    """
    if _first_use_hook is not None and (twin := _first_use_hook("char_cnn", char_embedding, None)) is not None:
        return twin(char_ids, char_embedding, conv_weights, conv_biases, activation)
    _require_kernels_for(char_ids, char_embedding)
    return torch.ops.elmo_fast.char_cnn.default(
        char_ids, char_embedding, list(conv_weights), list(conv_biases), activation
    )


def bilstm(
    xg0: Tensor,
    token_index: Tensor,
    lengths: Tensor,
    weights: list[Tensor],
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
    tuning: list[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """ELMo's stacked projected biLSTM, fused: the whole stack and time loop in C++.

    Same semantics as :func:`elmo_fast.bilm.reference.bilstm_ref`.

    xg0:         [U, 2, 4C] layer 0's input gates of the distinct tokens, bias included, gates
                 i, f, g, o (:func:`~elmo_fast.bilm.reference.layer0_gates_ref`); rows may be a slice of
                 a wider buffer. float32 or float64.
    token_index: [B, T] int64, the row of ``xg0`` at each position (ignored at t >= lengths[b]).
    lengths:     [B] int64 in [0, T], any order. The schedule is made on the host: for CUDA tensors,
                 lengths on the CPU let the call queue its kernels without waiting for the GPU (and be
                 captured in a CUDA graph); lengths on the GPU cost one device sync.
    weights:     8L tensors, weights[4 * (2l + d) + k]: w_ih [4C, P], w_hh [4C, P], bias [4C],
                 w_proj [P, C] (layer 0's w_ih and bias are unused: folded into ``xg0``); the
                 dtype of ``xg0``, or bfloat16 with a float32 ``xg0`` (biases bf16 or fp32): then the
                 GEMMs run in bf16 with fp32 accumulation while states, gates and outputs stay fp32.
                 On CUDA, each layer's forward and backward w_hh (and w_proj) given as the two halves of
                 one [2, ...] tensor are used in place; separate tensors are stacked (copied) per call.
                 On the CPU the GEMM weights may all be packed (:func:`pack_weight`): bfloat16 ones, or
                 float32 ones with a float32 ``xg0``.
    cell_clip, proj_clip: clip values, None or 0 for none.
    h0, c0:      [L, B, 2P], [L, B, 2C] initial states ([forward | backward]), or None (zeros).
    tuning:      CPU: ``[gemv_rows_in_turn, gemv_rows_concurrent, concurrent_min_rows]``, how the kernel
                 runs its GEMMs and threads (csrc/cpu/tuning.h; :mod:`elmo_fast.tuning.calibration`
                 measures it), None for the defaults. The same values either way, to float rounding.
    returns      outputs [L, B, T, 2P] (exactly 0 at t >= lengths[b]), h [L, B, 2P], c [L, B, 2C]
                 (each row's state after its last step; a row of length 0 keeps its initial state).
    """
    if (
        _first_use_hook is not None
        and (twin := _first_use_hook("bilstm", xg0, _schedule(weights[1] if len(weights) > 1 else None, None, tuning)))
        is not None
    ):
        return twin(xg0, token_index, lengths, weights, cell_clip, proj_clip, h0, c0)
    _require_kernels_for(xg0, token_index)
    return torch.ops.elmo_fast.bilstm.default(
        xg0, token_index, lengths, list(weights), cell_clip, proj_clip, h0, c0, tuning
    )


def _require_training_kernels(op: str, *tensors: Tensor | None) -> None:
    """The training ops on CUDA tensors need a build with them (:data:`HAS_CUDA_BACKWARD`): a clear
    error instead of the dispatcher's."""
    require_extension()
    if not HAS_CUDA_BACKWARD and any(t is not None and t.is_cuda for t in tensors):
        raise NotImplementedError(
            f"elmo_fast: {op} has no CUDA kernel in this build ({_no_cuda_training_why()}); "
            "run it on CPU tensors (its reference twin in elmo_fast.bilm.reference runs "
            "anywhere, under autograd)"
        )


def _no_cuda_backward(op: str, *tensors: Tensor | None) -> None:
    """Backward formulas on CUDA tensors need the CUDA training ops (:data:`HAS_CUDA_BACKWARD`)."""
    if not HAS_CUDA_BACKWARD and any(t is not None and t.is_cuda for t in tensors):
        raise NotImplementedError(
            f"elmo_fast: {op} has no CUDA backward in this build ({_no_cuda_training_why()}): "
            f"train on CPU tensors, or run elmo_fast.bilm.reference.{op}_ref (plain PyTorch "
            "autograd) on the GPU"
        )


def _no_cuda_training_why() -> str:
    reason = cuda_kernels_missing_reason()
    if reason is not None:
        return reason
    return (
        "elmo_fast._C has CUDA kernels but not the training ops: it was built from older sources; rebuild it "
        "with `pip install --no-build-isolation -e .`"
    )


def to_device_async(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` without waiting for the GPU: a CPU tensor goes to CUDA through pinned memory,
    ``non_blocking`` (a copy from pageable memory would synchronize the host with the device)."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def lstm_layer(
    xg: Tensor,
    lengths: Tensor,
    w_hh: Tensor,
    w_proj: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
    token_index: Tensor | None = None,
    tuning: list[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One projected LSTM layer, both directions in one call, differentiable (CPU and CUDA).

    Twin of :func:`elmo_fast.bilm.reference.lstm_layer_pair_ref` (same semantics and signature); its
    backward is backpropagation through time in C++ (``lstm_layer_backward``), giving gradients for
    xg, w_hh, w_proj, h0 and c0. Clips have zero gradient where they bind (gradient passes where
    -clip <= x <= clip, as torch.clamp and TensorFlow's clip_by_value).

    xg:      [2, B, T, 4C] input gates x W_ih^T + bias (forget-gate bias already +1), gates i, f, g, o;
             direction 0 runs forward in time, 1 from each row's own last token back to its first;
             positions t >= lengths[b] are never read. float32 or float64, any strides (a last dim
             that is not unit-stride is copied once).
    lengths: [B] int64 in [0, T], any order. The schedule is made on the host: for CUDA tensors, give
             lengths (and token_index) on the CPU, else they are copied there (a device sync).
    w_hh:    [2, 4C, P]; w_proj: [2, P, C], xg's dtype.
    cell_clip, proj_clip: clip values, None or 0 for none.
    h0, c0:  [2, B, P], [2, B, C] initial states, or None (zeros).
    token_index: None, or [B, T] int64: then xg is [2, U, 4C] and position (b, t < lengths[b]) reads
             xg's row token_index[b, t] (as :func:`bilstm`'s xg0; rows may repeat). A training stack
             passes its gates packed this way, one row per real token, with no padded copy; the
             gradient of xg then has that shape too.
    tuning:  as :func:`bilstm`'s (CPU; the forward's also serves its backward).
    returns  y [2, B, T, P] (exactly 0 at padding), h [2, B, P], c [2, B, C] (each row's state after
             its last step; a row of length 0 keeps its initial state).

    The forward keeps what the backward reads (~(6C + P) values per token and direction), also
    under no_grad: for inference, :func:`bilstm` is the fast path.
    """
    if (
        _first_use_hook is not None
        and (twin := _first_use_hook("lstm_layer", xg, _schedule(None, None, tuning))) is not None
    ):
        return twin(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0, token_index)
    _require_training_kernels("lstm_layer", xg, w_hh, w_proj, h0, c0)
    y, h, c, _saved = torch.ops.elmo_fast.lstm_layer_forward.default(
        xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0, token_index, tuning
    )
    return y, h, c


def dropout_masks(
    shape: tuple[int, ...] | torch.Size, num_layers: int, dropout: float, generator=None, device=None, dtype=None
) -> list[Tensor]:
    """Fresh masks for :func:`bilstm_train`: ``num_layers`` tensors of ``shape`` ([2, B, T, P]), each
    element 0 with probability ``dropout``, else ``1 / (1 - dropout)`` (TensorFlow's dropout)."""
    keep = 1.0 - dropout
    return [
        torch.empty(shape, device=device, dtype=dtype).bernoulli_(keep, generator=generator).div_(keep)
        for _ in range(num_layers)
    ]


def bilstm_train(
    x: Tensor,
    lengths: Tensor,
    weights: list[Tensor],
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = True,
    masks: list[Tensor] | None = None,
    tuning: list[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """ELMo's stacked biLSTM for training (twin of :func:`elmo_fast.bilm.reference.bilstm_train_ref`).

    The recurrence of every layer is :func:`lstm_layer` (both directions, backward in C++); the input
    gates of each layer are one batched GEMM over the non-padding positions (under autograd), and
    layers >= 1 add their input (skip connections). Dropout as bilm-tf trains: every LSTM cell is
    wrapped in ``DropoutWrapper(input_keep_prob=1 - dropout)`` (outside the ``ResidualWrapper`` of
    layers >= 1), so each layer's input is dropped, per direction, per position and element, and
    the skip connection adds the *dropped* input: ``y_l = lstm_l(drop(x_l)) + drop(x_l)``. bilm-tf
    also drops the top layer's outputs before its softmax: that belongs to the loss, not here.

    x:        [B, T, P] layer 0's input at every position (the token vectors, read by both directions),
              or [2, B, T, P], one per direction. Positions t >= lengths[b] are never read.
    lengths:  [B] int64 in [0, T], any order.
    weights:  8L tensors as :func:`elmo_fast.bilm.reference.bilstm_ref` takes them, weights[4 * (2l + d) + k]:
              w_ih [4C, P], w_hh [4C, P], bias [4C] (forget-gate bias already +1), w_proj [P, C]; here
              layer 0's w_ih and bias are used too (x is not yet projected).
    cell_clip, proj_clip: clip values, None or 0 for none.
    h0, c0:   [L, B, 2P], [L, B, 2C] initial states ([forward | backward]), or None (zeros).
    dropout:  the probability of dropping an input element, when ``training``.
    masks:    L tensors [2, B, T, P] multiplying each layer's input (0 or 1 / (1 - dropout), see
              :func:`dropout_masks`) instead of fresh random ones; for tests and replays.
    tuning:   :func:`lstm_layer`'s, for every layer (CPU).
    returns   outputs [L, B, T, 2P] (0 at padding), h [L, B, 2P], c [L, B, 2C] (each row's state after
              its last step), as :func:`bilstm`.
    """
    if (
        _first_use_hook is not None
        and (twin := _first_use_hook("bilstm_train", x, _schedule(None, None, tuning))) is not None
    ):
        return twin(x, lengths, weights, cell_clip, proj_clip, h0, c0, dropout, training, masks)
    num_layers = len(weights) // 8
    P, C = weights[3].shape
    B, T = x.shape[-3], x.shape[-2]
    inputs = x.expand(2, B, T, P) if x.dim() == 3 else x
    if masks is None and training and dropout > 0:
        masks = dropout_masks((2, B, T, P), num_layers, dropout, device=x.device, dtype=x.dtype)
    elif masks is not None and not training:
        masks = None
    # The positions that are not padding, as rows of [B * T]: the input GEMMs run over those N rows
    # only, and lstm_layer reads its gates from them packed (token_index: position -> packed row).
    # Worked out on the host, where the layers' schedules are made (lengths on a GPU are copied to the
    # host once here, a device sync, rather than by every layer).
    lengths = lengths.cpu()
    valid = torch.arange(T) < lengths[:, None]
    rows_host = valid.reshape(-1).nonzero().squeeze(1)
    token_index = torch.zeros(B, T, dtype=torch.long)
    token_index[valid] = torch.arange(rows_host.shape[0])
    rows = to_device_async(rows_host, x.device)
    outputs, hs, cs = [], [], []
    for layer in range(num_layers):
        w = weights[8 * layer : 8 * layer + 8]
        layer_in = inputs * masks[layer] if masks is not None else inputs
        packed = layer_in.reshape(2, B * T, P).index_select(1, rows)  # [2, N, P]
        gates = torch.baddbmm(
            torch.stack([w[2], w[6]]).unsqueeze(1), packed, torch.stack([w[0], w[4]]).transpose(1, 2)
        )  # [2, N, 4C]
        gates = gates.to(w[1].dtype)  # under autocast (bf16 training): the recurrence keeps the weights' dtype
        y, h, c = lstm_layer(
            gates,
            lengths,
            torch.stack([w[1], w[5]]),
            torch.stack([w[3], w[7]]),
            cell_clip,
            proj_clip,
            None if h0 is None else h0[layer].view(B, 2, P).transpose(0, 1),
            None if c0 is None else c0[layer].view(B, 2, C).transpose(0, 1),
            token_index,
            tuning,
        )
        if layer > 0:
            y = y + layer_in
        inputs = y
        outputs.append(y)
        hs.append(h)
        cs.append(c)
    return (
        torch.stack(outputs).permute(0, 2, 3, 1, 4).reshape(num_layers, B, T, 2 * P),
        torch.stack(hs).transpose(1, 2).reshape(num_layers, B, 2 * P),
        torch.stack(cs).transpose(1, 2).reshape(num_layers, B, 2 * C),
    )


if HAS_EXTENSION:

    @torch.library.register_fake("elmo_fast::highway")
    def _highway_fake(x, highway_weights, highway_biases, proj_weight, proj_bias, gemv_max_rows=None):
        torch._check(x.dim() == 2, lambda: "highway: x must have 2 dims")
        torch._check(
            proj_weight.dim() == 2 and proj_weight.shape[1] == x.shape[1], lambda: "highway: proj_weight must be [P, F]"
        )
        return x.new_empty((x.shape[0], proj_weight.shape[0]))

    @torch.library.register_fake("elmo_fast::linear")
    def _linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None, gemv_max_rows: int | None = None) -> Tensor:
        packed = weight.dim() == 4 and weight.shape[3] == (2 if weight.dtype == torch.bfloat16 else 1)
        N, K = (weight.shape[0] * weight.shape[2], weight.shape[1] * weight.shape[3]) if packed else tuple(weight.shape)
        torch._check(x.dim() == 2 and (packed or weight.dim() == 2), lambda: "linear: x and weight must have 2 dims")
        torch._check(x.shape[1] == K, lambda: "linear: x [n, K] and weight [N, K] must have the same K")
        torch._check(packed or x.dtype == weight.dtype, lambda: "linear: x and weight must have the same dtype")
        torch._check(bias is None or tuple(bias.shape) == (N,), lambda: "linear: bias must be [N]")
        return x.new_empty((x.shape[0], N))

    @torch.library.register_fake("elmo_fast::pack_weight")
    def _pack_weight_fake(weight: Tensor) -> Tensor:
        g = 2 if weight.dtype == torch.bfloat16 else 1
        torch._check(
            weight.dim() == 2 and weight.shape[0] % 16 == 0 and weight.shape[1] % g == 0,
            lambda: "pack_weight: weight [N, K] must have N a multiple of 16 (and K even in bfloat16)",
        )
        N, K = weight.shape
        nb = 64 if N % 64 == 0 else 32 if N % 32 == 0 else 16
        return weight.new_empty((N // nb, K // g, nb, g))

    # backward returns one value per argument the op was called with, and the dispatcher drops
    # trailing arguments equal to their defaults (setup_context sees them filled back in): the
    # formulas below give their gradients for the leading arguments, padded or cut to the arguments
    # given, which ctx.needs_input_grad has one entry for.
    def _grads(ctx, *grads):
        given = len(ctx.needs_input_grad)
        return (*grads, *[None] * (given - len(grads)))[:given]

    def _linear_setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs[:3]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    def _linear_backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad.mm(weight) if ctx.needs_input_grad[0] else None
        grad_weight = grad.t().mm(x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return _grads(ctx, grad_x, grad_weight, grad_bias)

    torch.library.register_autograd("elmo_fast::linear", _linear_backward, setup_context=_linear_setup_context)

    @torch.library.register_fake("elmo_fast::highway_gate")
    def _highway_gate_fake(projected: Tensor, x: Tensor) -> Tensor:
        torch._check(projected.dim() == 2 and x.dim() == 2, lambda: "highway_gate: projected and x must have 2 dims")
        torch._check(projected.shape[0] == x.shape[0], lambda: "highway_gate: projected and x must have the same N")
        torch._check(projected.shape[1] == 2 * x.shape[1], lambda: "highway_gate: projected must be [N, 2H]")
        torch._check(projected.dtype == x.dtype, lambda: "highway_gate: projected and x must have the same dtype")
        return x.new_empty(x.shape)

    def _check_char_cnn_args(
        char_ids: Tensor,
        char_embedding: Tensor,
        conv_weights: list[Tensor],
        conv_biases: list[Tensor],
        activation: str,
        op: str = "char_cnn",
    ) -> None:
        # The kernels' rule, in their words (csrc/cpu/char_cnn_cpu.cpp, csrc/char_cnn_args.h): L >= 1,
        # 1 <= w_k <= L.
        torch._check(char_ids.dim() == 2, lambda: f"{op}: char_ids must have 2 dims, got {char_ids.dim()}")
        L = char_ids.shape[1]
        torch._check(
            L >= 1,
            lambda: (
                f"{op}: char_ids must have at least one character id per token (shape [N, L]), "
                f"got shape {list(char_ids.shape)}"
            ),
        )
        torch._check(char_embedding.dim() == 2, lambda: "char_cnn: char_embedding must be [V, D]")
        torch._check(
            len(conv_weights) == len(conv_biases) and len(conv_weights) > 0,
            lambda: "char_cnn: conv_weights and conv_biases must have the same, non-zero length",
        )
        for k, (w, b) in enumerate(zip(conv_weights, conv_biases)):
            torch._check(
                w.dim() == 3 and w.shape[1] == char_embedding.shape[1],
                lambda: "char_cnn: conv_weights[k] must be [n_k, D, w_k]",
            )
            torch._check(
                w.shape[2] >= 1 and w.shape[2] <= L,
                lambda: (
                    f"{op}: conv_weights[{k}] must have a width in 1..{L} (the characters per token of char_ids, "
                    f"{list(char_ids.shape)}), got shape {list(w.shape)}"
                ),
            )
            torch._check(b.dim() == 1 and b.shape[0] == w.shape[0], lambda: "char_cnn: conv_biases[k] must be [n_k]")
        torch._check(activation in ("relu", "tanh"), lambda: "char_cnn: activation must be 'relu' or 'tanh'")

    @torch.library.register_fake("elmo_fast::char_cnn")
    def _char_cnn_fake(
        char_ids: Tensor, char_embedding: Tensor, conv_weights: list[Tensor], conv_biases: list[Tensor], activation: str
    ) -> Tensor:
        _check_char_cnn_args(char_ids, char_embedding, conv_weights, conv_biases, activation)
        return char_embedding.new_empty((char_ids.shape[0], sum(w.shape[0] for w in conv_weights)))

    @torch.library.register_fake("elmo_fast::bilstm")
    def _bilstm_fake(
        xg0: Tensor,
        token_index: Tensor,
        lengths: Tensor,
        weights: list[Tensor],
        cell_clip: float | None,
        proj_clip: float | None,
        h0: Tensor | None,
        c0: Tensor | None,
        tuning: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        torch._check(
            len(weights) > 0 and len(weights) % 8 == 0, lambda: "bilstm: weights must hold 8 tensors per layer"
        )
        torch._check(
            xg0.dim() == 3 and token_index.dim() == 2 and lengths.dim() == 1,
            lambda: "bilstm: xg0, token_index and lengths must have 3, 2 and 1 dims",
        )
        num_layers = len(weights) // 8
        w = weights[3]
        P, C = (w.shape[0] * w.shape[2], w.shape[1] * w.shape[3]) if w.dim() == 4 else w.shape
        B, T = token_index.shape
        torch._check(xg0.shape[1] == 2 and xg0.shape[2] == 4 * C, lambda: "bilstm: xg0 must be [U, 2, 4C]")
        torch._check(lengths.shape[0] == B, lambda: "bilstm: lengths must be [B]")
        return (
            xg0.new_empty(num_layers, B, T, 2 * P),
            xg0.new_empty(num_layers, B, 2 * P),
            xg0.new_empty(num_layers, B, 2 * C),
        )

    @torch.library.register_fake("elmo_fast::lstm_layer_forward")
    def _lstm_layer_forward_fake(
        xg: Tensor,
        lengths: Tensor,
        w_hh: Tensor,
        w_proj: Tensor,
        cell_clip: float | None,
        proj_clip: float | None,
        h0: Tensor | None,
        c0: Tensor | None,
        token_index: Tensor | None = None,
        tuning: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        torch._check(w_proj.dim() == 3 and w_proj.shape[0] == 2, lambda: "lstm_layer_forward: w_proj must be [2, P, C]")
        P, C = w_proj.shape[1], w_proj.shape[2]
        torch._check(lengths.dim() == 1, lambda: "lstm_layer_forward: lengths must be [B]")
        B = lengths.shape[0]
        if token_index is None:
            torch._check(
                xg.dim() == 4 and xg.shape[0] == 2 and xg.shape[1] == B and xg.shape[3] == 4 * C,
                lambda: "lstm_layer_forward: xg must be [2, B, T, 4C]",
            )
            T = xg.shape[2]
        else:
            torch._check(
                xg.dim() == 3 and xg.shape[0] == 2 and xg.shape[2] == 4 * C,
                lambda: "lstm_layer_forward: xg with token_index must be [2, U, 4C]",
            )
            torch._check(
                token_index.dim() == 2 and token_index.shape[0] == B,
                lambda: "lstm_layer_forward: token_index must be [B, T]",
            )
            T = token_index.shape[1]
        # saved holds one row per token (N = sum of lengths): a size known only from the data
        N = torch.library.get_ctx().new_dynamic_size()
        return (xg.new_empty(2, B, T, P), xg.new_empty(2, B, P), xg.new_empty(2, B, C), xg.new_empty(2, N, 6 * C + P))

    @torch.library.register_fake("elmo_fast::lstm_layer_backward")
    def _lstm_layer_backward_fake(
        grad_y: Tensor | None,
        grad_h: Tensor | None,
        grad_c: Tensor | None,
        saved: Tensor,
        lengths: Tensor,
        token_index: Tensor | None,
        xg_size: list[int],
        w_hh: Tensor,
        w_proj: Tensor,
        cell_clip: float | None,
        proj_clip: float | None,
        h0: Tensor | None,
        c0: Tensor | None,
        tuning: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        torch._check(
            saved.dim() == 3 and saved.shape[0] == 2, lambda: "lstm_layer_backward: saved must be [2, N, 6C + P]"
        )
        B = lengths.shape[0]
        P, C = w_proj.shape[1], w_proj.shape[2]
        return (
            saved.new_empty(xg_size),
            saved.new_empty(2, 4 * C, P),
            saved.new_empty(2, P, C),
            saved.new_empty(2, B, P),
            saved.new_empty(2, B, C),
        )

    def _lstm_layer_setup_context(ctx, inputs, output) -> None:
        xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0 = inputs[:8]
        token_index = inputs[8] if len(inputs) > 8 else None
        tuning = inputs[9] if len(inputs) > 9 else None
        saved = output[3]
        ctx.mark_non_differentiable(saved)
        # An unused y, h or c comes as None, not as a tensor of zeros to be read.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(saved, lengths, w_hh, w_proj, h0, c0, token_index)
        ctx.clips = (cell_clip, proj_clip)
        ctx.tuning = tuning
        ctx.xg_size = xg.shape

    def _lstm_layer_backward(ctx, grad_y, grad_h, grad_c, _grad_saved):
        saved, lengths, w_hh, w_proj, h0, c0, token_index = ctx.saved_tensors
        _no_cuda_backward("lstm_layer", saved)
        grad_xg, grad_w_hh, grad_w_proj, grad_h0, grad_c0 = torch.ops.elmo_fast.lstm_layer_backward.default(
            grad_y,
            grad_h,
            grad_c,
            saved,
            lengths,
            token_index,
            ctx.xg_size,
            w_hh,
            w_proj,
            *ctx.clips,
            h0,
            c0,
            ctx.tuning,
        )
        need = ctx.needs_input_grad
        return _grads(
            ctx,
            grad_xg if need[0] else None,
            None,
            grad_w_hh if need[2] else None,
            grad_w_proj if need[3] else None,
            None,
            None,
            grad_h0 if need[6] else None,
            grad_c0 if need[7] else None,
        )

    torch.library.register_autograd(
        "elmo_fast::lstm_layer_forward", _lstm_layer_backward, setup_context=_lstm_layer_setup_context
    )

    # --- autograd of the char CNN and the highway: backward kernels on CPU ---------------------------

    def _strided_like(grad: Tensor, param: Tensor) -> Tensor:
        """grad with param's strides. The kernel's gradient of a width-1 filter [n, D, 1] comes back with
        another stride on its size-1 dimension: the same memory, but DistributedDataParallel compares
        strides literally, warns, and copies every gradient into its buckets one by one."""
        if grad.stride() == param.stride() or not (grad.is_contiguous() and param.is_contiguous()):
            return grad
        return grad.as_strided(param.shape, param.stride())

    @torch.library.register_fake("elmo_fast::char_cnn_backward")
    def _char_cnn_backward_fake(grad_out, char_ids, char_embedding, conv_weights, conv_biases, activation):
        _check_char_cnn_args(char_ids, char_embedding, conv_weights, conv_biases, activation, "char_cnn_backward")
        return (
            char_embedding.new_empty(char_embedding.shape),
            [w.new_empty(w.shape) for w in conv_weights],
            [b.new_empty(b.shape) for b in conv_biases],
        )

    def _char_cnn_setup_context(ctx, inputs, output) -> None:
        char_ids, char_embedding, conv_weights, conv_biases, activation = inputs
        ctx.save_for_backward(char_ids, char_embedding, *conv_weights, *conv_biases)
        ctx.num_convs = len(conv_weights)
        ctx.activation = activation

    def _char_cnn_backward(ctx, grad):
        char_ids, char_embedding, *convs = ctx.saved_tensors
        _no_cuda_backward("char_cnn", char_embedding)
        K = ctx.num_convs
        grad_embedding, grad_weights, grad_biases = torch.ops.elmo_fast.char_cnn_backward.default(
            grad, char_ids, char_embedding, convs[:K], convs[K:], ctx.activation
        )
        need = ctx.needs_input_grad
        weights = convs[:K]
        return (
            None,
            grad_embedding if need[1] else None,
            [_strided_like(g, w) if n else None for g, w, n in zip(grad_weights, weights, need[2])],
            [g if n else None for g, n in zip(grad_biases, need[3])],
            None,
        )

    torch.library.register_autograd("elmo_fast::char_cnn", _char_cnn_backward, setup_context=_char_cnn_setup_context)

    @torch.library.register_fake("elmo_fast::highway_gate_backward")
    def _highway_gate_backward_fake(grad: Tensor, projected: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        return projected.new_empty(projected.shape), x.new_empty(x.shape)

    def _highway_gate_setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    def _highway_gate_backward(ctx, grad):
        projected, x = ctx.saved_tensors
        _no_cuda_backward("highway_gate", x)
        grad_projected, grad_x = torch.ops.elmo_fast.highway_gate_backward.default(grad, projected, x)
        need = ctx.needs_input_grad
        return grad_projected if need[0] else None, grad_x if need[1] else None

    torch.library.register_autograd(
        "elmo_fast::highway_gate", _highway_gate_backward, setup_context=_highway_gate_setup_context
    )

    def _highway_setup_context(ctx, inputs, output) -> None:
        x, highway_weights, highway_biases, proj_weight, proj_bias = inputs[:5]
        ctx.save_for_backward(x, *highway_weights, *highway_biases, proj_weight, proj_bias)
        ctx.num_layers = len(highway_weights)

    def _highway_backward(ctx, grad):
        # The op keeps nothing but its output: each layer's input and [transform | gate] are recomputed
        # here (one more forward's GEMMs). ops.highway avoids that when training (see there).
        x, *rest = ctx.saved_tensors
        _no_cuda_backward("highway", x)
        L = ctx.num_layers
        weights, biases, proj_weight = rest[:L], rest[L : 2 * L], rest[2 * L]
        layer_inputs, projected = [], []
        for w, b in zip(weights, biases):
            layer_inputs.append(x)
            projected.append(torch.addmm(b, x, w.t()))
            x = torch.ops.elmo_fast.highway_gate.default(projected[-1], x)
        grad_proj_weight, grad_proj_bias = grad.t().mm(x), grad.sum(0)
        g = grad.mm(proj_weight)
        grad_weights, grad_biases = [None] * L, [None] * L
        for k in reversed(range(L)):
            grad_projected, grad_x = torch.ops.elmo_fast.highway_gate_backward.default(g, projected[k], layer_inputs[k])
            grad_weights[k] = grad_projected.t().mm(layer_inputs[k])
            grad_biases[k] = grad_projected.sum(0)
            g = grad_x.addmm_(grad_projected, weights[k])
        return _grads(ctx, g, grad_weights, grad_biases, grad_proj_weight, grad_proj_bias)

    torch.library.register_autograd("elmo_fast::highway", _highway_backward, setup_context=_highway_setup_context)
