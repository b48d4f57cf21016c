"""The context-free results of tokens, kept across batches (``token_cache_size`` /
``token_cache_mb``): a token's vector and its layer-0 input gates depend on its ids alone, so a
token met again is looked up, not recomputed."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from . import ops


class TokenCache:
    """Context-free results of distinct tokens, kept across batches: LRU, bounded in entries.

    Keyed by a token's row of ids (its 50 character ids for bilm-tf models); holds its vector [P] and
    its layer-0 input gates [2, 4C], the two results the fast path would otherwise recompute for
    every batch it appears in. Entries belong to one state of the weights (:attr:`weights_key`): a
    lookup with another key empties the cache first.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[Tensor, Tensor]] = OrderedDict()
        #: the key of the weights the entries were computed with (:func:`~elmo_fast.bilm.derived_weights.weights_key`)
        self.weights_key: tuple | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> tuple[Tensor, Tensor] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, value: tuple[Tensor, Tensor]) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def results(
        self,
        distinct: Tensor,
        weights_key: tuple,
        key_dtype: torch.dtype,
        compute: Callable[[Tensor], tuple[Tensor, Tensor]],
    ) -> tuple[Tensor, Tensor]:
        """Token vectors [U, P] and layer-0 gates [U, 2, 4C] of the rows ``distinct`` [U, W] (on the
        CPU or the model's device): the cached ones looked up, the others given by ``compute(rows
        [M, W])`` and kept. ``key_dtype``: the integer type a row's ids are keyed in (the smallest
        that holds every id of the front end)."""
        if self.weights_key != weights_key:
            self.clear()
            self.weights_key = weights_key
        # one host copy for the batch's distinct tokens (none when they are on the host already)
        keys = [k.tobytes() for k in distinct.to(device="cpu", dtype=key_dtype).numpy()]
        entries = [self.get(k) for k in keys]
        missing = [i for i, e in enumerate(entries) if e is None]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            vectors, gates = compute(distinct[ops.to_device_async(torch.tensor(missing), distinct.device)])
            for j, i in enumerate(missing):
                entries[i] = (vectors[j].clone(), gates[j].clone())
                self.put(keys[i], entries[i])
        return torch.stack([e[0] for e in entries]), torch.stack([e[1] for e in entries])
