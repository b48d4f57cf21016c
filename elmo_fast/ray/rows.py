"""A Ray Data batch's sentences: one column read into :class:`Row` s, either raw text (split at
whitespace, as ``embed`` reads lines, or tokenized as ``embed --tokenize`` does) or lists of tokens.
A row that cannot be embedded (not a string, empty, longer than the bound) is an error naming the
column, the row (its place in the batch, counted from 1, and its other short columns, which tell
which one it is) and what was found, before any row of the batch is embedded.

Batches come as Ray Data gives them to ``map_batches``: a dict of numpy arrays (``batch_format``
``"numpy"``, the default) or a pandas DataFrame (``"pandas"``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..embedding.lines import Line
from ..errors import InputError
from ..sentences import SentenceTypeError, as_tokens

PREFIX = "ElmoBatchEmbedder"


@dataclass
class Row(Line):
    """One row of a batch as the embedding room's :class:`~elmo_fast.embedding.lines.Line`: ``index``
    its place in the batch (from 0), ``text`` its text (tokens joined by spaces for a tokens column);
    ``label(index)`` names it in messages."""

    label: Callable[[int], str] | None = None

    def where(self) -> str:
        return self.label(self.index) if self.label is not None else f"row {self.index + 1} of the batch"


def columns_of(batch: Any) -> list[str]:
    """The batch's column names (a dict of arrays or a pandas DataFrame; other formats are refused)."""
    if isinstance(batch, dict):
        return list(batch)
    if hasattr(batch, "columns") and hasattr(batch, "iloc"):  # pandas
        return [str(c) for c in batch.columns]
    raise InputError(
        f"{PREFIX}: got a batch of type {type(batch).__name__}; give map_batches "
        f"batch_format='numpy' (the default) or 'pandas'"
    )


def column_values(batch: Any, column: str, parameter: str) -> list:
    """The values of one column, as Python objects (str, numpy arrays of tokens, ...)."""
    names = columns_of(batch)
    if column not in names:
        raise InputError(
            f"{PREFIX}: the batch has no column {column!r} (its columns: "
            f"{', '.join(map(repr, names)) or 'none'}); name the column with {parameter}="
        )
    values = batch[column]
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _found(value: Any) -> str:
    return "None (a missing value)" if value is None else f"{type(value).__name__} {_short(value)}"


def _labels(batch: Any, column: str, n: int) -> Callable[[int], str]:
    """Each row's name in messages: the column, its place in the batch, and up to three of its other
    columns that hold short scalars (an id, a path). Looked at only when a message needs it."""
    found: list[tuple[str, list]] = []
    looked: list[bool] = []

    def others() -> list[tuple[str, list]]:
        if looked:
            return found
        looked.append(True)
        for name in columns_of(batch):
            if name == column or len(found) == 3:
                continue
            values = batch[name]
            values = values.to_numpy() if hasattr(values, "to_numpy") else values  # (pandas)
            if getattr(values, "ndim", 1) != 1:  # vectors, not ids
                continue
            values = values.tolist() if hasattr(values, "tolist") else list(values)
            if all(isinstance(v, (str, int, float)) and len(str(v)) <= 60 for v in values):
                found.append((name, values))
        return found

    def label(i: int) -> str:
        extra = ", ".join(f"{name}={_short(values[i])}" for name, values in others())
        return f"{PREFIX}: column {column!r}, row {i + 1} of {n} in the batch" + (f" ({extra})" if extra else "")

    return label


def text_rows(batch: Any, column: str, parameter: str, tokenize: bool, max_line_length: int | None) -> list[Row]:
    """The rows of a text column, split by :func:`elmo_fast.tokenizer.split_text` (every front's rule: at
    whitespace, or with ``tokenize`` as ``embed --tokenize``); at most ``max_line_length`` characters."""
    from ..tokenizer import split_text

    values = column_values(batch, column, parameter)
    label = _labels(batch, column, len(values))
    rows = []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            hint = " (bytes: decode them first)" if isinstance(value, bytes) else ""
            raise InputError(f"{label(i)}: expected a str, found {_found(value)}{hint}")
        if max_line_length is not None and len(value) > max_line_length:
            raise InputError(
                f"{label(i)}: its text has {len(value):,} characters, over max_line_length="
                f"{max_line_length:,} (starts {_short(value)})"
            )
        tokens = split_text(value, tokenize)
        if not tokens:
            raise InputError(
                f"{label(i)}: the text {_short(value)} is empty or all whitespace; every row needs "
                f"at least one token (filter such rows out first)"
            )
        rows.append(Row(i, value, tokens, label=label))
    return rows


def token_rows(batch: Any, column: str, parameter: str, max_line_length: int | None) -> list[Row]:
    """The rows of a column of token lists (each a list or a 1-D array of str), at most
    ``max_line_length`` characters with a space between tokens."""
    values = column_values(batch, column, parameter)
    label = _labels(batch, column, len(values))
    rows = []
    for i, value in enumerate(values):
        if value is None:
            raise InputError(f"{label(i)}: expected a list of tokens, found None (a missing value)")
        try:
            tokens = as_tokens(value, "row")
        except SentenceTypeError:  # again, to name the row: labels are made only for messages
            tokens = as_tokens(value, label(i))
        if not tokens:
            raise InputError(
                f"{label(i)}: the list of tokens is empty; every row needs at least one token (filter "
                f"such rows out first)"
            )
        text = " ".join(tokens)
        if max_line_length is not None and len(text) > max_line_length:
            raise InputError(
                f"{label(i)}: its {len(tokens):,} tokens hold {len(text):,} characters, over "
                f"max_line_length={max_line_length:,}"
            )
        rows.append(Row(i, text, tokens, label=label))
    return rows
