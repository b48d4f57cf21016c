"""The test run's one local Ray: ``ray.init(num_cpus=2)`` once per run (the session fixture :func:`ray_cluster`),
in a private temporary folder, shut down when the run ends. The Ray tests (tests/cluster) use it, and so do
docs/ray.md's examples (tests/docs/test_readme.py runs each in a child process that joins it, :data:`JOIN_CODE`,
in the folder where this Ray's workers run, :func:`ray_workdir`: a relative path in a task means the same file
there as in the example, as it does on the local Ray an example starts for itself).

Where Ray is not installed, they skip, saying how to install it. Where it is installed but cannot start, they
skip saying why, except under CI (``CI`` set to ``true`` or ``1``, as CI services set it), where that is an
error: a CI run whose Ray tests all skipped must not pass."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

INSTALL = 'pip install "elmo-fast[ray]" (the README\'s test command installs it with the [test] extra)'
#: the CPUs of the shared Ray: docs/ray.md's ``ray.init(num_cpus=2)``, which the examples' children may repeat
CPUS = 2
#: the running Ray's working folder ("workdir"), set while it runs
_STARTED: dict[str, str] = {}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def ray_cluster():
    """The ``ray`` module with the run's local Ray started (once, at the first test that asks for it)."""
    yield from local_ray()


def local_ray():
    """Start a local Ray, yield the ``ray`` module, shut it down: skips (fails under CI) as the module says."""
    try:
        import ray
    except ImportError as e:
        pytest.skip(f"Ray is not installed ({e}): {INSTALL}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a short private folder: Ray's sockets live under it (a Unix socket's path is limited to ~107 bytes)
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp" if os.path.isdir("/tmp") else None)
    # the workers' working folder is the one Ray starts in (its processes inherit it)
    workdir, here = tempfile.mkdtemp(prefix="ray-work-"), os.getcwd()
    try:
        os.chdir(workdir)
        ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False, _temp_dir=temp, configure_logging=False)
    except Exception as e:  # noqa: BLE001  (whatever stops Ray from starting here is said)
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
        why = f"a local Ray could not start here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if in_ci():
            pytest.fail(f"{why} (CI is set: Ray is installed, so its tests must run)", pytrace=False)
        pytest.skip(why)
    finally:
        os.chdir(here)
    _STARTED["workdir"] = workdir
    try:
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()
        _STARTED.clear()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_workdir(ray_cluster) -> Path:
    """The folder the run's Ray workers run in: a relative path in a task leads there."""
    return Path(_STARTED["workdir"])


def address(ray_module) -> str:
    """The running Ray's address, for a child process to join (``RAY_ADDRESS``)."""
    return ray_module.get_runtime_context().gcs_address


#: Prepended to a docs example run in a child process: its ``ray.init(num_cpus=2)`` joins the run's Ray (at
#: ``RAY_ADDRESS``, which has those CPUs) instead of starting one; Ray refuses resources when joining, so they
#: are checked here against the shared Ray's and dropped. ``ray.shutdown()`` then only disconnects the child.
JOIN_CODE = f"""
import ray as _ray

_ray_init = _ray.init


def _join_the_runs_ray(*args, num_cpus=None, num_gpus=None, **kwargs):
    assert num_cpus in (None, {CPUS}) and not num_gpus, (
        f"the example asks Ray for num_cpus={{num_cpus}}, num_gpus={{num_gpus}}: the tests' shared Ray has {CPUS} CPUs"
    )
    return _ray_init(*args, **kwargs)


_ray.init = _join_the_runs_ray
"""
