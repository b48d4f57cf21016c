"""`elmo-fast` and other programs as subprocesses under torchrun (CPU, gloo): the environment they get (the
repository importable, no rank variables or kill hook inherited from the caller) and a runner."""

from __future__ import annotations

import os
import sys

import cli_process
from repo_paths import REPO
from sigkill_at import HOOK as KILL_HOOK

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
for _name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", KILL_HOOK):
    ENV.pop(_name, None)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def run(*args, env=ENV, timeout=300):
    return cli_process.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=timeout)
