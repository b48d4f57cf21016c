"""What a training run is computed from, recorded in each checkpoint and compared on ``--resume``:
the vocabulary's content, the corpus files' contents, and the settings that decide the computation.

A resumed run that read another vocabulary or corpus than the run it continues would mix two
runs into one model that neither describes, with no trace of it; :func:`changes` names what
differs, and the trainer refuses unless told to go on (``allow_changed=True`` / ``--resume-anyway``).

What each digest covers, and why:

* the vocabulary: SHA-256 of the whole file (a few MB at most; every byte decides the ids);
* each corpus file (``train`` and ``heldout``, in the order the run reads them): its size and the
  SHA-256 of its first and last :data:`SAMPLE` bytes (of all of it when it is at most twice that).
  Constant cost per file, so a resume of a 10 GB corpus does not read it once more just to check
  it, and it catches what happens to corpora: files added, removed or replaced, text appended or
  cut, a file regenerated or reshuffled (its first bytes change). A same-size edit in the middle of
  a file larger than 2 MiB goes unseen. Modification times are not used: copying a run and its
  corpus to another machine, a checkout or an archive changes them without changing a byte, and a
  check that cries wolf teaches users to override it;
* the settings: SHA-256 of :meth:`TrainConfig.identity` without the paths (the paths of the
  vocabulary and corpus may change: a moved corpus is the same corpus; their contents are compared).

Files are compared by position, not by path: the same contents under new paths are the same run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from ..file_hash import hash_file

#: bytes hashed at each end of a corpus file
SAMPLE = 1 << 20
#: identity keys that are paths: their files' contents are compared instead
PATH_KEYS = ("train", "heldout", "vocab")


def file_digest(path: str, whole: bool = False) -> dict:
    """``{"path", "size", "sha256"}`` of a file: the whole content, or its ends (see the module docstring)."""
    size, sha = hash_file(path, ends=None if whole else SAMPLE)
    return {"path": os.fspath(path), "size": size, "sha256": sha}


def settings_digest(identity: dict) -> str:
    settings = {k: v for k, v in identity.items() if k not in PATH_KEYS}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def fingerprint(vocab: str, train: Sequence[str], heldout: Sequence[str], identity: dict) -> dict:
    """The record a checkpoint keeps of the run's inputs and settings (JSON-able)."""
    return {
        "vocab": file_digest(vocab, whole=True),
        "train": [file_digest(p) for p in train],
        "heldout": [file_digest(p) for p in heldout],
        "settings": settings_digest(identity),
    }


def changes(then: dict, now: dict, identity_then: dict, identity_now: dict) -> list[str]:
    """What differs between a checkpoint's run and this one, one phrase each (empty: the same run).
    ``then``: the checkpoint's fingerprint, or None for a checkpoint written before they were kept
    (its settings are then compared with the paths, as they were)."""
    found = []
    skip = PATH_KEYS if then is not None else ()
    differ = [
        k
        for k in sorted(set(identity_then) | set(identity_now))
        if k not in skip and identity_then.get(k) != identity_now.get(k)
    ]
    if differ:
        found.append(
            "the run in it used other settings ("
            + "; ".join(f"{k}: {identity_then.get(k)!r} then, {identity_now.get(k)!r} now" for k in differ[:4])
            + (f"; {len(differ) - 4} more" if len(differ) > 4 else "")
            + ")"
        )
    if then is None:
        return found
    if then["vocab"]["sha256"] != now["vocab"]["sha256"]:
        found.append(f"the vocabulary changed ({_describe(then['vocab'])} then, {_describe(now['vocab'])} now)")
    for key, what in (("train", "training corpus"), ("heldout", "held-out corpus")):
        diff = _corpus_changes(then[key], now[key])
        if diff:
            found.append(f"the {what} changed ({diff})")
    return found


def _describe(d: dict) -> str:
    return f"{d['path']}: {d['size']:,} bytes, sha256 {d['sha256'][:12]}"


def _corpus_changes(then: list[dict], now: list[dict]) -> str:
    content = lambda files: [(f["size"], f["sha256"]) for f in files]  # noqa: E731
    if content(then) == content(now):
        return ""
    before, after = {f["path"]: f for f in then}, {f["path"]: f for f in now}
    new = [p for p in after if p not in before]
    gone = [p for p in before if p not in after]
    for p in list(new):  # a file that moved, its content unchanged: no change to name
        match = next(
            (q for q in gone if (before[q]["size"], before[q]["sha256"]) == (after[p]["size"], after[p]["sha256"])),
            None,
        )
        if match is not None:
            new.remove(p)
            gone.remove(match)
    parts = [f"{p} is new" for p in new] + [f"{p} is gone" for p in gone]
    for p in after:
        if p in before and (before[p]["size"], before[p]["sha256"]) != (after[p]["size"], after[p]["sha256"]):
            a, b = before[p]["size"], after[p]["size"]
            parts.append(f"{p}: {a:,} bytes then, {b:,} now" if a != b else f"{p}: other content, same size")
    if not parts:  # the same files under the same names, listed in another order
        parts = ["the files are read in another order"]
    return "; ".join(parts[:3]) + (f"; {len(parts) - 3} more" if len(parts) > 3 else "")
