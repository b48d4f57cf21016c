"""The settings a test asks for itself, where it needs other than a user's defaults (the suite runs those:
tests/docs/test_suite_defaults.py):

* ``selfcheck_mode``: the first-use self-check (ELMO_FAST_SELFCHECK) in a given mode in this process, with
  nothing checked yet; the mode and what was checked before come back after;
* ``calibration_off``: the CPU kernels in their default schedule (ELMO_FAST_CALIBRATION=off), for a test
  about what the defaults do (a subprocess is given the variable in its environment instead).
"""

import pytest

from elmo_fast.verification import first_use


@pytest.fixture
def selfcheck_mode():
    """``selfcheck_mode("all,strict")``: ELMO_FAST_SELFCHECK's values (None or "0": off)."""
    before = first_use.mode()
    saved = (set(first_use._passed), dict(first_use._failed))

    def enable(mode):
        first_use.forget_checked()
        first_use.enable(mode)

    yield enable
    first_use.enable(before)
    first_use.forget_checked()
    first_use._passed.update(saved[0])
    first_use._failed.update(saved[1])


@pytest.fixture
def calibration_off(monkeypatch):
    """The CPU kernels' default schedule for this test (models built in it measure nothing)."""
    monkeypatch.setenv("ELMO_FAST_CALIBRATION", "off")
