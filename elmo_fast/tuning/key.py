"""The calibration's key: everything a measured choice depends on, built in this one place.

* the machine and what its kernels dispatch on (:func:`~elmo_fast.tuning.dispatch.report`: the CPU's model,
  logical CPUs, instruction-set flags, ATen's kernel level, which packed GEMMs run, the dispatch variables);
* torch's and elmo-fast's versions, and the compiled extension itself (its size and time: a rebuilt kernel
  is measured again);
* the model's GEMM shapes (:func:`model_shapes`), the precision and torch's thread count.

The variables that force a schedule are not in it: where one is set, nothing is measured or stored
(:mod:`~elmo_fast.tuning.environment`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence

import torch
from torch import Tensor

from . import dispatch

#: the layout of the key and of the store's records; another one is ignored
FORMAT = 2


@functools.cache
def _extension_id() -> str:
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


def model_shapes(lstm_weights: Sequence[Tensor], highway: tuple | None) -> dict:
    """What a calibration of this model depends on: its GEMM shapes, plain ints
    (``lstm``: [layers, P, C]; ``highway``: [layers, 2F, F, P])."""
    w_proj = lstm_weights[3]
    out = {"lstm": [len(lstm_weights) // 8, int(w_proj.shape[0]), int(w_proj.shape[1])]}
    if highway is not None and highway[0]:
        out["highway"] = [len(highway[0]), *map(int, highway[0][0].shape), int(highway[2].shape[0])]
    return out


def calibration_key(shapes: dict, precision: str, threads: int) -> dict:
    """The key of a calibration of a model of these ``shapes`` in ``precision`` at ``threads`` threads,
    on this machine as its kernels see it now."""
    return {
        "format": FORMAT,
        "dispatch": dispatch.report(),
        "torch": torch.__version__,
        "elmo_fast": _elmo_fast_version(),
        "extension": _extension_id(),
        "shapes": shapes,
        "precision": precision,
        "threads": threads,
    }


def key_text(key: dict) -> str:
    """The key as canonical JSON (what the store compares)."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def digest(key: dict) -> str:
    """A short name for the key (the store's file name)."""
    return hashlib.sha256(key_text(key).encode()).hexdigest()[:24]


def summary(key: dict) -> str:
    """One line: ``AMD EPYC (avx2 avx512 avx512_bf16; ATen AVX512; packed fp32 bf16), lstm [2, 512, 4096],
    fp32, 2 threads``."""
    d = key.get("dispatch", {})
    variables = " ".join(f"{k}={v}" for k, v in sorted(d.get("variables", {}).items()))
    where = f"{d.get('cpu', '?')} ({' '.join(d.get('flags', [])) or 'no vector flags'}; ATen {d.get('aten', '?')}; "
    where += f"packed {' '.join(d.get('packed', [])) or 'none'}{'; ' + variables if variables else ''})"
    shapes = ", ".join(f"{name} {value}" for name, value in key.get("shapes", {}).items())
    return f"{where}, {shapes}, {key.get('precision')}, {key.get('threads')} threads"
