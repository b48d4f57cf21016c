"""The read stage for proteins: the records of a FASTA file, one residue per token, keyed by the record's
id (``elmo-fast embed --fasta``, ``embed_file(..., fasta=True)``), read lazily and checked as they arrive.

A record is a header line (``>``) and the sequence lines up to the next header; blank lines are
skipped, whitespace inside a sequence line is dropped and residues are upper-cased, as seqvec reads
them. The id is the header's first word (what Biopython's ``record.id`` and bio_embeddings use), or,
with seqvec's rule (:class:`IdRule` ``split_char`` / ``field``: ``--split-char`` / ``--id``), field
``field`` of the header split at ``split_char`` (-1: the whole header). Plain, gzip, bzip2 and xz files
(:mod:`elmo_fast.textio`). A malformed file is a one-line error naming the line, before anything of
it is written: a sequence line before any header, a header without an id, a record without residues,
a character that is not a residue letter (A-Z), an id seen before (it keys a dataset), a line longer
than ``max_line_length``.

Each record is a :class:`~.lines.Line`: ``index`` its number in the file (0-based), ``text`` its
residues, ``tokens`` one per residue, ``key`` its id, ``number`` its header's line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from ..errors import ElmoFastError, InputError, Param
from ..textio import BOM, DECOMPRESSION_ERRORS, TextInput
from .input_guard import DEFAULT_MAX_LINE_LENGTH, bounded_lines, check_max_line_length
from .lines import Line

_NOT_RESIDUE = re.compile(r"[^A-Za-z]")


@dataclass(frozen=True)
class IdRule:
    """How a header gives its record's id: its first word (``split_char`` None), or seqvec's rule: the
    header (without ``>``, stripped) split at ``split_char``, field ``field`` (-1: the whole header)."""

    split_char: str | None = None
    field: int = 1

    def __post_init__(self) -> None:
        if self.split_char is not None and (not isinstance(self.split_char, str) or not self.split_char):
            raise ElmoFastError(Param("fasta_split_char"), f" must be a non-empty string, got {self.split_char!r}")
        if isinstance(self.field, bool) or not isinstance(self.field, int) or self.field < -1:
            raise ElmoFastError(
                Param("fasta_id_field"), f" must be an integer >= -1 (-1: the whole header), got {self.field!r}"
            )

    def id_of(self, header: str) -> str | None:
        """The id in a header's text (without ``>``); None when the rule finds none."""
        text = header.strip()
        if self.split_char is None:
            words = text.split()
            return words[0] if words else None
        if self.field == -1:
            return text or None
        fields = text.split(self.split_char)
        return fields[self.field].strip() or None if self.field < len(fields) else None

    def describe(self) -> str:
        if self.split_char is None:
            return "the header's first word"
        return (
            "the whole header" if self.field == -1 else f"field {self.field} of the header split at {self.split_char!r}"
        )


def _hdf5_name_problem(key: str) -> str | None:
    """Why HDF5 cannot name a dataset ``key`` ('/' nests groups, as h5py's create_dataset does), or None."""
    if any(part in ("", ".") for part in key.split("/")):
        return "'/' nests groups in HDF5, so '.', '//' and a leading or trailing '/' cannot be part of a dataset name"
    return None


def read_fasta(
    input_file: str | os.PathLike | IO,
    id_rule: IdRule = IdRule(),
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
) -> Iterator[Line]:
    """Lazily the records of a FASTA input (see the module docstring); the input is opened now, so that a
    missing file fails before any output is begun."""
    check_max_line_length(max_line_length)
    return _records(TextInput(input_file), id_rule, max_line_length)


def _records(source: TextInput, id_rule: IdRule, max_line_length: int | None) -> Iterator[Line]:
    name, kind = source.name, source.compression
    seen: dict[str, int] = {}  # id -> its header's line
    count = 0
    header: tuple[str, int] | None = None  # (id, line number) of the record being read
    residues: list[str] = []

    def record() -> Line:
        key, number = header
        text = "".join(residues)
        if not text:
            raise InputError(
                f"{name}: line {number}: record {key!r} has no residues (a header with no sequence after it)"
            )
        return Line(count, text, list(text), key=key, number=number)

    try:
        lines = bounded_lines(source.stream, name, max_line_length)
        number = 0
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                break
            except DECOMPRESSION_ERRORS as e:
                if not kind:
                    raise
                raise InputError(
                    f"{name}: the {kind} data is corrupt or truncated after line {number} "
                    f"({' '.join(str(e).split()) or type(e).__name__})"
                ) from None
            number += 1
            if number == 1 and raw.startswith(BOM):
                raw = raw[1:]
            line = raw.rstrip("\r\n")
            if line.startswith(">"):
                if header is not None:
                    yield record()
                    count += 1
                key = id_rule.id_of(line[1:])
                if key is None:
                    raise InputError(
                        f"{name}: line {number}: the header {line[:80]!r} gives no id ({id_rule.describe()}"
                        f"); give every record an id, or choose another ",
                        Param("fasta_split_char"),
                        " / ",
                        Param("fasta_id_field"),
                    )
                if (problem := _hdf5_name_problem(key)) is not None:
                    raise InputError(f"{name}: line {number}: the id {key!r} cannot key a dataset: {problem}")
                first = seen.setdefault(key, number)
                if first != number:
                    raise InputError(
                        f"{name}: line {number}: the id {key!r} was the id of line {first} too; ids key "
                        f"the output's datasets, so each must be unique ({id_rule.describe()})"
                    )
                header, residues = (key, number), []
                continue
            sequence = "".join(line.split())
            if not sequence:
                continue  # blank lines between records
            if header is None:
                raise InputError(
                    f"{name}: line {number}: sequence before the first header; a FASTA file starts "
                    f"with a '>' line naming the record (is this a FASTA file?)"
                )
            if (bad := _NOT_RESIDUE.search(sequence)) is not None:
                column = line.find(bad.group()) + 1
                hint = " (a stop codon: remove it)" if bad.group() == "*" else ""
                raise InputError(
                    f"{name}: line {number}, column {column}: {bad.group()!r} is not a residue letter (A-Z){hint}"
                )
            residues.append(sequence.upper())
        if header is not None:
            yield record()
            count += 1
        if count == 0:
            raise InputError(f"{name}: the input holds no FASTA records (no '>' header line)")
    finally:
        source.close()
