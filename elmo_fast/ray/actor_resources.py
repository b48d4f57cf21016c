"""What Ray gave the actor this code runs in, and what follows for the model: the device (the GPU Ray
assigned, when it assigned one) and the CPU threads (as many as the CPUs it assigned, at least one).

Ray starts each actor with the CPUs and GPUs its caller asked for (``map_batches(num_cpus=...,
num_gpus=...)``, a deployment's ``ray_actor_options``), and hides the other GPUs from it; torch would
otherwise use every core of the node in each actor, and actors sharing cores run slower together
than apart. Outside a Ray actor nothing is changed: the device is the CPU unless told otherwise."""

from __future__ import annotations

import math
import sys


def _assigned() -> dict[str, float] | None:
    """The resources Ray assigned to the current actor; None outside a Ray actor (Ray not imported,
    not initialised, or this is the driver)."""
    ray = sys.modules.get("ray")  # an actor has imported Ray before it runs any of our code
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return None
    return dict(context.get_assigned_resources())


def actor_device(device: str | None) -> str:
    """``device`` as given; None: ``"cuda"`` in a Ray actor that was assigned a GPU (Ray makes it
    the only one visible), else ``"cpu"``."""
    if device is not None:
        return device
    resources = _assigned()
    return "cuda" if resources and resources.get("GPU", 0) > 0 else "cpu"


def use_assigned_cpus() -> int | None:
    """In a Ray actor: torch's threads set to the CPUs Ray assigned it (rounded up, at least 1), which
    is returned; outside one, nothing is changed (None)."""
    resources = _assigned()
    if resources is None:
        return None
    import torch

    threads = max(1, math.ceil(resources.get("CPU", 1)))
    torch.set_num_threads(threads)
    return threads
