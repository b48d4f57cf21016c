"""The biLM's softmax over the vocabulary, shared by both directions (bilm-tf's ``softmax/W``
[V, P] and ``softmax/b`` [V]), with TensorFlow's sampled softmax for training and the full softmax
for evaluation.

Sampled softmax (``tf.nn.sampled_softmax_loss`` with its defaults, as bilm-tf calls it): one set of
``n`` distinct negative classes per batch from the log-uniform (Zipfian) distribution over the
frequency-sorted vocabulary, ``P(k) = log((k + 2) / (k + 1)) / log(V + 1)``; the true class's
logit and the sampled ones are corrected by the log of their expected counts (``subtract_log_q``);
a sampled class equal to a row's true class (an "accidental hit") is removed from that row; the loss
is the cross-entropy of the true class among [true, sampled].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LogUniformSampler:
    """TensorFlow's ``log_uniform_candidate_sampler(unique=True)``: ``n`` distinct ids in
    [0, V), drawn by rejection, with each class's expected count ``1 - (1 - P(k))^tries``
    (``P(k) * n`` when no draw was rejected), as TensorFlow's ``ExpectedCountHelper`` has it."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 2:
            raise ValueError(f"the sampled softmax needs a vocabulary of at least 2 tokens, got {vocab_size}")
        self.vocab_size = vocab_size
        self.log_range = math.log(vocab_size + 1)

    def probability(self, ids: Tensor) -> Tensor:
        ids = ids.double()
        return torch.log((ids + 2) / (ids + 1)) / self.log_range

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, int]:
        """``n`` distinct ids (in draw order) and the number of draws it took."""
        n = min(n, self.vocab_size)
        seen = torch.zeros(self.vocab_size, dtype=torch.bool)
        picked: list[Tensor] = []
        count, tries = 0, 0
        while count < n:
            # draws in blocks; a block's first new ids in draw order are kept, the way a one-by-one
            # loop would keep them, so the result does not depend on the block size
            block = max(2 * (n - count), 1024)
            u = torch.rand(block, generator=generator, dtype=torch.float64)
            draws = (torch.exp(u * self.log_range).floor().long() - 1).clamp_(0, self.vocab_size - 1)
            first = torch.zeros(block, dtype=torch.bool)
            uniq, inverse = torch.unique(draws, return_inverse=True)
            order = torch.full((uniq.numel(),), block, dtype=torch.long).scatter_reduce_(
                0, inverse, torch.arange(block), reduce="amin"
            )
            first[order] = True
            new = first & ~seen[draws]
            positions = new.nonzero().squeeze(1)
            need = n - count
            if positions.numel() >= need:
                positions = positions[:need]
                tries += int(positions[-1]) + 1  # draws up to the last one kept
            else:
                tries += block
            ids = draws[positions]
            seen[ids] = True
            picked.append(ids)
            count += ids.numel()
        return torch.cat(picked), tries

    def expected_count(self, ids: Tensor, tries: int, n: int) -> Tensor:
        p = self.probability(ids)
        if tries == n:
            return (p * n).float()
        return (-torch.expm1(tries * torch.log1p(-p))).float()


class SoftmaxHead(nn.Module):
    """``logits = h W^T + b`` over the vocabulary; W [V, P], b [V] (bilm-tf's layout and names)."""

    def __init__(self, weight: Tensor, bias: Tensor, requires_grad: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=requires_grad)
        self.bias = nn.Parameter(bias, requires_grad=requires_grad)

    @classmethod
    def initial(cls, vocab_size: int, dim: int, generator: torch.Generator | None = None) -> SoftmaxHead:
        """bilm-tf's initialisation: W ~ N(0, 1 / sqrt(P)), b = 0."""
        w = torch.randn(vocab_size, dim, generator=generator) / math.sqrt(dim)
        return cls(w, torch.zeros(vocab_size))

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def extra_repr(self) -> str:
        return f"vocabulary={self.weight.shape[0]}, dim={self.weight.shape[1]}, shared by both directions"

    def sampled_loss(
        self, h: Tensor, targets: Tensor, sampled: Tensor, sampled_expected: Tensor, true_expected: Tensor
    ) -> Tensor:
        """Per-row sampled softmax cross-entropy.

        h: [N, P]; targets: [N] ids; sampled: [S] distinct ids; sampled_expected: [S];
        true_expected: [N] (the targets' expected counts). Returns [N].
        """
        true_logits = (h * self.weight[targets]).sum(-1) + self.bias[targets] - torch.log(true_expected)
        sampled_logits = F.linear(h, self.weight[sampled], self.bias[sampled]) - torch.log(sampled_expected)
        hits = targets.unsqueeze(1) == sampled.unsqueeze(0)
        # TensorFlow adds -FLT_MAX; -inf would give NaN gradients nowhere here, but stays finite-safe
        sampled_logits = sampled_logits.masked_fill(hits, torch.finfo(sampled_logits.dtype).min)
        logits = torch.cat([true_logits.unsqueeze(1), sampled_logits], dim=1)
        return torch.logsumexp(logits, dim=1) - true_logits

    def full_loss(self, h: Tensor, targets: Tensor, chunk: int = 4096) -> Tensor:
        """Per-row cross-entropy of the full softmax over the vocabulary ([N]); rows in chunks, so
        that [chunk, V] logits bound the memory."""
        out = []
        for hc, tc in zip(h.split(chunk), targets.split(chunk)):
            out.append(F.cross_entropy(F.linear(hc, self.weight, self.bias), tc, reduction="none"))
        return torch.cat(out) if out else h.new_zeros(0)
