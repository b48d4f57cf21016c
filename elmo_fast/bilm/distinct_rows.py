"""Each distinct token of a batch once: the one place the biLM finds the distinct rows of ids.

Every forward of :class:`~elmo_fast.bilm.model.ElmoBiLm` sends each distinct token through the char
CNN, the highways and layer 0's input projection once (fast inference, fine-tuning, the
vocabulary cache, the host-planned GPU forward), and the biLSTM reads them by index.
"""

from __future__ import annotations

import numpy as np

# numpy.random loads on first use otherwise, in the middle of a run; a SIGTERM handled while its Cython
# modules initialise is swallowed there (they report errors while registering with collections.abc
# as "unraisable"), and `embed` then ran on to the end: seen in 3 of 60 tries
import numpy.random  # noqa: F401
import torch
from torch import Tensor


def distinct_rows(ids: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The distinct rows of ``ids`` [..., W] (integers), and where each position finds its own.

    Returns distinct [U, W], in lexicographic order, and index [...] (``ids``' leading shape), the
    row of each position: what ``torch.unique(dim=0, return_inverse=True)`` gives. ``mask`` [...]
    (bool) keeps to the positions it holds: the others get index 0 (a row the caller multiplies by
    0 or never reads), and U >= 1 even when it holds none. Without ``mask``, every position counts
    (ELMo's padding, all-zero ids, is then one more row).

    On the CPU, without torch.unique's sort of every row (tens of ms for a large batch): rows are
    hashed to 64 bits, the hashes made unique, the result checked against the rows themselves (a
    collision, which this check would catch, falls back to ``torch.unique(dim=0)``: the result is
    exact either way), and only the U distinct rows sorted. The order is torch.unique's so that
    every path hands the GEMMs the same rows in the same order (their rounding depends on it). On
    other devices, and under ``torch.compile``, it is ``torch.unique(dim=0)``.
    """
    lead, W = ids.shape[:-1], ids.shape[-1]
    if ids.device.type != "cpu" or torch.compiler.is_compiling():
        return _unique_rows(ids, mask)
    rows = (ids.reshape(-1, W) if mask is None else ids[mask]).numpy()
    if rows.shape[0] == 0:
        return _unique_rows(ids, mask)
    hashes = (rows.astype(np.uint64) * _row_hash_multipliers(W)).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    distinct = rows[first]
    inverse = inverse.reshape(-1)
    if not np.array_equal(distinct[inverse], rows):  # a hash collision
        return _unique_rows(ids, mask)
    order = np.lexsort(distinct.T[::-1])  # torch.unique's order: the first column first
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    distinct, inverse = distinct[order], rank[inverse]
    inverse_t = torch.from_numpy(inverse.astype(np.int64))
    if mask is None:
        return torch.from_numpy(distinct), inverse_t.view(lead)
    index = torch.zeros(lead, dtype=torch.long)
    index[mask] = inverse_t
    return torch.from_numpy(distinct), index


def _unique_rows(ids: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    lead, W = ids.shape[:-1], ids.shape[-1]
    if mask is None:
        distinct, inverse = torch.unique(ids.reshape(-1, W), dim=0, return_inverse=True)
        return distinct, inverse.view(lead)
    index = torch.zeros(lead, dtype=torch.long, device=ids.device)
    rows = ids[mask]
    if rows.shape[0] == 0:
        return ids.new_zeros(1, W), index
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    index[mask] = inverse
    return distinct, index


_HASH_MULTIPLIERS: dict[int, np.ndarray] = {}


def _row_hash_multipliers(width: int) -> np.ndarray:
    """Fixed random odd 64-bit multipliers, one per column: a row's hash is sum_j ids[j] * m_j mod 2^64."""
    m = _HASH_MULTIPLIERS.get(width)
    if m is None:
        m = np.random.default_rng(20180215).integers(0, 2**64 - 1, size=width, dtype=np.uint64, endpoint=True) | 1
        _HASH_MULTIPLIERS[width] = m
    return m
