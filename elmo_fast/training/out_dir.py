"""A training run's output directory: one run at a time in it, swept of killed runs' leftovers,
and never taken over by a new run by accident.

The run holds :class:`~elmo_fast.run_lock.RunLock` on :data:`LOCK` in the directory from start to
end: a second ``train``/``finetune`` on the same directory fails at once naming the holder's PID,
and a killed run's lock never blocks (the kernel drops it with the process). The lock file is
removed when the run ends (``RunLock(remove=True)``: whoever takes the lock checks that its name
still leads to the file it locked, so a removal never lets two runs in; see :mod:`elmo_fast.run_lock`);
a killed run's stays, is no part of a run (a directory holding only it is empty for these checks),
is never swept, and is taken and removed by the next run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..durable import make_dirs, sweep_temp_files
from ..errors import InputError, Param
from ..run_lock import RunLock
from .checkpoints import CHECKPOINTS, checkpoint_files

#: the lock file a run holds in its output directory
LOCK = ".elmo-fast.lock"


def lock_out_dir(out: Path) -> RunLock:
    """Create ``out`` and take its lock (held until ``release()``); RunLocked when another run holds it."""
    if os.path.exists(out) and not os.path.isdir(out):  # (os.path: a name too long is make_dirs' to say)
        raise InputError(Param("out"), f" {out}: exists and is not a directory")
    make_dirs(out, "output directory")
    return RunLock(out / LOCK, f"output directory {out}", remove=True).acquire()


def prepare_out_dir(out: Path, resume: bool, overwrite: bool, log: Callable[[str], None]) -> None:
    """With the lock held: sweep killed runs' temporary files; refuse a directory holding a run unless
    resumed or overwritten; on overwrite, remove the old run's checkpoints."""
    for folder in (out, out / CHECKPOINTS):  # only files of processes that have ended (durable's names say whose)
        swept = sweep_temp_files(folder)
        if swept:
            log(f"elmo-fast: removed {len(swept)} temporary file(s) left by killed runs in {folder}")
    has_run = (out / CHECKPOINTS).exists() or (out / "weights.hdf5").exists()
    if has_run and not resume and not overwrite:
        raise InputError(
            Param("out"),
            f" {out}: holds a run already; ",
            Param("resume", True),
            " continues it, ",
            Param("overwrite", True),
            " starts over",
        )
    if resume and not checkpoint_files(out):
        log(f"elmo-fast: no checkpoint in {out} to resume from, starting from the beginning")
    if overwrite and not resume:
        for p in checkpoint_files(out):
            p.unlink()
