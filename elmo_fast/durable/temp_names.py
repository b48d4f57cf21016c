"""Temporary names, and the sweep of the files that dead runs left under them.

A temporary file sits beside its final name, ``.NAME.HOST-PID.TOKEN[.TAG].elmo-tmp``: the host and
the process let a later run tell a killed run's leftovers from a live run's files."""
from __future__ import annotations

import contextlib
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
    return os.path.join(directory,
                        f".{base}.{host_tag()}-{os.getpid()}.{secrets.token_hex(4)}{middle}{TEMP_SUFFIX}")


_TEMP_RE = re.compile(rf"^\.(?P<base>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[0-9]+)\.[0-9a-f]{{8}}"
                      rf"(?:\.(?P<tag>[a-z]+))?{re.escape(TEMP_SUFFIX)}$")


def parse_temp_name(name: str) -> tuple[str, str, int] | None:
    """``(final base name, host, pid)`` of one of our temporary names, else None."""
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
    """One of our temporary files found in a folder, and who made it."""
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
    for name in names:
        parsed = parse_temp_name(name)
        if parsed is not None and (final_name is None or parsed[0] == final_name):
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
