"""``ElmoBatchEmbedder``: the embedder as a Ray Data batch function, one model per actor::

    ds = ray.data.read_text("corpus.txt")                 # a column "text", one sentence per row
    ds = ds.map_batches(ElmoBatchEmbedder, fn_constructor_kwargs={"output": "mean"},
                        concurrency=4, batch_size=256)    # + num_gpus=1 for one GPU per actor
    ds.write_parquet("vectors/")

Each actor loads the model once (:mod:`.model_choice`), on the GPU Ray gave it if any, with as many
CPU threads as CPUs (:mod:`.actor_resources`). Each call reads its rows (:mod:`.rows`: a bad row is
an error naming it), sorts them by length and cuts them into model batches under a token budget
(the embedding room's :func:`~elmo_fast.embedding.batching.batches`), embeds them through the room's
:class:`~elmo_fast.embedding.batch_runner.BatchRunner` (a batch that runs out of memory is halved)
and shapes each row's vectors with :func:`~elmo_fast.output_shapes.shape_output`, the rule of
``embed`` and ``serve``. The model is stateless: a row's vectors are those of its sentence embedded
alone, whatever the batches, the partitioning and the number of actors (to fp32 rounding, ~1e-6).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..embedding.batch_runner import BatchRunner
from ..embedding.batching import batches
from ..embedding.options import DEFAULT_MAX_TOKENS
from ..errors import ElmoFastError, Param
from ..output_shapes import OUTPUTS, unknown_output
from ..textio import DEFAULT_MAX_LINE_LENGTH, check_max_line_length
from .actor_resources import actor_device, use_assigned_cpus
from .model_choice import ModelChoice
from .rows import Row, columns_of, text_rows, token_rows

#: ``output`` -> the column it fills: one vector per row ("mean": the mean over tokens of the layer
#: average, as the server's), [tokens, D] ("average", "top", "sum") or [layers, tokens, D] ("all")
OUTPUT_COLUMNS = {output: "embedding" if output == "mean" else "embeddings" for output in OUTPUTS}


class ElmoBatchEmbedder:
    """A callable class for ``Dataset.map_batches(ElmoBatchEmbedder, fn_constructor_kwargs={...})``.

    The model, as ``embed`` takes it: ``model`` (a name: "default", "small", "original", ...),
    ``model_dir`` (+ ``model_format`` for a directory holding both kinds), or ``options_file`` +
    ``weight_file``; none of them: the bundled model. ``device``: "cpu", "cuda", "cuda:N"; None (default):
    the GPU Ray gave the actor (``num_gpus=1``), else the CPU. ``precision`` and ``backend`` as for
    :class:`~elmo_fast.ElmoEmbedder`.

    ``output``: "mean" (default) adds a column ``embedding``, one float32 vector [D] per row; "average",
    "top" or "sum" a column ``embeddings`` [tokens, D]; "all" ``embeddings`` [layers, tokens, D].
    The batch's other columns pass through.

    The sentences: ``text_column`` (default "text", the column ``ray.data.read_text`` makes) split at
    whitespace, or with ``tokenize=True`` by ``embed --tokenize``'s tokenizer; or ``tokens_column``, a
    column of token lists. A row longer than ``max_line_length`` characters (None: no bound), an empty
    one or one that is not text is an error naming it.

    Inside each call, rows are sorted by length and run in model batches of at most ``max_batch_size``
    sentences and ``max_batch_tokens`` padded tokens (sentences x the longest).
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        model_dir: str | None = None,
        options_file: str | None = None,
        weight_file: str | None = None,
        model_format: str | None = None,
        device: str | None = None,
        precision: str | None = None,
        backend: str = "auto",
        output: str = "mean",
        text_column: str | None = None,
        tokens_column: str | None = None,
        tokenize: bool = False,
        max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
        max_batch_size: int = 64,
        max_batch_tokens: int | None = DEFAULT_MAX_TOKENS,
    ) -> None:
        if output not in OUTPUT_COLUMNS:
            raise ElmoFastError(Param("output"), " " + unknown_output(output))
        if tokens_column is not None and text_column is not None:
            raise ElmoFastError(
                "give ", Param("text_column"), " (raw text) or ", Param("tokens_column"), " (lists of tokens), not both"
            )
        if tokens_column is not None and tokenize:
            raise ElmoFastError(
                Param("tokenize"),
                " splits the text of ",
                Param("text_column"),
                "; a ",
                Param("tokens_column"),
                " is tokenized already",
            )
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ElmoFastError(Param("max_batch_size"), f" must be an integer >= 1, got {max_batch_size!r}")
        if max_batch_tokens is not None and (not isinstance(max_batch_tokens, int) or max_batch_tokens < 1):
            raise ElmoFastError(
                Param("max_batch_tokens"), f" must be an integer >= 1 or None, got {max_batch_tokens!r}"
            )
        check_max_line_length(max_line_length)
        self.output = output
        self.column = OUTPUT_COLUMNS[output]
        self.tokens_column = tokens_column
        self.text_column = text_column if text_column is not None else "text"
        self.tokenize = bool(tokenize)
        self.max_line_length = max_line_length
        self.max_batch_size = max_batch_size
        self.threads = use_assigned_cpus()
        choice = ModelChoice(model, model_dir, options_file, weight_file, model_format)
        self.embedder = choice.load(actor_device(device), backend=backend, precision=precision)
        self.runner = BatchRunner(self.embedder, output, max_batch_tokens)

    def rows(self, batch: Any) -> list[Row]:
        """The batch's sentences, checked (a bad row is an error naming it)."""
        if self.tokens_column is not None:
            return token_rows(batch, self.tokens_column, "tokens_column", self.max_line_length)
        return text_rows(batch, self.text_column, "text_column", self.tokenize, self.max_line_length)

    def vectors(self, rows: list[Row]) -> list[np.ndarray]:
        """Each row's vectors in the output's shape, in the rows' order."""
        out: list[Any] = [None] * len(rows)
        for batch in batches(rows, self.max_batch_size, self.runner.budget):
            for row, vectors in zip(batch, self.runner.embed(batch)):
                out[row.index] = vectors
        return out

    def __call__(self, batch: Any) -> Any:
        columns_of(batch)  # (refuses a format it cannot read, before any work)
        results = self.vectors(self.rows(batch))
        if self.output == "mean":
            dim = self.embedder.output_dim
            column: Any = np.stack(results) if results else np.zeros((0, dim), dtype=np.float32)
        else:
            column = np.empty(len(results), dtype=object)  # ragged: Ray stores it as a variable-shaped tensor
            for i, vectors in enumerate(results):  # (one by one: a slice assignment would broadcast equal shapes)
                column[i] = vectors
        if isinstance(batch, dict):
            return {**batch, self.column: column}
        batch = batch.copy(deep=False)  # pandas
        batch[self.column] = list(column)
        return batch
