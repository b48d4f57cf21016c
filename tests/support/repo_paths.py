"""Where things are, for the tests and their helpers: one place instead of ``Path(__file__).parents[N]``
in each file (the tests sit in room folders, tests/<room>/; their helpers here, in tests/support/)."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
