"""A training run's checkpoints: ``OUT/checkpoints/step-NNNNNNNNN.pt``, the newest :data:`KEEP` kept.

A checkpoint (a ``torch.save``'d dict) holds ``model`` and ``optimizer`` (state dicts), ``state``
(step, epoch, batch, tokens, best held-out perplexity, seconds, the carried LSTM states),
``identity`` (:meth:`TrainConfig.identity`) and, from format 2 on, ``fingerprint``
(:mod:`elmo_fast.training.run_fingerprint`).

Written through :mod:`elmo_fast.durable` (whole under its final name or absent; a failure is a
:class:`~elmo_fast.durable.WriteError`), and the older ones removed only once the new one is on
disk: a failed save leaves the previous checkpoint to resume from. Reading tries the newest first;
one that does not read whole (damaged by something other than elmo-fast: a disk, a copy, a hand)
is passed over with a note for the one before it; when none reads, the run stops and names each
file and why, rather than quietly starting again from step 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from ..durable import save_torch
from ..errors import InputError, Param
from . import run_fingerprint

CHECKPOINTS = "checkpoints"
FORMAT = 2
KEEP = 2
_NAME = re.compile(r"^step-(\d{9,})\.pt$")
_STATE_KEYS = ("step", "epoch", "batch", "tokens", "best", "seconds")


def checkpoint_files(out: str | Path) -> list[Path]:
    """The checkpoints of the run in ``out``, oldest first."""
    d = Path(out) / CHECKPOINTS
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if _NAME.match(p.name)), key=lambda p: int(_NAME.match(p.name).group(1)))


def save_checkpoint(out: str | Path, payload: dict) -> Path:
    """Write ``payload`` (its ``state["step"]`` names it) durably, then remove all but the newest
    :data:`KEEP`. Raises :class:`~elmo_fast.durable.WriteError`, with the older ones intact."""
    d = Path(out) / CHECKPOINTS
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step-{payload['state']['step']:09d}.pt"
    save_torch({**payload, "format": FORMAT}, path)
    for old in checkpoint_files(out)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict:
    """A checkpoint's payload, checked to hold what a resume needs; raises ValueError saying why not."""
    try:
        payload = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001  (torch reports a damaged file in many ways)
        raise ValueError(_one_line(e)) from None
    if not isinstance(payload, dict):
        raise ValueError(f"holds a {type(payload).__name__}, not a checkpoint")
    missing = [k for k in ("model", "optimizer", "state", "identity") if not isinstance(payload.get(k), dict)]
    missing += [f"state.{k}" for k in _STATE_KEYS if "state" not in missing and k not in payload["state"]]
    if missing:
        raise ValueError(f"not an elmo-fast checkpoint (no {', '.join(missing)})")
    named = int(_NAME.match(path.name).group(1)) if _NAME.match(path.name) else None
    if named is not None and payload["state"]["step"] != named:
        raise ValueError(f"holds step {payload['state']['step']}, not the step its name says")
    return payload


def newest_readable(
    out: str | Path, device: torch.device | str = "cpu", log: Callable[[str], None] = print
) -> tuple[Path, dict] | None:
    """The newest checkpoint of ``out`` that reads whole, and its payload; None when there is none.
    Unreadable newer ones are passed over with a note; when checkpoints exist and none reads, an
    :class:`~elmo_fast.errors.InputError` names each and why (resuming from nothing would silently
    throw the run away)."""
    files = checkpoint_files(out)
    failed: list[tuple[Path, str]] = []
    for path in reversed(files):
        try:
            payload = read_checkpoint(path, device)
        except ValueError as e:
            failed.append((path, str(e)))
            continue
        for bad, why in failed:
            log(f"elmo-fast: skipping unreadable checkpoint {bad} ({why}); resuming from {path.name}")
        return path, payload
    if failed:
        reasons = "; ".join(f"{p.name}: {why}" for p, why in failed)
        raise InputError(
            f"{Path(out) / CHECKPOINTS}: cannot resume: no checkpoint can be read ({reasons}); start over with ",
            Param("overwrite", True),
            " instead of ",
            Param("resume", True),
            " (it removes them), or put back a readable checkpoint",
        )
    return None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def checkpoint_to_resume(
    out: str | Path,
    fingerprint: dict,
    identity: dict,
    allow_changed: bool,
    device: torch.device | str = "cpu",
    log: Callable[[str], None] = print,
) -> tuple[Path, dict] | None:
    """:func:`newest_readable`, checked to be a checkpoint of this run: the vocabulary, corpus and
    settings it recorded (``fingerprint``, ``identity``: this run's) are compared; a difference is
    an InputError naming it, or a note when ``allow_changed``. A checkpoint from before the digests
    were kept is compared on its settings, with a note."""
    found = newest_readable(out, device, log)
    if found is None:
        return None
    path, payload = found
    then = payload.get("fingerprint")
    if then is None:
        log(f"elmo-fast: {path} predates the digests of the vocabulary and corpus: they are not compared")
    changes = run_fingerprint.changes(then, fingerprint, _with_precision(payload["identity"]), identity)
    if changes and not allow_changed:
        raise InputError(
            f"{out}: cannot resume: {'; '.join(changes)}; use the same inputs and settings, another ",
            Param("out"),
            ", or ",
            Param("allow_changed", True),
            " to continue with these (the model then comes from two different runs)",
        )
    if changes:
        log(f"elmo-fast: resuming although {'; '.join(changes)}")
    return path, payload


def _with_precision(identity: dict) -> dict:
    """A checkpoint's run identity with the precision under its current name (runs before
    ``--precision`` recorded it as ``dtype``, with the same values: fp32 or bf16)."""
    if "dtype" in identity and "precision" not in identity:
        identity = {("precision" if k == "dtype" else k): v for k, v in identity.items()}
    return identity
