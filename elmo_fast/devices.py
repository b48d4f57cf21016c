"""Where a model runs: device strings checked once, with an error that says how to get CUDA."""

from __future__ import annotations

import torch

from .errors import ElmoFastError


def resolve_device(device: str | int | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device``, or an int as allennlp's ``cuda_device``
    (-1: the CPU, N >= 0: ``cuda:N``) -> a checked ``torch.device``."""
    if isinstance(device, int) and not isinstance(device, bool):
        # torch.device(N) is cuda:N too, but torch has no int for the CPU: allennlp's -1 is
        if device < -1:
            raise ElmoFastError(f"invalid device {device}: as an int, -1 is the CPU and N >= 0 the GPU cuda:N")
        device = "cpu" if device == -1 else f"cuda:{device}"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ElmoFastError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        how = ""
        if torch.version.cuda is None:  # the usual cause: pip's default torch wheel is CPU-only here
            from .bilm.ops import cuda_kernels_missing_reason

            how = f"; {cuda_kernels_missing_reason()}"
        raise ElmoFastError(
            f"device {str(dev)!r} requested, but torch sees no CUDA GPU "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False){how}"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ElmoFastError(f"device {str(dev)!r} is not supported: use 'cpu' or 'cuda[:N]'")
    return dev
