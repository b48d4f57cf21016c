"""The stateless biLM as one traceable module, for export: the reference path (:mod:`elmo_fast.bilm.reference`)
with its loop over time written as a scan, so that an exported graph keeps batch and time dynamic.

``StatelessBiLm(weights)(char_ids [B, T, 50])`` returns ``layers [B, L + 1, T, 2P]`` and ``mask [B, T]``
(int64): what :meth:`ElmoBiLm.embed <elmo_fast.bilm.model.ElmoBiLm.embed>` returns, every batch from
zero states. Every stage is the reference's own function; only the driver of the LSTM's time steps
differs (:func:`lstm_layer_scan`, the twin of :func:`~elmo_fast.bilm.reference.lstm_layer_ref`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# torch's scan (a prototype in torch 2.x, not yet under a public name): a loop whose body is traced
# once, which torch.onnx's exporter writes as an ONNX Scan over a dynamic number of steps. A Python
# loop would be unrolled at the example input's length instead.
from torch._higher_order_ops.scan import scan

from ..bilm import reference
from ..formats.bilm_tf import ElmoWeights


def lstm_layer_scan(
    xg: Tensor,
    lengths: Tensor,
    w_hh: Tensor,
    w_proj: Tensor,
    h0: Tensor,
    c0: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`~elmo_fast.bilm.reference.lstm_layer_ref` (same signature, same values) as a scan over
    time: each step is :func:`~elmo_fast.bilm.reference.lstm_step_ref`.

    xg:      [B, T, 4C] input gates (T >= 1); lengths: [B] long; w_hh: [4C, P]; w_proj: [P, C].
    h0, c0:  [B, P], [B, C]; reverse: from each row's own last token back to its first.
    returns  y [B, T, P] (zero at padding), h [B, P], c [B, C].
    """
    steps = torch.arange(xg.shape[1], device=xg.device)
    active = (steps.unsqueeze(1) < lengths.unsqueeze(0)).unsqueeze(-1)  # [T, B, 1]

    def step(carry: tuple[Tensor, Tensor], inputs: tuple[Tensor, Tensor]):
        h, c = carry
        xg_t, active_t = inputs
        h, c, y = reference.lstm_step_ref(xg_t, active_t, h, c, w_hh, w_proj, cell_clip, proj_clip)
        return (h, c), y

    # the carry's strides must be the step's outputs' (a [1, P] slice of a wider tensor counts as contiguous
    # but keeps its strides: clone to the standard ones)
    init = (h0.clone(memory_format=torch.contiguous_format), c0.clone(memory_format=torch.contiguous_format))
    (h, c), y = scan(step, init, (xg.transpose(0, 1), active), reverse=reverse)
    return y.transpose(0, 1), h, c


class StatelessBiLm(nn.Module):
    """A bilm-tf model's biLM for export (see the module docstring): the weights as buffers, with
    readable names (they become the graph's initializers)."""

    def __init__(self, weights: ElmoWeights) -> None:
        super().__init__()
        o = weights.options
        self.activation = o.activation
        self.cell_clip, self.proj_clip = o.cell_clip, o.proj_clip
        self.n_convolutions, self.n_highway, self.n_layers = len(weights.conv_weights), o.n_highway, o.n_layers
        tensors = {
            "char_embedding": weights.char_embedding,
            **{f"conv_weight_{k}": w for k, w in enumerate(weights.conv_weights)},
            **{f"conv_bias_{k}": b for k, b in enumerate(weights.conv_biases)},
            **{f"highway_weight_{k}": w for k, w in enumerate(weights.highway_weights)},
            **{f"highway_bias_{k}": b for k, b in enumerate(weights.highway_biases)},
            "proj_weight": weights.proj_weight,
            "proj_bias": weights.proj_bias,
        }
        for layer, pair in enumerate(weights.lstm):
            for direction, w in zip(("forward", "backward"), pair):
                for name in ("w_ih", "w_hh", "bias", "w_proj"):
                    tensors[f"lstm_{layer}_{direction}_{name}"] = getattr(w, name)
        for name, t in tensors.items():
            self.register_buffer(name, t.detach().float().cpu().contiguous().clone())

    def _list(self, prefix: str, n: int) -> list[Tensor]:
        return [getattr(self, f"{prefix}_{k}") for k in range(n)]

    def _flat_lstm(self) -> list[Tensor]:
        return [
            getattr(self, f"lstm_{layer}_{direction}_{name}")
            for layer in range(self.n_layers)
            for direction in ("forward", "backward")
            for name in ("w_ih", "w_hh", "bias", "w_proj")
        ]

    def forward(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """char_ids [B, T, 50] (allennlp's ids, 0 past each sentence's end) -> layers [B, L + 1, T, 2P]
        (zero past each sentence's end) and mask [B, T] (int64)."""
        ids, mask = reference.add_sentence_boundaries(char_ids)
        B, T2, W = ids.shape
        cnn = reference.char_cnn_ref(
            ids.reshape(B * T2, W),
            self.char_embedding,
            self._list("conv_weight", self.n_convolutions),
            self._list("conv_bias", self.n_convolutions),
            self.activation,
        )
        tokens = reference.highway_ref(
            cnn,
            self._list("highway_weight", self.n_highway),
            self._list("highway_bias", self.n_highway),
            self.proj_weight,
            self.proj_bias,
        )
        tokens = tokens.view(B, T2, -1) * mask.unsqueeze(-1).to(tokens.dtype)
        lstm = self._flat_lstm()
        P, C = lstm[3].shape
        L = self.n_layers

        def gates(layer: int, d: int, x: Tensor, w_ih: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
            return F.linear(x, w_ih, bias), x

        outputs, _, _ = reference.stacked_bilstm_ref(
            [tokens, tokens],
            gates,
            mask.sum(dim=1),
            lstm,
            self.cell_clip,
            self.proj_clip,
            tokens.new_zeros(L, B, 2 * P),
            tokens.new_zeros(L, B, 2 * C),
            layer=lstm_layer_scan,
        )
        activations = torch.stack([torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], dim=1)
        layers, body_mask = reference.remove_sentence_boundaries(activations.transpose(1, 2), mask)
        return layers.transpose(1, 2), body_mask.long()
