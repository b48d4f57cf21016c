"""Before an embed run: the output can be written, is not another run's work, and may not be this
very run's finished result already (``resume=True`` after its work directory was removed)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from itertools import islice

from .. import durable
from ..errors import ElmoFastError, Param
from .lines import Line, lines_digest
from .work_area import DAMAGED, RUN_RECORD, differences, read_manifest, shard_names, work_dir_of


def check_output_path(output: str) -> None:
    """Refuse, before any work (and before the output's lock is taken), an output that cannot be
    written: its folder missing or not writable, the output a folder, its name too long for the
    filesystem (with the temporary names beside it). :func:`elmo_fast.durable.check_writable`'s
    checks, in its words, as for every file the package writes."""
    durable.check_writable(output, "output")


def check_output(output: str, overwrite: bool, resume: bool) -> None:
    """Refuse, before any work, an output that cannot or should not be written (with its lock
    held: what its work area holds is another run's only while that run is alive)."""
    check_output_path(output)
    work = work_dir_of(output)
    if os.path.isdir(work):
        manifest = read_manifest(work)
        if manifest is not None:
            if not resume:
                n = len(shard_names(work))
                damaged = ", its manifest damaged" if manifest is DAMAGED else ""
                raise ElmoFastError(
                    f"{work} holds an interrupted run ({n} window(s) done{damaged}); pass ",
                    Param("resume", True),
                    " to continue it, or remove that directory to start over",
                )
            return  # the run that made it passed the checks below; it may replace the output
    if os.path.exists(output) and not overwrite:
        if resume and _run_record(output) is not None:
            return  # made by a resume run that finished; finished_already checks that it was this one
        raise ElmoFastError(f"{output} already exists; pass ", Param("overwrite", True), " to replace it")


def _run_record(output: str) -> dict | None:
    import h5py

    try:
        with h5py.File(output, "r") as f:
            return json.loads(f.attrs[RUN_RECORD]) if RUN_RECORD in f.attrs else None
    except (OSError, ValueError, TypeError):
        return None


def _finished_run_differs(record: dict, manifest: dict, lines: Iterator[Line], name: str) -> str | None:
    """Why the finished run recorded in an output is not this one (None: it is, input included)."""
    differs = differences(record, manifest)
    if differs:
        return "; ".join(differs)
    for n, digest in record["shards"]:
        got = list(islice(lines, n))
        if len(got) < n:
            return f"{name} has fewer lines than the input it was made from"
        if lines_digest(got) != digest:
            return f"lines {got[0].index + 1}..{got[-1].index + 1} of {name} are not those it was made from"
    extra = next(lines, None)
    return f"{name} has more lines than it was made from (line {extra.index + 1})" if extra else None


def finished_already(
    output: str, manifest: dict, lines: Iterator[Line], name: str, overwrite: bool, rereadable: bool
) -> bool:
    """Whether the output is the finished result of this very run (resume=True after the work directory
    was removed), reading the input to check it; an output of another run is an error unless overwrite."""
    work = work_dir_of(output)
    if not os.path.isfile(output) or os.path.isdir(work) and read_manifest(work) is not None:
        return False
    record = _run_record(output)
    if record is None:
        return False
    why = _finished_run_differs(record, manifest, lines, name)
    if why is None:
        return True
    if not overwrite:
        raise ElmoFastError(
            f"{output} already exists, made by another run ({why}); pass ", Param("overwrite", True), " to replace it"
        )
    if not rereadable:
        raise ElmoFastError(
            f"{output} was made by another run ({why}), and {name} cannot be read twice; remove {output} to embed it"
        )
    return False
