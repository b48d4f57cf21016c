"""What the biLM's weight containers share (bilm-tf's :class:`~elmo_fast.formats.bilm_tf.ElmoWeights`,
ELMoForManyLangs' :class:`~elmo_fast.formats.manylangs_dir.ManyLangsWeights`): the LSTM's weights,
and the list of every tensor and the move to a device or dtype, written once over their fields."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor


@dataclass
class LstmWeights:
    """One direction of one LSTM layer, in PyTorch layout, gates ordered i, f, g, o."""

    w_ih: Tensor  # [4C, In]
    w_hh: Tensor  # [4C, P]
    bias: Tensor  # [4C], forget-gate bias already +1
    w_proj: Tensor  # [P, C]


def _flatten(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, LstmWeights):
        return [getattr(value, f.name) for f in fields(value)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flatten(item)]
    return []  # None (a part the model has not), the options, the dictionaries


def _moved(value: Any, device: torch.device | str | None, dtype: torch.dtype | None) -> Any:
    if isinstance(value, Tensor):
        return value.to(device=device, dtype=dtype)
    if isinstance(value, LstmWeights):
        return LstmWeights(**{f.name: _moved(getattr(value, f.name), device, dtype) for f in fields(value)})
    if isinstance(value, list):
        return [_moved(item, device, dtype) for item in value]
    if isinstance(value, tuple):
        return tuple(_moved(item, device, dtype) for item in value)
    return value


class WeightsBase:
    """A dataclass of a biLM's parameters: tensors, lists of tensors, and ``lstm`` (per layer, a
    (forward, backward) pair of :class:`LstmWeights`); other fields (options, dictionaries) are
    carried along."""

    def tensors(self) -> list[Tensor]:
        """Every tensor, in field order (the LSTM's last, layer by layer, forward first)."""
        return [t for f in fields(self) for t in _flatten(getattr(self, f.name))]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """A copy with every tensor on ``device`` and of ``dtype`` (None: unchanged)."""
        return replace(
            self,
            **{
                f.name: _moved(getattr(self, f.name), device, dtype)
                for f in fields(self)
                if isinstance(getattr(self, f.name), (Tensor, LstmWeights, list, tuple))
            },
        )
