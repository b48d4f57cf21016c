"""Before any work: can this file be written durably here?"""
from __future__ import annotations

import os

from .temp_names import TEMP_OVERHEAD
from .write_error import WriteError


def check_writable(final: str | os.PathLike, what: str = "output") -> str:
    """Check, before any work, that ``final`` can be written durably: its folder exists and is a
    writable folder, the name (and our temporary name beside it) fits the filesystem, and it is not
    a folder. Returns the absolute path; raises :class:`WriteError` with the reason."""
    final = os.path.abspath(os.fspath(final))
    directory, base = os.path.split(final)
    if not base:
        raise WriteError(final, f"the {what} must be a file name, not a folder")
    if not os.path.isdir(directory):
        raise WriteError(final, f"its folder {directory} does not exist" if not os.path.exists(directory)
                         else f"{directory} is not a folder")
    if os.path.isdir(final):
        raise WriteError(final, f"the {what} is a folder")
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    if len(os.fsencode(base)) + TEMP_OVERHEAD > name_max:
        raise WriteError(final, f"file name too long ({len(os.fsencode(base))} bytes; at most "
                                f"{name_max - TEMP_OVERHEAD} here, leaving room for the temporary name)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise WriteError(final, f"Permission denied (EACCES): cannot create files in {directory}")
    return final
