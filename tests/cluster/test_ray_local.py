"""The tests' local Ray (tests/support/ray_local.py): where Ray is installed but cannot start, its tests skip
saying why, except under CI, where they fail: a CI run whose Ray tests all skipped must not pass."""

from __future__ import annotations

import pytest
import ray_local


@pytest.fixture
def ray_that_cannot_start(monkeypatch):
    ray = pytest.importorskip("ray", reason='Ray is not installed: pip install "elmo-fast[ray]"')

    def init(*args, **kwargs):
        raise RuntimeError("no room for the object store\nsecond line")

    monkeypatch.setattr(ray, "init", init)


@pytest.mark.parametrize("ci", ["", "0", "false"])
def test_a_ray_that_cannot_start_skips_saying_why(ray_that_cannot_start, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"^a local Ray could not start here: RuntimeError: no room"):
        next(ray_local.local_ray())


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_under_ci_a_ray_that_cannot_start_fails(ray_that_cannot_start, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"could not start here: .*CI is set: Ray is installed"):
        next(ray_local.local_ray())
