"""The read stage: the input's sentences, one per line, read lazily and checked as they arrive.

The input may be a path, a binary stream or a text stream; plain, gzip, bzip2 or xz text, told apart
by its first bytes (:mod:`elmo_fast.textio`). A bad line is an error naming it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from ..errors import ElmoFastError, InputError, Param
from ..textio import BOM, DECOMPRESSION_ERRORS, TextInput
from .input_guard import DEFAULT_MAX_LINE_LENGTH, bounded_lines, check_max_line_length
from .options import ENCODING_ERRORS

# lone surrogates: what surrogateescape makes of bytes that are not UTF-8
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass
class Line:
    """One sentence of the input: its 0-based line number (its default key) and its text; or one record of
    a FASTA file (:mod:`.fasta`): its 0-based number, its residues, and its id (``key``) and header's line
    number (``number``)."""

    index: int
    text: str
    tokens: list[str]
    key: str | None = None
    number: int | None = None

    def where(self) -> str:
        """Where it is in the input, for messages."""
        if self.key is not None:
            return f"record {self.key!r} (line {self.number})"
        return f"line {self.index + 1}"


def _decode_line(raw: str, name: str, number: int, encoding_errors: str, compression: str | None) -> str:
    if not _SURROGATES.search(raw):
        return raw
    try:
        data = raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a str stream handed to us with lone surrogates: no bytes to recover
        raise InputError(f"{name}: line {number} holds a lone surrogate, which UTF-8 cannot encode") from None
    if encoding_errors == "replace":
        return data.decode("utf-8", "replace")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"{name}: line {number}" + (f" (after {compression} decompression)" if compression else "")
        if compression:  # not text inside (a tar archive?): reading it with U+FFFD would embed garbage
            raise InputError(
                f"{where} is not valid UTF-8 ({e.reason} at byte {e.start} of the line); the "
                f"decompressed data must be UTF-8 text, one sentence per line (is the file damaged, "
                f"or an archive?)"
            ) from None
        raise InputError(
            f"{where} is not valid UTF-8 ({e.reason} at byte {e.start} of the line); fix it, or pass ",
            Param("encoding_errors", "replace"),
            " to read bad bytes as U+FFFD",
        ) from None
    return raw  # unreachable in practice: surrogates only come from bytes that are not UTF-8


def read_sentences(
    input_file: str | os.PathLike | IO,
    encoding_errors: str = "strict",
    skip_empty: bool = False,
    tokenize: bool = False,
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
) -> Iterator[Line]:
    """Lazily the input's sentences, one per line, stripped, checked as they are read.

    input_file: a path, a binary stream (decoded as UTF-8 line by line) or a text stream; a path is
    opened now, so that a missing file fails before any output is begun. Paths and binary streams
    compressed with gzip, bzip2 or xz are decompressed, recognised by their first bytes whatever
    their name. A byte-order mark at the start of the input is dropped (as ``utf-8-sig`` does).
    A line that is not UTF-8 is an error naming it (``encoding_errors="replace"`` reads bad bytes
    as U+FFFD instead), as is a line holding a NUL byte (binary data, not text); so is an empty or
    all-whitespace line, unless ``skip_empty``, which skips it and keeps the line numbers of the
    others (their keys). An input with no sentence is an error. Tokens are the line split by
    :func:`elmo_fast.tokenizer.split_text`, every front's rule: at whitespace, or with ``tokenize`` as
    raw text, tokenized as the bundled model's training corpus was; the line's text stays its key.
    A line longer than ``max_line_length`` characters is an error naming it, raised before the
    line is held whole (None: no bound; :mod:`.input_guard`).
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise ElmoFastError(
            Param("encoding_errors"), f" must be one of {', '.join(ENCODING_ERRORS)}, got {encoding_errors!r}"
        )
    check_max_line_length(max_line_length)
    return _iter_lines(TextInput(input_file), encoding_errors, skip_empty, tokenize, max_line_length)


def _iter_lines(
    source: TextInput,
    encoding_errors: str,
    skip_empty: bool,
    tokenize: bool = False,
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
) -> Iterator[Line]:
    from ..tokenizer import split_text

    name, kind = source.name, source.compression
    count = 0
    index = -1
    try:
        lines = bounded_lines(source.stream, name, max_line_length)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                break
            except DECOMPRESSION_ERRORS as e:
                if not kind:
                    raise
                raise InputError(
                    f"{name}: the {kind} data is corrupt or truncated after line {index + 1} "
                    f"({' '.join(str(e).split()) or type(e).__name__})"
                ) from None
            index += 1
            if index == 0 and raw.startswith(BOM):
                raw = raw[1:]  # only there: a BOM elsewhere is a character of the text, as utf-8-sig reads it
            if "\x00" in raw:
                where = f" (after {kind} decompression)" if kind else ""
                raise InputError(
                    f"{name}: line {index + 1}{where} holds a NUL byte: this is binary data, not text; "
                    f"give a UTF-8 text file of sentences, one per line"
                )
            text = _decode_line(raw, name, index + 1, encoding_errors, kind).strip()
            if not text:
                if skip_empty:
                    continue
                raise InputError(
                    f"{name}: line {index + 1} is empty; every line must hold one "
                    f"{'' if tokenize else 'whitespace-tokenized '}sentence (",
                    Param("skip_empty", True),
                    " skips such lines)",
                )
            count += 1
            yield Line(index, text, split_text(text, tokenize))
        if count == 0:
            raise InputError(f"{name}: the input holds no sentences")
    finally:
        source.close()


def refuse_duplicates(lines: Iterable[Line], output: str) -> Iterator[Line]:
    """With sentence keys a repeated sentence would need one key twice: an error naming both lines.
    Holds a 16-byte digest per sentence seen, not the sentences, in bounded memory (:mod:`.seen_ids`:
    beyond a few hundred thousand, on disk beside ``output``)."""
    from .seen_ids import SeenKeys

    seen = SeenKeys(output)
    try:
        for line in lines:
            first = seen.first_line(line.text, line.index)
            if first is not None:
                raise InputError(
                    f"line {line.index + 1} repeats the sentence of line {first + 1}; its key would exist "
                    f"twice in {output}: do not pass ",
                    Param("use_sentence_keys"),
                    " to encode duplicate sentences",
                )
            yield line
    finally:
        seen.close()


def lines_digest(lines: Iterable[Line]) -> str:
    """A digest of lines (their numbers and texts): what a resume checks a shard's input against."""
    h = hashlib.blake2b(digest_size=16)
    for line in lines:
        keyed = "" if line.key is None else f"{line.key}\t"  # (FASTA records: their ids too)
        h.update(f"{line.index}\t{keyed}{line.text}\n".encode())
    return h.hexdigest()
