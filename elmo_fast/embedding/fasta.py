"""The read stage for proteins: the records of a FASTA file, one residue per token, keyed by the record's
id (``elmo-fast embed --fasta``, ``embed_file(..., fasta=True)``), read lazily and checked as they arrive.

A record is a header line (``>``) and the sequence lines up to the next header; blank lines are
skipped, whitespace inside a sequence line is dropped and residues are upper-cased, as seqvec reads
them. The id is the header's first word (what Biopython's ``record.id`` and bio_embeddings use), or,
with seqvec's rule (:class:`IdRule` ``split_char`` / ``field``: ``--split-char`` / ``--id``), field
``field`` of the header split at ``split_char`` (-1: the whole header). Plain, gzip, bzip2 and xz files
(:mod:`elmo_fast.textio`).

Residues are the letters A-Z (lower case is upper-cased); ``U``, ``O``, ``B``, ``Z`` and ``X`` are letters
like the others and reach the model as themselves, as SeqVec's reader passes them (SeqVec's ELMo reads
characters: they have their own character ids, and no mapping to ``X`` is made, unlike the
token-vocabulary models of bio_embeddings). Besides letters (:class:`ResidueRule`):

* ``*``, a stop: one ending the record is dropped (``stop="drop"``, the default: SeqVec's users strip
  it, and its vectors would describe a residue that is not there), kept as a character
  (``"keep"``: what seqvec's own reader passes on, for every ``*``) or refused (``"refuse"``). A ``*``
  inside a sequence (a read-through, or records run together) is refused unless ``"keep"``: dropping
  it would join the pieces around it into one protein that does not exist.
* ``-`` and ``.``, alignment gaps: refused (``gaps="refuse"``, the default: an aligned sequence's
  vectors are not its protein's) or removed (``"remove"``) before the stop rule looks at the end.

A malformed file is a one-line error naming the line and, inside a sequence, the column and the
position in the record's sequence (counted from 1, as written): a sequence line before any header,
a header without an id, a record without residues, a character that is not a residue letter, a stop
or gap the rules refuse, an id seen before (it keys a dataset; checked in bounded memory,
:mod:`.seen_ids`), a line longer than ``max_line_length``. The output is written under a temporary
name, so such an error leaves no output behind.

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
from .options import check_residue_rule
from .seen_ids import SeenKeys

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


_GAPS = "-."


@dataclass(frozen=True)
class ResidueRule:
    """What a sequence may hold besides residue letters (see the module docstring): ``stop`` ("drop": a
    final ``*`` dropped, "keep": every ``*`` a character, "refuse") and ``gaps`` ("refuse", "remove")."""

    stop: str = "drop"
    gaps: str = "refuse"

    def __post_init__(self) -> None:
        check_residue_rule(self.stop, self.gaps)


def _hdf5_name_problem(key: str) -> str | None:
    """Why HDF5 cannot name a dataset ``key`` ('/' nests groups, as h5py's create_dataset does), or None."""
    if any(part in ("", ".") for part in key.split("/")):
        return "'/' nests groups in HDF5, so '.', '//' and a leading or trailing '/' cannot be part of a dataset name"
    return None


def _column(line: str, k: int) -> int:
    """The 1-based column of the ``k``-th (0-based) non-whitespace character of ``line``."""
    seen = -1
    for column, ch in enumerate(line, 1):
        if not ch.isspace():
            seen += 1
            if seen == k:
                return column
    return len(line)


def read_fasta(
    input_file: str | os.PathLike | IO,
    id_rule: IdRule = IdRule(),
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
    residue_rule: ResidueRule = ResidueRule(),
    scratch_beside: str | os.PathLike | None = None,
) -> Iterator[Line]:
    """Lazily the records of a FASTA input (see the module docstring); the input is opened now, so that a
    missing file fails before any output is begun. ``scratch_beside``: the file (the output) beside which
    the ids seen go once they outgrow memory (:mod:`.seen_ids`; None: a private folder in the system's temporary area)."""
    check_max_line_length(max_line_length)
    return _records(TextInput(input_file), id_rule, max_line_length, residue_rule, scratch_beside)


def _records(
    source: TextInput,
    id_rule: IdRule,
    max_line_length: int | None,
    rule: ResidueRule,
    scratch_beside: str | os.PathLike | None,
) -> Iterator[Line]:
    name, kind = source.name, source.compression
    seen = SeenKeys(scratch_beside)  # id -> its header's line
    count = 0
    header: tuple[str, int] | None = None  # (id, line number) of the record being read
    residues: list[str] = []
    written = 0  # the record's sequence characters so far, as written (gaps and stops included)
    final_stop: tuple[int, int, int] | None = None  # (position, line, column) of a '*' ending what was read

    def where(number: int, column: int, position: int) -> str:
        return f"{name}: line {number}, column {column}: record {header[0]!r}, position {position} of its sequence"

    def internal_stop(position: int, number: int, column: int) -> InputError:
        return InputError(
            f"{where(number, column, position)}: a stop '*' inside the sequence, not at its end (only a final "
            f"'*' is dropped: removing this one would join two pieces into a protein that does not exist); "
            f"fix the record, or pass ",
            Param("fasta_stop", "keep"),
            " to embed every '*' as a character",
        )

    def record() -> Line:
        key, number = header
        if final_stop is not None and rule.stop == "refuse":
            position, line_number, column = final_stop
            raise InputError(
                f"{where(line_number, column, position)}: the sequence ends with a stop '*'; pass ",
                Param("fasta_stop", "drop"),
                " to drop it (the default) or ",
                Param("fasta_stop", "keep"),
                " to embed it as a character",
            )
        text = "".join(residues)
        if not text:
            raise InputError(
                f"{name}: line {number}: record {key!r} has no residues (a header with no sequence after it)"
            )
        return Line(count, text, list(text), key=key, number=number)

    def clean(line: str, sequence: str, number: int) -> str:
        """A sequence line with something besides letters: its residues, by the rules (or an error)."""
        nonlocal final_stop
        out = []
        for k, ch in enumerate(sequence):
            if "A" <= ch <= "Z" or "a" <= ch <= "z":
                out.append(ch)
                continue
            position = written + k + 1
            if ch in _GAPS:
                if rule.gaps == "refuse":
                    raise InputError(
                        f"{where(number, _column(line, k), position)}: {ch!r} is an alignment gap; give "
                        f"unaligned sequences, or pass ",
                        Param("fasta_gaps", "remove"),
                        " to remove gaps",
                    )
                continue
            if ch == "*":
                if rule.stop == "keep":
                    out.append(ch)
                    continue
                if any(c not in _GAPS for c in sequence[k + 1 :]):
                    raise internal_stop(position, number, _column(line, k))
                final_stop = (position, number, _column(line, k))  # the record's end, unless more follows
                continue
            raise InputError(
                f"{where(number, _column(line, k), position)}: {ch!r} is not a residue letter (A-Z)"
                + ("" if ch.isascii() else f" (U+{ord(ch):04X})")
            )
        return "".join(out)

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
                first = seen.first_line(key, number)
                if first is not None:
                    raise InputError(
                        f"{name}: line {number}: the id {key!r} was the id of line {first} too; ids key "
                        f"the output's datasets, so each must be unique ({id_rule.describe()})"
                    )
                header, residues, written, final_stop = (key, number), [], 0, None
                continue
            sequence = "".join(line.split())
            if not sequence:
                continue  # blank lines between records
            if header is None:
                raise InputError(
                    f"{name}: line {number}: sequence before the first header; a FASTA file starts "
                    f"with a '>' line naming the record (is this a FASTA file?)"
                )
            if final_stop is not None and any(c not in _GAPS for c in sequence):
                raise internal_stop(*final_stop)  # a '*' that ended a line, and the record goes on
            n = len(sequence)
            if _NOT_RESIDUE.search(sequence) is not None:
                sequence = clean(line, sequence, number)
            residues.append(sequence.upper())
            written += n
        if header is not None:
            yield record()
            count += 1
        if count == 0:
            raise InputError(f"{name}: the input holds no FASTA records (no '>' header line)")
    finally:
        seen.close()
        source.close()
