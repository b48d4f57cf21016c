#!/usr/bin/env python
"""Record simple_elmo 0.9.2's outputs (on TensorFlow) for the cases of tests/support/simple_elmo_models.py
into tests/fixtures/simple_elmo_0.9.2.npz, which tests/compat/test_simple_elmo.py compares elmo-fast with.

Run once, with the project's environment (it builds the random-weight archives with elmo-fast's
own writer and runs simple_elmo in its side environment as a subprocess; see
scripts/simple_elmo_peer.py for how to make that environment):

    python scripts/record_simple_elmo.py [--peer-python /work/simple_elmo_env/bin/python]

The fixture holds each call's result under "case/i" (arrays as float32 when simple_elmo's float64
values are float32 values, which its vectors are; sentence averages stay float64; substitutes as
JSON), the sha256 of each archive's weights ("digest/KIND", checked by the tests before comparing),
and how it was made ("about").
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

from simple_elmo_models import CASES, FIXTURE, PEER_PYTHON, run_peer, weights_digest  # noqa: E402

from elmo_fast.durable import durable_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default=str(PEER_PYTHON))
    parser.add_argument("--out", default=str(FIXTURE))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results, archives = run_peer(sorted(CASES), tmp, args.peer_python)
        digests = {f"digest/{kind}": np.array(weights_digest(path)) for kind, path in archives.items()}
    script = "import importlib.metadata as m; print(*(m.version(d) for d in ('simple_elmo', 'tensorflow-cpu', 'numpy')))"
    versions = subprocess.run([args.peer_python, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    packed = {}
    for key, value in results.items():
        if value.dtype == np.float64 and np.array_equal(value.astype(np.float32).astype(np.float64), value,
                                                        equal_nan=True):
            value = value.astype(np.float32)  # lossless: half the size
        packed[key] = value
    about = {"made_by": "scripts/record_simple_elmo.py", "simple_elmo": versions[0], "tensorflow_cpu": versions[1],
             "numpy": versions[2], "python": platform.python_version(), "machine": platform.machine()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with durable_path(args.out) as tmp_out:
        with open(tmp_out, "wb") as f:
            np.savez_compressed(f, about=np.array(json.dumps(about)), **digests, **packed)
    print(f"wrote {args.out}: {len(packed)} results, {about}")


if __name__ == "__main__":
    main()
