"""A local Ray for a test module: ``ray.init(num_cpus=2)`` once, in a private temporary folder, shut down
after the module. Skips, saying why and how to install it, where Ray is not installed or cannot start."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

INSTALL = 'pip install "elmo-fast[ray]" (the README\'s test command installs it with the [test] extra)'


def local_ray():
    """A generator for a module-scoped fixture: yields the ``ray`` module with a local Ray running."""
    try:
        import ray
    except ImportError as e:
        pytest.skip(f"Ray is not installed ({e}): {INSTALL}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a short private folder: Ray's sockets live under it (a Unix socket's path is limited to ~107 bytes)
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp, configure_logging=False)
    except Exception as e:  # noqa: BLE001  (whatever stops Ray from starting here is a reason to skip, said)
        shutil.rmtree(temp, ignore_errors=True)
        pytest.skip(f"a local Ray could not start here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    try:
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
