"""What killed plain runs left beside an output (``kill -9`` runs no cleanup): their temporary files.

Today's are :mod:`elmo_fast.durable`'s (``.OUTPUT.HOST-PID.TOKEN.elmo-tmp``, and the sentence list's
``.OUTPUT.HOST-PID.TOKEN.sentences.elmo-tmp``); the names of earlier builds are known too:
``.OUTPUT.HOST-PID.TOKEN.partial`` and ``.sentences``, and mkstemp's ``.OUTPUT.XXXXXXXX.partial``
(elmo-fast 0.1, which does not name its process).
"""

from __future__ import annotations

import os
import re

from .. import durable


def _legacy_pattern(output: str) -> re.Pattern:
    # exactly the earlier builds' names for this output: tagged with host and process, or mkstemp's
    base = re.escape(os.path.basename(output))
    return re.compile(
        rf"\.{base}\.(?:(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[0-9]+)\.[0-9a-f]{{8}}|[a-z0-9_]{{8}})"
        rf"\.(?:partial|sentences)"
    )


def _temp_files(output: str) -> list[durable.TempFile]:
    """Every temporary file of ``output`` beside it (host and pid None: elmo-fast 0.1's)."""
    out_dir = os.path.dirname(os.path.abspath(output))
    base = os.path.basename(output)
    found = durable.temp_files(out_dir, base)
    pattern = _legacy_pattern(output)
    try:
        names = sorted(n for n in os.listdir(out_dir) if pattern.fullmatch(n))
    except OSError:
        return found
    for n in names:
        m = pattern.fullmatch(n)
        found.append(durable.TempFile(os.path.join(out_dir, n), base, m["host"], int(m["pid"]) if m["pid"] else None))
    return sorted(found)


def stale_temp_files(output: str, remove: bool = True) -> tuple[list[str], list[str]]:
    """The temporary files that killed plain runs left beside ``output``: (removed, left with why).

    Only names of our exact patterns for this output are considered. A file is stale, and removed,
    when its name says it was made on this host by a process that is no longer running; the file of
    a live process, of another host (a shared disk), or of elmo-fast 0.1 (no owner in its name) is
    left and named, for a person to judge.
    """
    removed: list[str] = []
    left: list[str] = []
    for temp in _temp_files(output):
        path, host, pid = temp.path, temp.host, temp.pid
        owner = None if pid is None else temp.owner()
        if owner is None:
            left.append(
                f"{path} (left by elmo-fast 0.1, which does not name its process: remove it if no run is "
                f"writing {output})"
            )
        elif owner == "other host":
            left.append(f"{path} (made on host {host}: remove it if no run there is writing {output})")
        elif owner == "running":
            left.append(f"{path} (process {pid} is running: another run writing {output}?)")
        elif remove:
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                left.append(f"{path} (its process {pid} is gone, but it cannot be removed: {e.strerror})")
        else:
            left.append(f"{path} (its process {pid} is gone)")
    return removed, left
