"""A kernel made wrong on purpose, where a miscompiled or misbehaving one would be: below the typed
wrappers of elmo_fast.bilm.ops, ``torch.ops.elmo_fast.<op>`` replaced by one whose results are off (or
that raises). The doctor's and the first-use self-check's tests use it."""

from types import SimpleNamespace

import torch


def break_kernel(monkeypatch, name, wrong):
    """torch.ops.elmo_fast.<name>.default replaced by ``wrong(real_default, *args)`` for the test."""
    real = getattr(torch.ops.elmo_fast, name)
    monkeypatch.setattr(torch.ops.elmo_fast, name, SimpleNamespace(default=lambda *a: wrong(real.default, *a)))
