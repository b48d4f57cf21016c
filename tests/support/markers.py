"""The markers that a test's fixtures and parameters imply, added at collection (pyproject.toml registers
every marker; the ones a test states itself, ``slow``, ``peers`` and ``network``, are written beside it):

* ``cuda``: a case on the "cuda" target, or a test asking for ``cuda_target`` (tests/support/cuda_targets.py);
* ``emulator``: a case on the "emulated" target, or a test asking for one of :data:`EMULATOR_FIXTURES`; these are also
  ``slow``: whichever of them runs first builds the emulator (minutes on two cores, measured with --durations:
  210 s of one test's setup), and each runs the kernels thread by thread;
* ``cluster``: a test on the run's one local Ray (``ray_cluster``, tests/support/ray_local.py); these are also
  ``slow``: whichever of them runs first starts the Ray (a minute or more on two cores: 99 s of one test's
  setup, measured), and Ray Data and Ray Serve start actors and replicas;
* ``network``: a test using one of :data:`NETWORK_FIXTURES`, which start a server on a loopback port.
"""

from __future__ import annotations

import pytest

#: the fixtures that load the CPU emulator of the CUDA kernels (cuda_targets.py; tests/bilm/test_doctor.py's)
EMULATOR_FIXTURES = {"emulated_target", "emulator", "emulated_cuda_kernels"}
#: the fixtures that start a server on a loopback port: `elmo-fast serve` (tests/serve), Ray Serve
#: (tests/cluster/test_ray_serve.py), the model downloads' HTTP server (tests/pretrained/test_hub.py)
NETWORK_FIXTURES = {"server", "gated_server", "guarded", "served", "serve"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("target") if callspec is not None else None
        if target == "cuda" or "cuda_target" in fixtures:
            item.add_marker(pytest.mark.cuda)
        if target == "emulated" or fixtures & EMULATOR_FIXTURES:
            item.add_marker(pytest.mark.emulator)
            item.add_marker(pytest.mark.slow)
        if "ray_cluster" in fixtures:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)
        if fixtures & NETWORK_FIXTURES:
            item.add_marker(pytest.mark.network)
