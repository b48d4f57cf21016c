"""What a failed step does: throw the temporary file away and say which file could not be written.

:func:`aborting` is the one rule every writer follows around each of its steps; :func:`reading_back`
the same rule for reading back what was written on the way to a file; :func:`unraisable_errors`
catches the errors a library reports only through the garbage collector."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from ..errors import ElmoFastError
from .write_error import WriteError


@contextlib.contextmanager
def aborting(
    final: str | os.PathLike, abort: Callable[[], None], errors: tuple[type[BaseException], ...] = (OSError,)
) -> Iterator[None]:
    """Around one step of a write to ``final``: any exception calls ``abort()`` (which throws the
    temporary file away); one of ``errors`` (the OS's, and the libraries' where they report it their
    own way) is then raised as a :class:`WriteError` naming ``final``, anything else (the package's
    own errors, KeyboardInterrupt, SystemExit) as it is."""
    try:
        yield
    except BaseException as e:
        abort()
        if isinstance(e, errors) and not isinstance(e, ElmoFastError):
            raise WriteError(final, e) from e
        raise


@contextlib.contextmanager
def unraisable_errors() -> Iterator[list[BaseException]]:
    """Collect the exceptions Python would print as "Exception ignored in ..." (h5py reports a failed
    close of a dataset that the garbage collector frees that way) instead of losing them."""
    caught: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(info) -> None:
        if info.exc_value is not None and isinstance(info.exc_value, (OSError, RuntimeError)):
            caught.append(info.exc_value)
        else:
            previous(info)

    sys.unraisablehook = hook
    try:
        yield caught
    finally:
        sys.unraisablehook = previous


@contextlib.contextmanager
def reading_back(final: str | os.PathLike) -> Iterator[None]:
    """Around reading back what was written on the way to ``final`` (a scratch file, the parts a file
    is assembled from, a checksum of what was just written): an I/O error there (even a failed close
    of a file opened to read) fails the write of ``final``, as a :class:`WriteError` naming it."""
    with aborting(final, lambda: None, (OSError, RuntimeError)):
        yield
