"""The biLM as bilm-tf trains it: the inference architecture (:class:`~elmo_fast.bilm.ElmoBiLm`)
with dropout on every LSTM layer's input and on the top outputs, and one softmax shared by the
forward and the backward language model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..bilm.model import ElmoBiLm
from ..formats.bilm_tf import ElmoOptions, ElmoWeights, LstmWeights
from .softmax import LogUniformSampler, SoftmaxHead


def initial_weights(options: ElmoOptions, generator: torch.Generator | None = None) -> ElmoWeights:
    """Random weights as bilm-tf initialises a model (bilm/training.py), in torch layout.

    char embedding U(-1, 1); convolutions U(-0.05, 0.05) for relu (Kim et al.), N(0, 1/sqrt(w D))
    for tanh, biases 0; highway kernels N(0, 1/sqrt(F)), carry bias -2 (the gate starts by carrying
    x through), transform bias 0; projection N(0, 1/sqrt(F)), bias 0; LSTM kernels Glorot-uniform
    over TensorFlow's [In + P, 4C] and [C, P] shapes (TF1's default initializer), biases 0 (the
    forget gate's +1 is TensorFlow's run-time forget_bias, folded in here as the loader does).
    """
    o = options
    g = generator
    F_, P, C, D = o.n_filters, o.projection_dim, o.cell_dim, o.char_dim

    def uniform(shape, limit):
        return (torch.rand(shape, generator=g) * 2 - 1) * limit

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    char_embedding = torch.zeros(262, D)  # row 0: "no token" (allennlp's +1 shift), never trained
    char_embedding[1:] = uniform((261, D), 1.0)
    conv_w, conv_b = [], []
    for width, num in o.filters:
        conv_w.append(
            uniform((num, D, width), 0.05)
            if o.activation == "relu"
            else normal((num, D, width), math.sqrt(1.0 / (width * D)))
        )
        conv_b.append(torch.zeros(num))
    hw_w, hw_b = [], []
    for _ in range(o.n_highway):
        w_carry, w_transform = normal((F_, F_), math.sqrt(1.0 / F_)), normal((F_, F_), math.sqrt(1.0 / F_))
        # torch layout: [W_transform^T; -W_carry^T], [b_transform; -b_carry]
        hw_w.append(torch.cat([w_transform.T, -w_carry.T]).contiguous())
        hw_b.append(torch.cat([torch.zeros(F_), torch.full((F_,), 2.0)]))
    proj_w = normal((P, F_), math.sqrt(1.0 / F_))
    lstm = []
    kernel_limit = math.sqrt(6.0 / (2 * P + 4 * C))
    proj_limit = math.sqrt(6.0 / (C + P))
    for _ in range(o.n_layers):
        pair = []
        for _ in range(2):
            bias = torch.zeros(4 * C)
            bias[C : 2 * C] = 1.0  # torch gate order i, f, g, o: forget_bias=1
            pair.append(
                LstmWeights(
                    w_ih=uniform((4 * C, P), kernel_limit),
                    w_hh=uniform((4 * C, P), kernel_limit),
                    bias=bias,
                    w_proj=uniform((P, C), proj_limit),
                )
            )
        lstm.append(tuple(pair))
    return ElmoWeights(
        options=o,
        char_embedding=char_embedding,
        conv_weights=conv_w,
        conv_biases=conv_b,
        highway_weights=hw_w,
        highway_biases=hw_b,
        proj_weight=proj_w,
        proj_bias=torch.zeros(P),
        lstm=lstm,
    )


@dataclass
class Batch:
    """One training batch.

    char_ids:    [B, T, 50] every token's character ids, ``<S>``/``</S>`` (sentence mode) included;
                 positions t >= lengths[b] are padding.
    lengths:     [B] tokens per row.
    fwd_targets: [B, T] the id the forward LM predicts at each position; bwd_targets likewise for
                 the backward LM. -1 where nothing is predicted (padding, and the boundaries that
                 have no next / previous token in sentence mode).
    """

    char_ids: Tensor
    lengths: Tensor
    fwd_targets: Tensor
    bwd_targets: Tensor
    #: [B, T, 50] the backward LM's own inputs (unrolled windows), or None: it reads ``char_ids``
    bwd_char_ids: Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        """The batch on ``device`` (itself on the CPU; copies queued without waiting elsewhere)."""
        if device.type == "cpu":
            return self
        return Batch(
            *(
                None if t is None else t.to(device, non_blocking=True)
                for t in (self.char_ids, self.lengths, self.fwd_targets, self.bwd_targets, self.bwd_char_ids)
            )
        )


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper (the model itself when it has none)."""
    return getattr(model, "module", model)


