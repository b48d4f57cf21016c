"""Before any work: can this file be written durably here?"""

from __future__ import annotations

import os

from .temp_names import TEMP_OVERHEAD, temp_stem
from .write_error import WriteError


def check_writable(final: str | os.PathLike, what: str = "output") -> str:
    """Check, before any work, that ``final`` can be written durably: its folder exists and is a
    writable folder, the name (and our temporary name beside it, shortened for a long name) fits the
    filesystem, and it is not a folder. Returns the absolute path; raises :class:`WriteError` with the reason."""
    final = os.path.abspath(os.fspath(final))
    directory, base = os.path.split(final)
    if not base:
        raise WriteError(final, f"the {what} must be a file name, not a folder")
    if not os.path.isdir(directory):
        raise WriteError(
            final,
            f"its folder {directory} does not exist"
            if not os.path.exists(directory)
            else f"{directory} is not a folder",
        )
    if os.path.isdir(final):
        raise WriteError(final, f"the {what} is a folder")
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    size = len(os.fsencode(base))
    if size > name_max:
        raise WriteError(final, f"file name too long ({size} bytes; at most {name_max} here)")
    temp_size = len(os.fsencode(temp_stem(base))) + TEMP_OVERHEAD  # the longest temporary name beside it
    if temp_size > name_max:  # a filesystem whose names are shorter than most (NAME_MAX < 255)
        raise WriteError(
            final,
            f"file name too long ({size} bytes): the temporary name beside it takes up to "
            f"{temp_size} bytes, and at most {name_max} fit here",
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise WriteError(final, f"Permission denied (EACCES): cannot create files in {directory}")
    return final
