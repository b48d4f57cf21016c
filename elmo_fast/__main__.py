"""``python -m elmo_fast``: the ``elmo-fast`` command (what ``torchrun -m elmo_fast`` runs)."""

import sys

from .cli import main

sys.exit(main())
