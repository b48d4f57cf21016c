"""Completion records: what lets a resumed run trust the work an interrupted one saved.

Each shard ``shard-START.h5`` of a work directory is complete once its completion record
``shard-START.h5.done`` exists: written (through :mod:`elmo_fast.durable`) only after the shard is
whole on disk, it holds what the shard covers (its first sentence's position, how many, their
tokens, the digest of their lines, their line numbers) and the shard file's size and SHA-256. A
resumed run recomputes them (:func:`verified_shards`): a shard without a record (a kill between
the two), whose size or checksum differs (a truncated or damaged file), or whose record is itself
damaged, is removed and its window embedded again, with a note on stderr; never trusted.

Every JSON file of the work directory (the records and the manifest) carries ``"check"``, the
SHA-256 of the rest of its content (:func:`seal`, :func:`unseal`), so that a damaged byte in one is
found even where it leaves valid JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import durable
from ..file_hash import hash_file

RECORD_SUFFIX = ".done"
#: what a shard's record says of it, besides the file's size and checksum
SHARD_FIELDS = ("start", "n", "tokens", "digest", "first_line", "last_line")


def note(text: str) -> None:
    """A line on stderr about work a resumed run cannot trust, and redoes."""
    print(f"elmo-fast: note: {text}", file=sys.stderr)


def file_checksum(path: str) -> tuple[int, str]:
    """(size in bytes, SHA-256 in hex) of a file."""
    return hash_file(path)


def _check_of(content: dict) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8")).hexdigest()


def seal(content: dict) -> dict:
    """``content`` with its ``"check"``."""
    rest = {k: v for k, v in content.items() if k != "check"}
    return {**rest, "check": _check_of(rest)}


def unseal(content: Any) -> dict | None:
    """``content`` without its ``"check"``; None when it is not a dict or does not match its check.
    A dict without any (written by an earlier build) is taken as it is."""
    if not isinstance(content, dict):
        return None
    if "check" not in content:
        return content
    rest = {k: v for k, v in content.items() if k != "check"}
    return rest if content["check"] == _check_of(rest) else None


def read_sealed(path: str) -> dict | None:
    """A sealed JSON file's content; None when it is not JSON (or not UTF-8), or damaged. Raises
    OSError when it cannot be read (FileNotFoundError when it is missing): the caller decides
    whether an I/O error means "redo" or "stop"."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return unseal(json.loads(data.decode("utf-8")))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def record_name(shard: str) -> str:
    return shard + RECORD_SUFFIX


def write_record(work: str, shard: dict) -> None:
    """Record ``shard`` (its ``name`` and :data:`SHARD_FIELDS`) as complete; its file is whole on disk."""
    path = os.path.join(work, shard["name"])
    with durable.reading_back(path):
        size, sha = file_checksum(path)
    record = {"shard": shard["name"], **{k: shard[k] for k in SHARD_FIELDS}, "bytes": size, "sha256": sha}
    durable.write_json(os.path.join(work, record_name(shard["name"])), seal(record), indent=None)


def _as_shard(record: dict | None, name: str) -> dict | None:
    if (
        record is None
        or record.get("shard") != name
        or any(not isinstance(record.get(k), (int, str)) for k in (*SHARD_FIELDS, "bytes", "sha256"))
    ):
        return None
    return {"name": name, **{k: record[k] for k in SHARD_FIELDS}, "bytes": record["bytes"], "sha256": record["sha256"]}


def recorded_shards(work: str, shard_names: list[str]) -> list[dict]:
    """The shards among ``shard_names`` that have a sound record, as their records say, unchecked
    (what a run that wrote them, or checked them at its start, knows to be whole). A record that
    cannot be read raises the OSError."""
    out = []
    for name in shard_names:
        try:
            shard = _as_shard(read_sealed(os.path.join(work, record_name(name))), name)
        except FileNotFoundError:
            continue
        if shard is not None:
            out.append(shard)
    return out


def _why_untrusted(work: str, name: str) -> str | None:
    """Why the shard ``name`` cannot be trusted, or None when it matches its record."""
    try:
        shard = _as_shard(read_sealed(os.path.join(work, record_name(name))), name)
    except FileNotFoundError:
        return "it has no completion record (the run stopped before writing it)"
    except OSError as e:
        return f"its completion record cannot be read ({durable.describe_os_error(e)})"
    if shard is None:
        return f"its completion record {record_name(name)} is damaged"
    try:
        size, sha = file_checksum(os.path.join(work, name))
    except FileNotFoundError:
        return "it is missing"
    except OSError as e:
        return f"it cannot be read ({durable.describe_os_error(e)})"
    if size != shard["bytes"]:
        return f"it holds {size:,} bytes, its record {shard['bytes']:,}"
    if sha != shard["sha256"]:
        return "its checksum differs from its record's (the file is damaged)"
    return None


def verified_shards(
    work: str, shard_names: list[str], stateful: bool, tell: Callable[[str], None] = note
) -> list[dict]:
    """The shards of ``work`` that match their records, by start; every other shard and record
    is removed, with a line to ``tell`` saying why. ``shard_names``: the shard files present.
    ``stateful``: only an unbroken run of shards from the input's start is kept (a window's LSTM
    states come from the one before it)."""
    names = set(shard_names) | {
        n[: -len(RECORD_SUFFIX)]
        for n in os.listdir(work)
        if n.startswith("shard-") and n.endswith(".h5" + RECORD_SUFFIX)
    }
    trusted: list[dict] = []
    for name in sorted(names):
        why = _why_untrusted(work, name)
        if why is None:
            trusted.append(recorded_shards(work, [name])[0])
        else:
            _drop(work, name, f"{os.path.join(work, name)}: {why}: its window will be embedded again", tell)
    trusted.sort(key=lambda s: s["start"])
    if stateful:
        end = 0
        for i, s in enumerate(trusted):
            if s["start"] != end:
                for later in trusted[i:]:
                    _drop(
                        work,
                        later["name"],
                        f"{os.path.join(work, later['name'])}: the window before it is "
                        f"redone, and the LSTM states flow from it: embedded again too",
                        tell,
                    )
                trusted = trusted[:i]
                break
            end += s["n"]
    return trusted


def _drop(work: str, name: str, why: str, tell: Callable[[str], None]) -> None:
    tell(why)
    durable.remove_quietly(os.path.join(work, record_name(name)), os.path.join(work, name))
