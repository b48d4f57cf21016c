"""Running under ``torchrun``: one process per rank, gloo on CPUs, NCCL on GPUs."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's environment (0, 1, 0, 1 alone)."""
    env = os.environ
    return (int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))))


def distributed_setup(device: str) -> str:
    """Join the process group when torchrun started us (once), and pick this rank's device: a CUDA
    device becomes ``cuda:LOCAL_RANK``; on CPU the cores are split among the local ranks."""
    rank, world_size, local_rank, local_world = world()
    if world_size <= 1:
        return device
    use_cuda = device.startswith("cuda")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return device
