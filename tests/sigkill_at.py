"""``elmo-fast`` with a SIGKILL at a set moment of an embed run: the tests' kill hook, kept out of the package.

    ELMO_FAST_TEST_SIGKILL=RANK:EVENT:N:MARKER python tests/sigkill_at.py embed ...

runs ``elmo-fast embed ...`` (under torchrun too: give this file instead of ``-m elmo_fast``) and
SIGKILLs rank RANK at its N-th EVENT: "batch" (a batch embedded and written, its window's shard
half-written), "window" (a shard complete) or "assemble" (a sentence copied into the output, rank 0).
Once only: the file MARKER is created first, and while it exists nothing is killed, so that the
restarted or resumed run goes through. The events are the pipeline's own stages, wrapped here.
"""
from __future__ import annotations

import os
import signal
import sys

HOOK = "ELMO_FAST_TEST_SIGKILL"
EVENTS = ("batch", "window", "assemble")


def _kill_once(marker: str) -> None:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # killed once already: this is the run that goes through
    os.kill(os.getpid(), signal.SIGKILL)


def install(spec: str, rank: int) -> None:
    """Wrap the stage that ``spec`` (RANK:EVENT:N:MARKER) names, in this process, if it is that rank's."""
    parts = spec.split(":", 3)
    if len(parts) != 4 or not parts[0].isdigit() or parts[1] not in EVENTS or not parts[2].isdigit():
        raise SystemExit(f"{HOOK}={spec!r}: expected RANK:EVENT:N:MARKER_FILE with EVENT one of {', '.join(EVENTS)}")
    if int(parts[0]) != rank:
        return
    from elmo_fast.embedding import assembly, progress, writers

    owner, name = {"batch": (progress.Progress, "batch_done"), "window": (writers.ShardWriter, "record"),
                   "assemble": (assembly, "copy_float32")}[parts[1]]
    real = getattr(owner, name)
    count = [0]

    def then_kill(*args, **kwargs):
        result = real(*args, **kwargs)
        count[0] += 1
        if count[0] == int(parts[2]):
            _kill_once(parts[3])
        return result

    setattr(owner, name, then_kill)


if __name__ == "__main__":
    if os.environ.get(HOOK):
        install(os.environ[HOOK], int(os.environ.get("RANK", "0")))
    from elmo_fast.cli import main

    sys.exit(main(sys.argv[1:]))
