"""Where calibrations are kept between processes: one small JSON file per key under
``<cache>/calibration/`` (``<cache>``: ``$ELMO_FAST_CACHE``, else ``~/.cache/elmo_fast``), written through
:mod:`elmo_fast.durable` (whole or not at all).

A key names everything a choice depends on: the CPU (model name, logical CPUs), torch's and
elmo-fast's versions and the compiled extension itself (its size and time), the model's shapes, the
precision and the thread count. A file is used only when it parses, holds exactly the key asked for,
and a tuning that :meth:`~elmo_fast.bilm.calibration.CpuTuning.from_dict` accepts; anything else (a
file cut short, edited, from another machine or version) is ignored, and the next calibration
replaces it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import time
from pathlib import Path

import torch

from ..cache_dir import cache_dir
from ..durable import write_json
from .calibration import CpuTuning

#: the layout of the files; another one is ignored
FORMAT = 1


def store_dir() -> Path:
    return cache_dir() / "calibration"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else the platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def _extension_id() -> str:
    """The compiled extension's size and modification time: a rebuilt kernel is measured again."""
    spec = importlib.util.find_spec("elmo_fast._C")
    if spec is None or not spec.origin:
        return "none"
    try:
        st = os.stat(spec.origin)
    except OSError:
        return "none"
    return f"{st.st_size}-{st.st_mtime_ns}"


@functools.cache
def _elmo_fast_version() -> str:
    try:
        from importlib.metadata import version

        return version("elmo-fast")
    except Exception:  # not installed as a distribution (a source tree on sys.path)
        return "unknown"


def calibration_key(shapes: dict, precision: str, threads: int) -> dict:
    """The key of a calibration: this machine, these versions, the model's ``shapes`` (plain ints and
    lists), ``precision`` and ``threads``."""
    return {
        "format": FORMAT,
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "elmo_fast": _elmo_fast_version(),
        "extension": _extension_id(),
        "shapes": shapes,
        "precision": precision,
        "threads": threads,
    }


def key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def path_for(key: dict, directory: Path | None = None) -> Path:
    digest = hashlib.sha256(key_text(key).encode()).hexdigest()[:24]
    return (directory or store_dir()) / f"{digest}.json"


def load(key: dict, directory: Path | None = None) -> CpuTuning | None:
    """The tuning stored for ``key``; None when there is none or the file is not one to trust."""
    path = path_for(key, directory)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("key") != json.loads(key_text(key)):
            return None
        return CpuTuning.from_dict(data.get("tuning"))
    except (OSError, ValueError, TypeError, UnicodeDecodeError, RecursionError):
        return None


def save(key: dict, tuning: CpuTuning, report: dict, seconds: float, directory: Path | None = None) -> Path:
    """Write ``tuning`` for ``key`` (with the timings it came from); raises WriteError/OSError."""
    path = path_for(key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        path,
        {
            "key": json.loads(key_text(key)),
            "tuning": tuning.to_dict(),
            "seconds": round(seconds, 4),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "report": _jsonable(report),
        },
    )
    return path


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    return x
