"""Before any work: can this file be written durably here? (An :class:`OutputPathError` when not.)"""

from __future__ import annotations

import os

from .temp_names import TEMP_OVERHEAD, temp_stem
from .write_error import OutputPathError


def check_writable(final: str | os.PathLike, what: str = "output") -> str:
    """Check, before any work, that ``final`` can be written durably: its folder exists and is a
    writable folder, the name (and our temporary name beside it, shortened for a long name) fits the
    filesystem, and it is not a folder. Returns the absolute path; raises :class:`OutputPathError` (a
    :class:`WriteError`) with the reason."""
    final = os.path.abspath(os.fspath(final))
    directory, base = os.path.split(final)
    if not base:
        raise OutputPathError(final, f"the {what} must be a file name, not a folder")
    if not os.path.isdir(directory):
        raise OutputPathError(
            final,
            f"its folder {directory} does not exist"
            if not os.path.exists(directory)
            else f"{directory} is not a folder",
        )
    if os.path.isdir(final):
        raise OutputPathError(final, f"the {what} is a folder")
    name_max = _name_max(directory)
    size = len(os.fsencode(base))
    if size > name_max:
        raise OutputPathError(final, f"file name too long ({size} bytes; at most {name_max} here)")
    temp_size = len(os.fsencode(temp_stem(base))) + TEMP_OVERHEAD  # the longest temporary name beside it
    if temp_size > name_max:  # a filesystem whose names are shorter than most (NAME_MAX < 255)
        raise OutputPathError(
            final,
            f"file name too long ({size} bytes): the temporary name beside it takes up to "
            f"{temp_size} bytes, and at most {name_max} fit here",
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputPathError(final, f"Permission denied (EACCES): cannot create files in {directory}")
    return final


def check_creatable(directory: str | os.PathLike, what: str = "folder") -> str:
    """Check, before any work, that ``directory`` is a writable folder or can be made one (with its missing
    parents) later: the nearest part of it that exists is a writable folder, and the missing parts' names fit
    the filesystem. Creates nothing. Returns the absolute path; raises :class:`OutputPathError` when not."""
    directory = os.path.abspath(os.fspath(directory))
    existing, missing = directory, []
    while not os.path.exists(existing):
        existing, name = os.path.split(existing)
        missing.append(name)
    if not os.path.isdir(existing):
        why = f"{existing} is not a folder" if missing else f"the {what} exists and is not a folder"
        raise OutputPathError(directory, why)
    name_max = _name_max(existing)
    for name in missing:
        size = len(os.fsencode(name))
        if size > name_max:
            raise OutputPathError(directory, f"file name too long ({size} bytes; at most {name_max} here)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(directory, f"Permission denied (EACCES): cannot create files in {existing}")
    return directory


def make_dirs(directory: str | os.PathLike, what: str = "folder") -> str:
    """Create ``directory`` and its missing parents, before any work (a folder that exists is fine).
    Returns the absolute path; raises :class:`OutputPathError` naming it when it cannot be made (a
    file in its way, no permission)."""
    directory = check_creatable(directory, what)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise OutputPathError(directory, e) from e
    return directory


def _name_max(directory: str) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255
