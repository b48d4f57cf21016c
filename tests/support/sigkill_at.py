"""``elmo-fast`` with a SIGKILL (or a pause) at a set moment of an embed run: the tests' hooks, kept out of the package.

    ELMO_FAST_TEST_SIGKILL=RANK:EVENT:N:MARKER python tests/support/sigkill_at.py embed ...

runs ``elmo-fast embed ...`` (under torchrun too: give this file instead of ``-m elmo_fast``) and
SIGKILLs rank RANK at its N-th EVENT: "batch" (a batch embedded and written, its window's shard
half-written), "window" (a shard complete) or "assemble" (a sentence copied into the output, rank 0).
Once only: the file MARKER is created first, and while it exists nothing is killed, so that the
restarted or resumed run goes through. The events are the pipeline's own stages, wrapped here.

    ELMO_FAST_TEST_PAUSE=RANK:EVENT:N:GATE python tests/support/sigkill_at.py embed ...

pauses instead, mid-run with everything it holds (its lock, its temporary files): at the N-th EVENT
it creates ``GATE.PID.reached`` and waits until the file GATE exists.
"""

from __future__ import annotations

import os
import signal
import sys
import time

HOOK = "ELMO_FAST_TEST_SIGKILL"
PAUSE_HOOK = "ELMO_FAST_TEST_PAUSE"
EVENTS = ("batch", "window", "assemble")


def _kill_once(marker: str) -> None:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # killed once already: this is the run that goes through
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(gate: str) -> None:
    os.close(os.open(f"{gate}.{os.getpid()}.reached", os.O_CREAT | os.O_WRONLY))
    deadline = time.monotonic() + 300  # a test that never opens the gate must not leave this running
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


def install(spec: str, rank: int, hook: str = HOOK) -> None:
    """Wrap the stage that ``spec`` (RANK:EVENT:N:FILE) names, in this process, if it is that rank's:
    a SIGKILL (``hook`` :data:`HOOK`) or a pause (:data:`PAUSE_HOOK`) at that moment."""
    parts = spec.split(":", 3)
    if len(parts) != 4 or not parts[0].isdigit() or parts[1] not in EVENTS or not parts[2].isdigit():
        raise SystemExit(f"{hook}={spec!r}: expected RANK:EVENT:N:FILE with EVENT one of {', '.join(EVENTS)}")
    if int(parts[0]) != rank:
        return
    from elmo_fast.embedding import assembly, progress, writers

    owner, name = {
        "batch": (progress.Progress, "batch_done"),
        "window": (writers.ShardWriter, "record"),
        "assemble": (assembly, "copy_float32"),
    }[parts[1]]
    real = getattr(owner, name)
    count = [0]
    act = _kill_once if hook == HOOK else _pause

    def then_act(*args, **kwargs):
        result = real(*args, **kwargs)
        count[0] += 1
        if count[0] == int(parts[2]):
            act(parts[3])
        return result

    setattr(owner, name, then_act)


if __name__ == "__main__":
    for _hook in (HOOK, PAUSE_HOOK):
        if os.environ.get(_hook):
            install(os.environ[_hook], int(os.environ.get("RANK", "0")), _hook)
    from elmo_fast.cli import main

    sys.exit(main(sys.argv[1:]))
