"""Running under ``torchrun``: one process per rank, gloo on CPUs, NCCL on GPUs.

Used by ``elmo-fast train`` (DistributedDataParallel) and ``elmo-fast embed`` (each rank embeds its
share of the input's windows; see :mod:`elmo_fast.embedding.ranks`).
"""

from __future__ import annotations

import datetime
import os
import secrets
import time

import torch
import torch.distributed as dist


def world() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's environment (0, 1, 0, 1 alone)."""
    env = os.environ
    return (
        int(env.get("RANK", 0)),
        int(env.get("WORLD_SIZE", 1)),
        int(env.get("LOCAL_RANK", 0)),
        int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))),
    )


def launched() -> bool:
    """Whether a launcher (torchrun, or anything following torch.distributed's ``env://`` contract)
    started this process as one rank of a group, even a group of one."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a batch system may restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_device(device: str) -> str:
    """This rank's device: a CUDA device becomes ``cuda:LOCAL_RANK`` (set as the current one); on CPU
    the cores are split evenly among the ranks of this node (``torch.set_num_threads``; torchrun's
    OMP_NUM_THREADS=1 would leave all but one core of each rank's share idle)."""
    _, _, local_rank, local_world = world()
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    torch.set_num_threads(max(1, usable_cores() // max(1, local_world)))
    return device


def distributed_setup(device: str, backend: str | None = None, timeout: datetime.timedelta | None = None) -> str:
    """Join the process group when torchrun started us (once), and pick this rank's device (see
    :func:`rank_device`). backend: NCCL for CUDA devices and gloo otherwise, unless given (``embed``
    sends only small control messages, so it always uses gloo). timeout: of every collective call
    (torch's default, 30 minutes, unless given)."""
    _, world_size, _, _ = world()
    if world_size <= 1:
        return device
    device = rank_device(device)
    if not dist.is_initialized():
        init_group(backend or ("nccl" if device.startswith("cuda") else "gloo"), timeout)
    return device


def leave_group() -> None:
    """Destroy the process group, if this process joined one, while the interpreter is whole: a gloo
    group left to the interpreter's exit can abort the process there (SIGABRT, "terminate called
    without an active exception": its threads still hold tensors; pytorch issue 190489), which
    turned a finished ``train`` under torchrun into a failed one now and then."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def init_group(backend: str, timeout: datetime.timedelta | None = None) -> None:
    """``init_process_group`` from torchrun's environment, safe across torchrun's restarts.

    torchrun's c10d rendezvous hands every attempt of a group the same store (the agent's, kept
    across restarts), so the keys through which an earlier attempt's ranks found each other are
    still there: a restarted rank may read a dead peer's address and fail to connect ("Connection
    refused"), a race that fails a restart now and then (pytorch issue 135712). Here the ranks of
    one attempt first agree on a fresh random name for their keys, in an exchange that no key of an
    earlier attempt can satisfy (see :func:`_fresh_prefix`), and build the group under it.
    """
    kwargs = {} if timeout is None else {"timeout": timeout}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend=backend, **kwargs)  # a fresh store per attempt: nothing stale
        return
    rank, world_size, _, _ = world()
    limit = timeout or datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=limit
    )
    prefix = _fresh_prefix(store, rank, world_size, limit.total_seconds())
    dist.init_process_group(
        backend=backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size, **kwargs
    )


def _fresh_prefix(store, rank: int, world_size: int, limit_s: float) -> str:
    """A name all ranks of this attempt agree on, whatever earlier attempts left in the store.

    Every other rank posts a fresh nonce; rank 0 answers each with ``nonce:epoch`` for its own fresh
    epoch, and waits for each rank to acknowledge with that epoch. A rank accepts only an answer to
    its own nonce, rank 0 only acknowledgements of its own epoch: stale keys match neither."""
    deadline = time.monotonic() + limit_s
    root = "elmo_fast/group/"

    def get(key: str) -> str | None:
        return store.get(key).decode() if store.check([key]) else None

    def tick() -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {rank}: the ranks of this torchrun attempt did not all meet within {limit_s:.0f} s"
            )
        time.sleep(0.01)

    if rank == 0:
        epoch = secrets.token_hex(8)
        waiting = set(range(1, world_size))
        while waiting:
            for r in sorted(waiting):
                nonce = get(f"{root}ask/{r}")
                if nonce is not None:
                    store.set(f"{root}answer/{r}", f"{nonce}:{epoch}")
                ack = get(f"{root}ack/{r}")
                if ack is not None and ack.endswith(f":{epoch}"):
                    waiting.discard(r)
            if waiting:
                tick()
        return f"{root}{epoch}/"
    nonce = secrets.token_hex(8)
    store.set(f"{root}ask/{rank}", nonce)
    while True:
        answer = get(f"{root}answer/{rank}")
        if answer is not None and answer.startswith(f"{nonce}:"):
            epoch = answer.split(":", 1)[1]
            store.set(f"{root}ack/{rank}", answer)
            return f"{root}{epoch}/"
        tick()