class BidirectionalLM(nn.Module):
    """``bilm`` (an :class:`ElmoBiLm`) + ``softmax``, with bilm-tf's dropout placement.

    ``forward(batch, states)`` returns per-direction summed cross-entropies and target counts,
    plus the final LSTM states (for the stateful ``--unroll-steps`` scheme).
    """

    def __init__(
        self, bilm: ElmoBiLm, softmax: SoftmaxHead, dropout: float = 0.1, negative_samples: int = 8192
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if bilm.options.projection_dim != softmax.weight.shape[1]:
            raise ValueError(
                f"the softmax is [{softmax.vocab_size}, {softmax.weight.shape[1]}], but the biLM's "
                f"outputs have {bilm.options.projection_dim} dims"
            )
        self.bilm = bilm
        self.softmax = softmax
        self.dropout = dropout
        self.negative_samples = negative_samples
        self.sampler = LogUniformSampler(softmax.vocab_size)

    def top_outputs(
        self, batch: Batch, h0: Tensor | None = None, c0: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Forward and backward top-layer outputs [B, T, P] (dropped out in training), final h, c."""
        bilm = self.bilm
        ids = batch.char_ids if batch.bwd_char_ids is None else torch.stack([batch.char_ids, batch.bwd_char_ids])
        W = ids.shape[-1]
        # each distinct token (padding included) once through the char CNN, highway and projection
        distinct, inverse = torch.unique(ids.reshape(-1, W), dim=0, return_inverse=True)
        vectors = bilm.token_embedder(distinct)
        x = vectors[inverse].view(*ids.shape[:-1], -1)
        p = self.dropout if self.training else 0.0
        outputs, h, c = bilm.encoder.forward_sequence(x, batch.lengths, h0, c0, bilm.encoder.input_masks(x, p))
        top = outputs[-1]
        P = bilm.options.projection_dim
        fwd, bwd = top[..., :P], top[..., P:]
        if p > 0:
            fwd, bwd = F.dropout(fwd, p), F.dropout(bwd, p)
        return fwd, bwd, h, c

    def forward(
        self,
        batch: Batch,
        h0: Tensor | None = None,
        c0: Tensor | None = None,
        sample_generator: torch.Generator | None = None,
        full_softmax: bool | None = None,
    ):
        """Losses of one batch: ``(fwd_sum, bwd_sum, fwd_count, bwd_count, h, c)``, the sums of the
        per-target cross-entropies of each direction. Training (and unless ``full_softmax``) uses
        the sampled softmax, one draw of negatives per direction, as bilm-tf; evaluation the full one."""
        fwd, bwd, h, c = self.top_outputs(batch, h0, c0)
        use_full = (not self.training) if full_softmax is None else full_softmax
        sums, counts = [], []
        for out, targets in ((fwd, batch.fwd_targets), (bwd, batch.bwd_targets)):
            keep = targets >= 0
            rows, tgt = out[keep], targets[keep]
            if use_full:
                losses = self.softmax.full_loss(rows, tgt)
            else:
                sampled, tries = self.sampler.sample(self.negative_samples, sample_generator)
                n = sampled.numel()
                sampled = sampled.to(rows.device)
                losses = self.softmax.sampled_loss(
                    rows,
                    tgt,
                    sampled,
                    self.sampler.expected_count(sampled.cpu(), tries, n).to(rows.device),
                    self.sampler.expected_count(tgt.cpu(), tries, n).to(rows.device),
                )
            sums.append(losses.sum())
            counts.append(int(tgt.numel()))
        return sums[0], sums[1], counts[0], counts[1], h, c
