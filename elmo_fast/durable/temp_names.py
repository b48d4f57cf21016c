"""Temporary names, and the sweep of the files that dead runs left under them.

A temporary file sits beside its final name, ``.NAME.HOST-PID.TOKEN[.TAG].elmo-tmp``: the host and
the process let a later run tell a killed run's leftovers from a live run's files. A final name too
long to leave room for the rest (any legal name: up to NAME_MAX, 255 bytes) is shortened in the
temporary name to its start and a hash of the whole (:func:`fitting_stem`): ``.START~HASH.HOST-...``,
so that every legal name can be written, and its temporary files are still found by its name."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from typing import NamedTuple

from ..host import host_name

#: Suffix of every temporary file this package creates.
TEMP_SUFFIX = ".elmo-tmp"
# what a temporary name adds to the final one: "." + "." + host (<= 64) + "-" + pid + "." + 8 + a tag
# (".sentences", the longest the package uses) + suffix
TEMP_OVERHEAD = 2 + 64 + 1 + 10 + 1 + 8 + 10 + len(TEMP_SUFFIX)
#: the longest file name the usual filesystems take (ext4, XFS, Btrfs, tmpfs, NFS: NAME_MAX, in bytes);
#: the names made beside a final name are kept within it
NAME_MAX = 255
# "~" + the hash's hex digits that stand for the part of a name cut away
_HASH_HEX = 16


def fitting_stem(base: str, extra: int, limit: int = NAME_MAX) -> str:
    """``base`` itself when ``extra`` more bytes beside it still make a name of at most ``limit``
    bytes; else ``START~HASH``, as long as that allows: the start of ``base`` (whole characters), so
    that a person recognises it, and 16 hex digits of the SHA-256 of all of it, so that two long
    names sharing a start differ. The same ``base`` always gives the same stem."""
    encoded = os.fsencode(base)
    if len(encoded) + extra <= limit:
        return base
    room = max(limit - extra - 1 - _HASH_HEX, 0)
    start = encoded[:room].decode("utf-8", "ignore")  # whole characters only (a cut one is dropped)
    return f"{start}~{hashlib.sha256(encoded).hexdigest()[:_HASH_HEX]}"


def temp_stem(final_name: str) -> str:
    """What the temporary names of ``final_name`` (a base name) hold of it."""
    return fitting_stem(final_name, TEMP_OVERHEAD)


def host_tag() -> str:
    """This host's name as temporary names hold it (letters, digits, ``_`` and ``-``; at most 64)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", host_name())[:64] or "host"


def temp_path(final: str | os.PathLike, tag: str | None = None) -> str:
    """A fresh temporary name for ``final``, in its folder (nothing is created). ``tag`` (lowercase
    letters) tells apart several temporary files of one final name, such as a scratch file kept beside
    the file itself: ``.NAME.HOST-PID.TOKEN.TAG.elmo-tmp``."""
    if tag is not None and not re.fullmatch(r"[a-z]+", tag):
        raise ValueError(f"a temporary name's tag is lowercase letters, not {tag!r}")
    final = os.path.abspath(os.fspath(final))
    directory, base = os.path.split(final)
    middle = f".{tag}" if tag else ""
    return os.path.join(
        directory, f".{temp_stem(base)}.{host_tag()}-{os.getpid()}.{secrets.token_hex(4)}{middle}{TEMP_SUFFIX}"
    )


_TEMP_RE = re.compile(
    rf"^\.(?P<base>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[0-9]+)\.[0-9a-f]{{8}}"
    rf"(?:\.(?P<tag>[a-z]+))?{re.escape(TEMP_SUFFIX)}$"
)


def parse_temp_name(name: str) -> tuple[str, str, int] | None:
    """``(final base name, host, pid)`` of one of our temporary names, else None (the final name as
    the temporary name holds it: shortened when it is long, see :func:`temp_stem`)."""
    m = _TEMP_RE.match(name)
    return (m.group("base"), m.group("host"), int(m.group("pid"))) if m else None


def process_alive(pid: int) -> bool:
    """Whether a process of this id runs on this host (a pid we cannot signal counts as alive)."""
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows: never call it dead there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TempFile(NamedTuple):
    """One of our temporary files found in a folder, and who made it (``final_name``: as the
    temporary name holds it, :func:`temp_stem` of the final name)."""

    path: str
    final_name: str
    host: str
    pid: int

    def owner(self) -> str:
        """``"gone"`` (made on this host by a process that has ended: a killed run's, safe to remove),
        ``"running"`` (a live process of this host, maybe this one), or ``"other host"``."""
        return owner_of(self.host, self.pid)


def owner_of(host: str, pid: int) -> str:
    """:meth:`TempFile.owner` for a file whose name says ``host`` and ``pid``."""
    if host != host_tag():
        return "other host"
    return "running" if pid == os.getpid() or process_alive(pid) else "gone"


def temp_files(directory: str | os.PathLike, final_name: str | None = None) -> list[TempFile]:
    """Our temporary files in ``directory`` (of ``final_name`` only, when given), by name."""
    directory = os.fspath(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    stem = None if final_name is None else temp_stem(final_name)
    for name in names:
        parsed = parse_temp_name(name)
        if parsed is not None and (stem is None or parsed[0] == stem):
            found.append(TempFile(os.path.join(directory, name), *parsed))
    return found


def sweep_temp_files(directory: str | os.PathLike, final_name: str | None = None) -> list[str]:
    """Remove the temporary files in ``directory`` (of ``final_name`` only, when given) left by dead
    processes of this host; return their paths. A live process's files and other hosts' are kept."""
    removed = []
    for temp in temp_files(directory, final_name):
        if temp.owner() == "gone":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp.path)
                removed.append(temp.path)
    return removed
