"""An op's reference twin, called as the op is: the path an op takes for the rest of a process once it
failed its first-use self-check on a device (:mod:`elmo_fast.verification.first_use`, ``ELMO_FAST_SELFCHECK``).

The twins of :mod:`elmo_fast.bilm.reference` take the ops' signatures, one floating dtype and one
device for all their inputs. The ops also take a few forms the twins do not, adapted here:

* lengths (and token_index) on the CPU beside CUDA tensors (the ops plan on the host): every CPU
  tensor goes to the device of the op's main input;
* low-precision floats (bf16, fp16), mixed with float32 where an op takes that (the CPU bilstm's bf16
  weights beside fp32 gates): every floating input is computed with in float32, and the outputs come
  back in the dtype the op gives (its main input's);
* lstm_layer's gates packed by token_index ([2, U, 4C]): unpacked to [2, B, T, 4C] for the twin;
* GEMM weights packed for the CPU's BRGeMM (:func:`~elmo_fast.bilm.ops.pack_weight`, [N/nb, K/g, nb, g];
  linear's weight, bilstm's weights): unpacked to [N, K].

The twins are plain PyTorch under autograd: a fallen-back op stays differentiable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..bilm import reference


def _lstm_layer_twin(
    xg: Tensor,
    lengths: Tensor,
    w_hh: Tensor,
    w_proj: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
    token_index: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if token_index is not None:  # [2, U, 4C] read at token_index[b, t]; padding positions are never read
        xg = xg[:, token_index.clamp(0, max(xg.shape[1] - 1, 0))]
    return reference.lstm_layer_pair_ref(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0, c0)


def unpack_weight(weight: Tensor) -> Tensor:
    """A weight packed by :func:`~elmo_fast.bilm.ops.pack_weight` back to [N, K] (a plain one as it is)."""
    if weight.dim() != 4:
        return weight
    n_blocks, k_groups, nb, g = weight.shape
    return weight.permute(0, 2, 1, 3).reshape(n_blocks * nb, k_groups * g)


def _linear_twin(x: Tensor, weight: Tensor, bias: Tensor | None = None, gemv_max_rows: int | None = None) -> Tensor:
    return reference.linear_ref(x, unpack_weight(weight), bias)


def _layer0_gates_twin(tokens: Tensor, weights: list[Tensor], gemv_max_rows: int | None = None) -> Tensor:
    return reference.layer0_gates_ref(tokens, weights)


def _bilstm_twin(
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
    return reference.bilstm_ref(
        xg0, token_index, lengths, [unpack_weight(w) for w in weights], cell_clip, proj_clip, h0, c0
    )


#: the twin each op falls back to, by the op's name in elmo_fast.bilm.ops
TWINS: dict[str, Callable[..., Any]] = {
    "char_cnn": reference.char_cnn_ref,
    "highway_gate": reference.highway_gate_ref,
    "highway": reference.highway_ref,
    "linear": _linear_twin,
    "layer0_gates": _layer0_gates_twin,
    "bilstm": _bilstm_twin,
    "lstm_layer": _lstm_layer_twin,
    "bilstm_train": reference.bilstm_train_ref,
}

_LOW = (torch.bfloat16, torch.float16)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        if value.device != device:
            value = value.to(device)
        return value.float() if value.dtype in _LOW else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _back(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, tuple):
        return tuple(_back(v, dtype) for v in value)
    return value


def call_twin(op: str, like: Tensor, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` computed by its twin; ``like`` is the op's main input (the tensor the
    self-check hook was given), whose device the inputs go to and whose dtype the outputs take."""
    device, dtype = like.device, like.dtype
    out = TWINS[op](*_to(args, device), **{k: _to(v, device) for k, v in kwargs.items()})
    return _back(out, dtype)
