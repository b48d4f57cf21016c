"""``ScalarMix``: a learned softmax-weighted sum of the biLM's layers (allennlp's ``ScalarMix``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..errors import ConfigurationError
from .reference import scalar_mix_ref


class ScalarMix(nn.Module):
    """``gamma * sum_k softmax(w)_k * layer_k``, with ``w`` [K] and ``gamma`` learned scalars.

    initial_scalar_parameters: the initial ``w`` (default zeros: an even mix); trainable=False
    freezes ``w`` and ``gamma`` (allennlp's ``scalar_mix_parameters``). do_layer_norm normalises
    each layer over the unmasked elements of the whole batch first (allennlp's semantics).

    Parameters are laid out as allennlp's (``scalar_parameters.{k}`` [1] each, ``gamma`` [1]), so
    state dicts of models trained with allennlp's ``Elmo`` load as they are. Sizes that do not match
    raise :class:`~elmo_fast.errors.ConfigurationError`, where allennlp raises its own.
    """

    def __init__(
        self,
        mixture_size: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        if mixture_size < 1:
            raise ConfigurationError(f"ScalarMix: mixture_size must be >= 1, got {mixture_size}")
        if initial_scalar_parameters is None:
            initial_scalar_parameters = [0.0] * mixture_size
        elif len(initial_scalar_parameters) != mixture_size:
            raise ConfigurationError(
                f"ScalarMix: {len(initial_scalar_parameters)} initial scalar parameters "
                f"{list(initial_scalar_parameters)} for a mixture of {mixture_size} layers"
            )
        self.mixture_size = mixture_size
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.ParameterList(
            [nn.Parameter(torch.tensor([float(v)]), requires_grad=trainable) for v in initial_scalar_parameters]
        )
        self.gamma = nn.Parameter(torch.ones(1), requires_grad=trainable)

    def forward(self, layers: Sequence[Tensor], mask: Tensor | None = None) -> Tensor:
        """layers: K tensors [..., D]; mask [...] (needed with do_layer_norm) -> [..., D]."""
        if len(layers) != self.mixture_size:
            raise ConfigurationError(f"ScalarMix: {len(layers)} layers given to a mixture of {self.mixture_size}")
        if self.do_layer_norm and mask is None:
            raise ConfigurationError("ScalarMix: do_layer_norm=True needs the mask")
        return scalar_mix_ref(
            list(layers), torch.cat(list(self.scalar_parameters)), self.gamma, mask, self.do_layer_norm
        )
