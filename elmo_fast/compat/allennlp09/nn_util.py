"""``allennlp.nn.util``'s functions on ELMo's path: sentence boundaries added and removed, a tensor's
device as allennlp numbers it."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...bilm.reference import remove_sentence_boundaries

__all__ = ["add_sentence_boundary_token_ids", "get_device_of", "remove_sentence_boundaries"]


def add_sentence_boundary_token_ids(
    tensor: Tensor, mask: Tensor, sentence_begin_token: Any, sentence_end_token: Any
) -> tuple[Tensor, Tensor]:
    """``<S>`` before and ``</S>`` after each sentence: tensor [B, T] or [B, T, D] (right-padded, as
    ``mask`` [B, T] says) -> [B, T + 2(, D)], and the new mask [B, T + 2] (long, as in allennlp 0.9:
    non-zero ids, or rows with a positive entry)."""
    lengths = mask.sum(dim=1).long()
    B, T = mask.shape[0], mask.shape[1]
    out = tensor.new_zeros(B, T + 2, *tensor.shape[2:])
    out[:, 1:-1] = tensor
    out[:, 0] = torch.as_tensor(sentence_begin_token, dtype=tensor.dtype, device=tensor.device)
    rows = torch.arange(B, device=tensor.device)
    out[rows, lengths.to(tensor.device) + 1] = torch.as_tensor(
        sentence_end_token, dtype=tensor.dtype, device=tensor.device
    )
    new_mask = (out != 0) if out.dim() == 2 else ((out > 0).long().sum(dim=-1) > 0)
    return out, new_mask.long()


def get_device_of(tensor: Tensor) -> int:
    """-1 for a tensor on the CPU, else its GPU's number."""
    return tensor.get_device() if tensor.is_cuda else -1
