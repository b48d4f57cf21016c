"""How a corpus is embedded: :class:`EmbedOptions`, built from ``ElmoEmbedder.embed_file``'s keyword
arguments (and so from ``elmo-fast embed``'s flags), checked once, then carried through the pipeline."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ElmoFastError, Param
from ..output_shapes import OUTPUTS, unknown_output
from .input_guard import DEFAULT_MAX_LINE_LENGTH, check_max_line_length

OUTPUT_FORMATS = OUTPUTS  # (elmo_fast.output_shapes: every front's)
#: a FASTA record's vectors reduced to one per protein (the mean over its residues): instead of its
#: residues' ("only"), or beside them, as the dataset's attribute ``per_protein`` ("also")
PER_PROTEIN = ("only", "also")
ENCODING_ERRORS = ("strict", "replace")
#: a FASTA record's stop '*' (fasta.ResidueRule): a final one dropped, every one kept, or refused
STOP_RULES = ("drop", "keep", "refuse")
#: a FASTA record's alignment gaps '-' and '.' (fasta.ResidueRule): refused, or removed
GAP_RULES = ("refuse", "remove")
#: padded tokens (sentences x longest) per batch when bucketing, unless told otherwise: at the
#: default batch size of 64 it only binds for sentences over 64 tokens, and bounds the memory of a
#: batch of long ones (the largest activations on `original`: 4096 x 3 x 1024 x 4 bytes = 50 MB)
DEFAULT_MAX_TOKENS = 4096
#: padded residues (records x longest) per batch for FASTA inputs, unless told otherwise (seqvec's default
#: batch, 15,000 residues): bigger batches share each weight read among more rows, which proteins
#: (hundreds of residues each) need; BENCHMARKS.md (proteins) has the measurements
DEFAULT_FASTA_MAX_TOKENS = 15000
#: sentences read ahead and sorted together; with resume, also the work saved at once
DEFAULT_WINDOW = 2048


def check_residue_rule(stop: str, gaps: str) -> None:
    """A stop or gap rule that is not one of STOP_RULES / GAP_RULES: an error naming its parameter."""
    if stop not in STOP_RULES:
        raise ElmoFastError(Param("fasta_stop"), f" must be one of {', '.join(STOP_RULES)}, got {stop!r}")
    if gaps not in GAP_RULES:
        raise ElmoFastError(Param("fasta_gaps"), f" must be one of {', '.join(GAP_RULES)}, got {gaps!r}")


@dataclass(frozen=True)
class EmbedOptions:
    """The settings of one ``embed_file`` run (each documented at :meth:`ElmoEmbedder.embed_file`).

    Made by the caller, they are checked at once (a bad value is an error naming its parameter);
    :meth:`for_model` then resolves what depends on the embedder (its batch size, stateful or not)."""

    output_format: str = "all"
    batch_size: int | None = None  # None: the embedder's (FASTA, stateless: no bound)
    forget_sentences: bool = False
    use_sentence_keys: bool = False
    progress: bool | str = True  # "log": a line at most every 10 s
    max_tokens_per_batch: int | None = None  # None: DEFAULT_MAX_TOKENS when bucketing, else no bound
    bucketing: bool | None = None  # None: on, unless stateful
    window: int = DEFAULT_WINDOW
    resume: bool = False
    overwrite: bool = True
    skip_empty: bool = False
    encoding_errors: str = "strict"
    started: float | None = None  # a time.perf_counter() reading the closing wall time counts from
    distributed: bool = False
    tokenize: bool = False
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH  # characters; None: no bound
    fasta: bool = False  # the input is FASTA: one residue per token, keyed by record id (.fasta)
    fasta_split_char: str | None = None  # seqvec's id rule (with fasta_id_field); None: the header's first word
    fasta_id_field: int = 1
    per_protein: str | None = None  # None, "only" or "also" (PER_PROTEIN)
    fasta_stop: str | None = None  # a stop '*' (fasta.ResidueRule.stop); None: "drop" (a final one)
    fasta_gaps: str | None = None  # gaps '-' '.' (fasta.ResidueRule.gaps); None: "refuse"

    def __post_init__(self) -> None:
        if self.output_format not in OUTPUT_FORMATS:
            raise ElmoFastError(Param("output_format"), " " + unknown_output(self.output_format))
        if self.encoding_errors not in ENCODING_ERRORS:
            raise ElmoFastError(
                Param("encoding_errors"), f" must be one of {', '.join(ENCODING_ERRORS)}, got {self.encoding_errors!r}"
            )
        for name in ("batch_size", "max_tokens_per_batch", "window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ElmoFastError(Param(name), f" must be >= 1, got {value}")
        check_max_line_length(self.max_line_length)
        if self.per_protein is True:
            object.__setattr__(self, "per_protein", "only")
        if self.per_protein not in (None, False, *PER_PROTEIN):
            raise ElmoFastError(
                Param("per_protein"),
                f" must be one of {', '.join(PER_PROTEIN)} (or True: only), got {self.per_protein!r}",
            )
        if self.per_protein is False:
            object.__setattr__(self, "per_protein", None)
        if self.per_protein is not None and self.output_format == "mean":
            raise ElmoFastError(
                Param("per_protein"), " averages a record's residues, which the output 'mean' has done already"
            )
        if self.fasta:
            check_residue_rule(self.fasta_stop or "drop", self.fasta_gaps or "refuse")
            for name, bad in (
                ("tokenize", self.tokenize),
                ("use_sentence_keys", self.use_sentence_keys),
                ("skip_empty", self.skip_empty),
            ):
                if bad:
                    raise ElmoFastError(
                        Param(name),
                        " is for text, one sentence per line; with ",
                        Param("fasta"),
                        " every record is one sequence, one residue a token, keyed by its id",
                    )
        else:
            for name, given in (
                ("per_protein", self.per_protein is not None),
                ("fasta_split_char", self.fasta_split_char is not None),
                ("fasta_stop", self.fasta_stop is not None),
                ("fasta_gaps", self.fasta_gaps is not None),
            ):
                if given:
                    raise ElmoFastError(Param(name), " needs ", Param("fasta"), ": it is about FASTA records")

    def for_model(self, batch_size: int, stateful: bool) -> EmbedOptions:
        """These options with nothing left to the embedder: ``batch_size`` set, ``bucketing`` a bool,
        ``max_tokens_per_batch`` the bound batches are cut under (None: none). Stateful runs keep
        input order (the LSTM states flow from each batch to the next): bucketing and a token bound
        are refused, and the window is rounded up to whole batches, so a resumed run cuts the same ones."""
        if self.batch_size is not None:
            batch_size = self.batch_size
        elif self.fasta and not stateful:
            batch_size = None  # proteins: the residues per batch bound it (seqvec bounds no number of records)
        if stateful:
            if self.max_tokens_per_batch is not None or self.bucketing:
                raise ElmoFastError(
                    "stateful mode keeps input order (the LSTM states flow from each batch to the "
                    "next), so it cannot sort sentences into batches by length: drop ",
                    Param("max_tokens_per_batch")
                    if self.max_tokens_per_batch is not None
                    else Param("bucketing", True),
                    " and bound batches with ",
                    Param("batch_size"),
                )
            return dataclasses.replace(
                self,
                batch_size=batch_size,
                bucketing=False,
                max_tokens_per_batch=None,
                window=-(-self.window // batch_size) * batch_size,
            )
        bucketing = True if self.bucketing is None else self.bucketing
        default = DEFAULT_FASTA_MAX_TOKENS if self.fasta else DEFAULT_MAX_TOKENS
        max_tokens = (
            self.max_tokens_per_batch if self.max_tokens_per_batch is not None else (default if bucketing else None)
        )
        return dataclasses.replace(self, batch_size=batch_size, bucketing=bucketing, max_tokens_per_batch=max_tokens)

    @property
    def keeps_sentences(self) -> bool:
        """Whether the output holds ``sentence_to_index`` (allennlp leaves it out in these two cases, and a
        FASTA input has no sentences: its records are keyed by id)."""
        return not self.forget_sentences and not self.use_sentence_keys and not self.fasta
