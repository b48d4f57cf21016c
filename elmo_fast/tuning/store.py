"""Where calibrations are kept between processes: one small JSON file per key under
``<cache>/calibration/`` (:func:`~elmo_fast.cache_dir.cache_dir`), written through :mod:`elmo_fast.durable`
(whole or not at all).

A record holds its key (:mod:`~elmo_fast.tuning.key`), the choice, and what it rests on: the margin by
which the choice beat the kernels' defaults and the spread it had to exceed, the row count a later process
re-checks, the candidates the reference gate left out, how busy the machine was, when and how long it
measured, and the timings. A file is used only when it parses, holds exactly the key asked for and a
record :func:`parse` accepts; anything else (a file cut short, edited, from another machine or version) is
ignored, and the next calibration replaces it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..bilm.cpu_choices import CpuTuning
from ..cache_dir import cache_dir
from ..durable import write_json
from .calibration import Outcome
from .key import digest, key_text


def store_dir() -> Path:
    return cache_dir() / "calibration"


def path_for(key: dict, directory: Path | None = None) -> Path:
    return (directory or store_dir()) / f"{digest(key)}.json"


@dataclass
class Record:
    """A stored calibration (see the module's docstring); ``data``: the whole file as read."""

    key: dict
    tuning: CpuTuning
    margin: float | None
    spread: float | None
    check: dict | None
    excluded: list[dict]
    busy: float
    data: dict = field(default_factory=dict)


def _number(v) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"not a number: {v!r}")
    return float(v)


def parse(data: object) -> Record:
    """The record in a file's JSON; ValueError for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
        raise ValueError("not a calibration record")
    check = data.get("check")
    if check is not None and not (
        isinstance(check, dict)
        and isinstance(check.get("rows"), int)
        and not isinstance(check["rows"], bool)
        and check["rows"] > 0
    ):
        raise ValueError(f"not a check: {check!r}")
    excluded = data.get("excluded", [])
    if not isinstance(excluded, list) or not all(isinstance(e, dict) for e in excluded):
        raise ValueError("excluded must be a list of objects")
    busy = _number(data.get("busy", 0.0))
    return Record(
        key=data["key"],
        tuning=CpuTuning.from_dict(data.get("tuning")),
        margin=_number(data.get("margin")),
        spread=_number(data.get("spread")),
        check=check,
        excluded=excluded,
        busy=0.0 if busy is None else busy,
        data=data,
    )


def load(key: dict, directory: Path | None = None) -> Record | None:
    """The record stored for ``key``; None when there is none or the file is not one to trust."""
    try:
        with open(path_for(key, directory), encoding="utf-8") as f:
            record = parse(json.load(f))
    except (OSError, ValueError, TypeError, UnicodeDecodeError, RecursionError):
        return None
    return record if key_text(record.key) == key_text(key) else None


def save(key: dict, outcome: Outcome, seconds: float, directory: Path | None = None) -> Path:
    """Write ``outcome`` for ``key``; raises WriteError/OSError."""
    path = path_for(key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        path,
        _jsonable(
            {
                "key": key,
                "tuning": outcome.tuning.to_dict(),
                "margin": outcome.margin,
                "spread": outcome.spread,
                "highway": outcome.highway,
                "check": outcome.check,
                "excluded": outcome.excluded,
                "busy": round(outcome.busy, 4),
                "complete": outcome.complete,
                "seconds": round(seconds, 4),
                "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "notes": outcome.notes,
                "report": outcome.report,
            }
        ),
    )
    return path


def records(directory: Path | None = None) -> list[tuple[Path, Record | None]]:
    """Every file of the store, oldest first, with its record (None: a file not to trust)."""
    folder = directory or store_dir()
    try:
        paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return []
    out: list[tuple[Path, Record | None]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                out.append((path, parse(json.load(f))))
        except (OSError, ValueError, TypeError, UnicodeDecodeError, RecursionError):
            out.append((path, None))
    return out


def remove(paths: list[Path]) -> int:
    """Delete these records (and the lock files beside them); returns how many records went."""
    gone = 0
    for path in paths:
        try:
            os.unlink(path)
            gone += 1
        except FileNotFoundError:
            pass
        try:
            os.unlink(path.with_suffix(".lock"))
        except FileNotFoundError:
            pass
    return gone


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    return x
