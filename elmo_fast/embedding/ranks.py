"""One rank of a group (``torchrun``) embedding a corpus together.

* **Shares**: the input's windows are dealt round-robin, window k to rank k % world, k counting the
  windows still to embed (those that completed shards of an earlier attempt hold are skipped by
  every rank, and do not count). Every rank reads the whole input, from a filesystem they all
  share, and embeds only its own windows: reading and splitting lines runs at millions of tokens/s,
  far above what one rank embeds. Round-robin needs no count of the input beforehand (it streams,
  compressed input included), and spreads long and short stretches of a corpus evenly.
* **The start**: rank 0 alone checks the output, prepares the work directory (the resume
  machinery's ``OUTPUT.partial/``) and removes what a killed attempt left half-written; then it
  sends every rank the list of complete shards, so that all of them deal the remaining windows
  from the same list, and a token that each rank must find in the work directory (which proves
  that the directory is shared).
* **Progress**: each rank rewrites a small file ``progress-RANK.json`` in the work directory about
  once a second; rank 0 sums them into its one bar (tokens/s of all ranks).
* **The end**: each rank enters an asynchronous barrier after its last window; rank 0, its bar
  still moving, waits for everyone, then assembles OUTPUT from the shards.

Only small control messages go through torch.distributed (gloo, even when the ranks embed on GPUs).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from typing import Any

from .. import durable
from ..distributed import world
from ..errors import ElmoFastError
from ..host import host_name
from .lines import Line
from .output_checks import finished_already
from .output_lock import hold_output
from .writers import ShardWriter

#: seconds between a rank's progress files, and between rank 0's reads of them
PROGRESS_EVERY = 1.0


class Ranks:
    """This process's place in the group, and the group's shared state in the work directory."""

    def __init__(self, rank: int, world_size: int, work: str) -> None:
        self.rank = rank
        self.world = world_size
        self.work = work
        self.host = host_name()
        self.token: str | None = None  # this attempt's, chosen by rank 0
        self._published = float("-inf")
        self._barrier = None

    @classmethod
    def join(cls, work: str) -> Ranks:
        """From the initialised default process group, or alone (rank 0 of 1) without one."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), work)
        rank, world_size, _, _ = world()
        if world_size > 1:
            raise ElmoFastError(
                f"this process is rank {rank} of {world_size} (WORLD_SIZE), but no torch.distributed "
                f"process group is initialised: call torch.distributed.init_process_group() first "
                f"(`elmo-fast embed` under torchrun does)"
            )
        return cls(0, 1, work)

    def owns(self, k: int) -> bool:
        """Whether window k (counted among the windows still to embed) is this rank's."""
        return k % self.world == self.rank

    def broadcast(self, message: Any) -> Any:
        """Rank 0's message, on every rank."""
        if self.world == 1:
            return message
        import torch.distributed as dist

        box = [message]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # --- progress files ------------------------------------------------------------------------------

    def _progress_path(self, rank: int) -> str:
        return os.path.join(self.work, f"progress-{rank:05d}.json")

    def new_attempt(self) -> str:
        """Rank 0: a fresh token for this attempt, in its own progress file (which proves to the
        others that they see the same directory). Files of earlier attempts go first."""
        for name in os.listdir(self.work):
            if name.startswith("progress-"):
                os.unlink(os.path.join(self.work, name))
        self.token = secrets.token_hex(8)
        self.publish({"tokens": 0, "sentences": 0}, force=True)
        return self.token

    def check_shared(self, token: str) -> None:
        """Every other rank: rank 0's progress file must hold the token rank 0 sent."""
        self.token = token
        path = self._progress_path(0)
        try:
            with open(path, encoding="utf-8") as f:
                seen = json.load(f).get("token")
        except (OSError, ValueError):
            seen = None
        if seen != token:
            raise ElmoFastError(
                f"rank {self.rank} (host {self.host}) does not see the work directory that rank 0 "
                f"prepared ({path} is {'missing' if seen is None else 'of another attempt'}): the "
                f"output's directory must be on a filesystem that every rank shares"
            )

    def publish(self, record: dict, force: bool = False) -> None:
        """Write this rank's counts (at most every PROGRESS_EVERY seconds unless forced); advisory, so
        written atomically but not fsync'ed."""
        now = time.monotonic()
        if not force and now - self._published < PROGRESS_EVERY:
            return
        self._published = now
        durable.write_json(
            self._progress_path(self.rank),
            {**record, "token": self.token, "rank": self.rank, "host": self.host},
            indent=None,
            sync=False,
        )

    def others(self) -> list[dict]:
        """The latest counts of every other rank in this attempt (a rank yet to write any: none)."""
        out = []
        for rank in range(self.world):
            if rank == self.rank:
                continue
            try:
                with open(self._progress_path(rank), encoding="utf-8") as f:
                    record = json.load(f)
            except (OSError, ValueError):  # not written yet (or replaced as we opened it)
                continue
            if record.get("token") == self.token:
                out.append(record)
        return out

    # --- the end -------------------------------------------------------------------------------------

    def arrive(self) -> None:
        """This rank has embedded all its windows (its final counts published)."""
        if self.world > 1:
            import torch.distributed as dist

            self._barrier = dist.barrier(async_op=True)

    def everyone_arrived(self) -> bool:
        return self._barrier is None or self._barrier.is_completed()

    def wait(self) -> None:
        """Until every rank has arrived (raises if one failed)."""
        if self._barrier is not None:
            self._barrier.wait()
            self._barrier = None


