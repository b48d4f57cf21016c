"""The first-use self-check (ELMO_FAST_SELFCHECK) in the mode a test asks for, in this process, with nothing
checked yet; the mode and what was checked before come back after. The suite runs the default mode, as a
user's process does: a test that needs another says so with this fixture (or sets the variable in a
subprocess's environment)."""

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
