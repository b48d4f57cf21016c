"""CUDA graphs of the fast forward, one per bucket (``ElmoBiLm(cuda_graphs=N)``): for small batches
on a GPU, whose time goes to launching thousands of small kernels, a replayed graph is one launch.

A bucket is a batch's shape and exact lengths (what the captured kernels and the bilstm op's
schedule depend on); its second batch is captured, later ones replay it with their own data
copied into the bucket's static inputs. Nothing here knows the model: the forward to capture
is given as a function of those static inputs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

#: body(distinct [R, W], token_index [B, T], mask [B, T], lengths [B] on the CPU) -> activations
Body = Callable[[Tensor, Tensor, Tensor, Tensor], list[Tensor]]


class CudaGraphRunner:
    """One forward captured as a CUDA graph: ``capture(body)`` runs ``body`` once eagerly on a side
    stream (a warm-up, as torch recommends: cuBLAS workspaces, lazily made copies), then once under
    capture, and keeps its outputs (static tensors, in the graph's own memory pool); ``replay()``
    reruns the captured kernels, which rewrite those outputs from the static inputs ``body`` reads."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.graph = torch.cuda.CUDAGraph()
        self.outputs: list[Tensor] = []

    def capture(self, body: Callable[[], list[Tensor]]) -> None:
        with torch.cuda.device(self.device):  # the model's GPU, whichever is current
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                body()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(self.graph):
                self.outputs = body()

    def replay(self) -> list[Tensor]:
        with torch.cuda.device(self.device):
            self.graph.replay()
        return self.outputs


class _CapturedBucket:
    """A captured forward and the static inputs it reads: the distinct tokens (padded with "no token"
    rows to a power of two), token_index and mask of one bucket's shapes and lengths."""

    def __init__(self, distinct: Tensor, token_index: Tensor, mask: Tensor, lengths: Tensor) -> None:
        self.runner = None
        self.distinct = distinct
        self.token_index = token_index
        self.mask = mask
        self.lengths = lengths  # on the CPU: the bilstm op's schedule, fixed in the graph

    def fill(self, distinct_h: Tensor, index_h: Tensor, mask_h: Tensor) -> None:
        """This batch's data into the static inputs (asynchronously, from pinned memory)."""
        padded = distinct_h.new_zeros(self.distinct.shape)  # "no token" rows past U: never indexed
        padded[: distinct_h.shape[0]] = distinct_h
        for static, host in ((self.distinct, padded), (self.token_index, index_h), (self.mask, mask_h)):
            static.copy_(host.pin_memory() if static.is_cuda else host, non_blocking=static.is_cuda)


class CudaGraphCache:
    """The captured forwards of the ``max_graphs`` most recent buckets (LRU), for one state of the
    weights: graphs read the weights (and the copies made of them) in place, so a forward with
    another weights key drops them all first. ``len()`` is the number of graphs held."""

    #: the class that captures and replays a forward (tests substitute a CPU stand-in)
    runner = CudaGraphRunner

    def __init__(self, max_graphs: int) -> None:
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, _CapturedBucket] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._weights_key: tuple | None = None

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Drop the captured forwards and their memory (and forget the buckets seen)."""
        self._graphs.clear()
        self._seen.clear()

    def forward(
        self, distinct_h: Tensor, index_h: Tensor, mask_h: Tensor, weights_key: tuple, device: torch.device, body: Body
    ) -> list[Tensor] | None:
        """The activations of this batch (distinct [U, W], token_index [B, T], mask [B, T], all on
        the CPU) from its bucket's captured forward (captured now if the bucket was seen before),
        or None: the caller runs the forward itself (a bucket seen for the first time)."""
        if self._weights_key != weights_key:
            self.clear()
            self._weights_key = weights_key
        lengths = mask_h.sum(dim=1)
        B, T = index_h.shape
        U, W = distinct_h.shape
        rows = max(8, 1 << (U - 1).bit_length())  # rows of the static distinct tokens: a power of two
        bucket = (B, T, W, rows, tuple(lengths.tolist()))
        entry = self._graphs.get(bucket)
        if entry is None:
            if bucket not in self._seen:  # a bucket is captured the second time it is seen
                self._seen[bucket] = None
                while len(self._seen) > 64 * self.max_graphs:
                    self._seen.popitem(last=False)
                return None
            entry = self._capture(distinct_h, index_h, mask_h, lengths, rows, device, body)
            self._graphs[bucket] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(bucket)
            entry.fill(distinct_h, index_h, mask_h)
        return [t.clone() for t in entry.runner.replay()]

    def _capture(
        self,
        distinct_h: Tensor,
        index_h: Tensor,
        mask_h: Tensor,
        lengths: Tensor,
        rows: int,
        device: torch.device,
        body: Body,
    ) -> _CapturedBucket:
        entry = _CapturedBucket(
            torch.empty(rows, distinct_h.shape[1], dtype=torch.long, device=device),
            torch.empty(index_h.shape, dtype=torch.long, device=device),
            torch.empty(mask_h.shape, dtype=torch.bool, device=device),
            lengths.clone(),
        )
        entry.fill(distinct_h, index_h, mask_h)
        entry.runner = self.runner(device)
        entry.runner.capture(lambda: body(entry.distinct, entry.token_index, entry.mask, entry.lengths))
        return entry