# --- the start -------------------------------------------------------------------------------------------


def start_group(
    ranks: Ranks,
    output: str,
    manifest: dict,
    lines: Iterator[Line],
    name: str,
    overwrite: bool,
    progress: bool | str,
    held: contextlib.ExitStack,
) -> ShardWriter | None:
    """The start of a group's run: rank 0 takes the output's lock (into ``held``, for the run),
    checks the output, prepares the work directory and sends the others what is done already; every
    other rank checks that it sees that directory and the same input. Returns this rank's writer,
    opened (its ``done``: the complete shards, the same on every rank), or None when the output is
    complete already."""
    patience = 60.0 if ranks.world > 1 else 0.0  # for shards renamed on other machines to show (NFS)
    if ranks.rank == 0:
        writer = None
        try:
            held.enter_context(hold_output(output))  # one group per output; its failure is told to the others
            if finished_already(output, manifest, lines, name, overwrite, True):
                if progress:
                    print(f"elmo-fast: {output} is complete already: nothing to resume", file=sys.stderr)
            else:
                writer = ShardWriter(output, manifest, role="leader", patience=patience)
                writer.open()
                if writer.complete:  # killed between assembling the file and renaming it: finish that
                    writer.finish(0)
                    writer = None
            message = (
                {"state": "finished"}
                if writer is None
                else {
                    "state": "go",
                    "token": ranks.new_attempt(),
                    "done": writer.done,
                    "input_bytes": os.path.getsize(name),
                }
            )
        except Exception as e:  # the others wait for a message: tell them, rather than leave them to a timeout
            parts = e.parts if isinstance(e, ElmoFastError) else (f"{type(e).__name__}: {e}",)
            ranks.broadcast({"state": "failed", "parts": parts})
            raise
        ranks.broadcast(message)
        return writer
    message = ranks.broadcast(None)
    if message["state"] == "failed":
        raise ElmoFastError("rank 0 stopped: ", *message["parts"])
    if message["state"] == "finished":
        return None
    ranks.check_shared(message["token"])
    size = os.path.getsize(name)
    if size != message["input_bytes"]:
        raise ElmoFastError(
            f"rank {ranks.rank} (host {ranks.host}) reads {name} of {size:,} bytes, rank 0 one of "
            f"{message['input_bytes']:,} bytes: every rank must read the same input, from a "
            f"filesystem that all of them share"
        )
    writer = ShardWriter(output, manifest, role="member", patience=patience)
    writer.open()
    writer.done = message["done"]
    return writer
