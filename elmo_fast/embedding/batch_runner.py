"""The embed stage: a batch of lines through the embedder, halved on out-of-memory until the halves fit,
each sentence's vectors in the output's format."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from ..bilm.model import ElmoBiLm
from ..errors import InputError, Param
from ..output_shapes import shape_output
from .lines import Line
from .onnx_backend import OnnxBiLm


class Embedder(Protocol):
    """What the corpus pipeline needs of an embedder (:class:`elmo_fast.ElmoEmbedder` is one): it
    embeds batches; the pipeline streams, batches, writes and resumes around it."""

    elmo_bilm: ElmoBiLm | OnnxBiLm  # the biLM, or an exported graph in its place (backend='onnx')
    device: torch.device
    batch_size: int
    #: the files that define the model, by role ("options" and "weights" for bilm-tf models)
    model_files: dict[str, str | os.PathLike]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]: ...


def _is_out_of_memory(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    # CPU allocators report failure as a plain RuntimeError ("DefaultCPUAllocator: can't allocate memory")
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("can't allocate memory", "cannot allocate memory", "out of memory", "not enough memory")
    )


class BatchRunner:
    """Embeds a batch of lines, halving it on out-of-memory until the halves fit."""

    def __init__(self, embedder: Embedder, output_format: str, max_tokens: int | None) -> None:
        self.embedder = embedder
        self.stateful = embedder.elmo_bilm.stateful
        self.output_format = output_format
        self.max_tokens = max_tokens
        self.oom_splits = 0

    def budget(self) -> int | None:
        """The padded tokens a batch may hold now (None: no bound): less after an out-of-memory."""
        return self.max_tokens

    def embed(self, batch: list[Line]) -> list[np.ndarray]:
        """Each sentence's vectors, in the batch's order and the output's format."""
        failure = None
        try:
            results = self.embedder.embed_batch([line.tokens for line in batch])
        except Exception as e:  # noqa: BLE001  (only out-of-memory is handled; anything else is re-raised)
            if not _is_out_of_memory(e):
                raise
            failure = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if failure is None:
            return [shape_output(r, self.output_format) for r in results]
        # out of the except block: the traceback no longer pins the failed batch's tensors
        if self.embedder.device.type == "cuda":
            torch.cuda.empty_cache()
        padded = len(batch) * max(len(line.tokens) for line in batch)
        what = "records" if batch[0].key is not None else "lines"
        where = (
            batch[0].where()
            if len(batch) == 1
            else f"the batch of {what} {min(l.index for l in batch) + 1}..{max(l.index for l in batch) + 1}"
        )
        if self.stateful:
            # halves would run as two batches, so rows would take other rows' states: not the same run
            raise InputError(
                f"{where} ({len(batch)} sentences, {padded} padded tokens) does not fit in memory on "
                f"{self.embedder.device} ({failure}); stateful mode cannot split a batch: pass a "
                f"smaller ",
                Param("batch_size"),
            )
        if len(batch) == 1:
            raise InputError(
                f"{batch[0].where()}: its sentence of {len(batch[0].tokens)} tokens does not fit "
                f"in memory on {self.embedder.device} even alone ({failure})"
            )
        self.oom_splits += 1
        # later batches stay under what failed, instead of failing and splitting again one by one
        self.max_tokens = min(self.max_tokens or padded, max(1, padded // 2))
        mid = len(batch) // 2
        return self.embed(batch[:mid]) + self.embed(batch[mid:])
