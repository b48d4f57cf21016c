"""The resume bookkeeping: a resumable run's work directory ``OUTPUT.partial/``.

It holds ``manifest.json`` (the run's settings, model digests included, written first) and one
shard file per window, ``shard-START.h5``, named after the position of its first sentence in the
input, so that any number of processes can write them, each with its completion record
``shard-START.h5.done`` (:mod:`.shard_records`: written after the shard is whole on disk, with its
size and SHA-256). Every file in it is written through :mod:`elmo_fast.durable` (a temporary name,
fsync, rename). A resumed run trusts only what it verifies: a shard that does not match its record
is embedded again, a damaged manifest means starting over (each with a note on stderr). At the end
``assembling.h5`` is written whole, the manifest marked complete with the assembled file's size and
checksum, and the file renamed onto the output: a run killed between the two is finished by the
next ``resume=True`` run, which checks the assembled file first. The assembled output keeps the
run's record (:data:`RUN_RECORD`), so a run killed after its work directory was removed is
recognised as done.

Temporary names of elmo-fast 0.1 (``shard-START.h5.tmp``, ``manifest.json.tmp``) are still known:
such a work area resumes (its shards, which have no completion records, are embedded again).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from .. import durable
from ..errors import ElmoFastError
from ..file_hash import hash_file
from .batch_runner import Embedder
from .options import EmbedOptions
from .shard_records import RECORD_SUFFIX, file_checksum, note, read_sealed, recorded_shards, seal, verified_shards

MANIFEST = "manifest.json"
ASSEMBLING = "assembling.h5"
#: root attribute of a file assembled by resume=True: its run's manifest and shard digests, so that
#: resuming a run that was killed after it finished (its work directory gone) is recognised as done
RUN_RECORD = "elmo_fast_run"
# 2: shards named and recorded by the position of their first sentence (any number of ranks write them)
MANIFEST_VERSION = 2


WORK_SUFFIX = ".partial"


def work_dir_of(output: str) -> str:
    """``OUTPUT.partial`` beside the output (OUTPUT shortened for a name too long to leave room for
    the suffix: :func:`elmo_fast.durable.fitting_stem`)."""
    directory, base = os.path.split(os.path.abspath(output))
    return os.path.join(directory, durable.fitting_stem(base, len(WORK_SUFFIX)) + WORK_SUFFIX)


def shard_name(start: int) -> str:
    """The shard holding the window whose first sentence is the input's start-th (0-based, counting
    the sentences read, so skipped empty lines do not count)."""
    return f"shard-{start:06d}.h5"


# --- the manifest ------------------------------------------------------------------------------------


def new_manifest(embedder: Embedder, name: str, options: EmbedOptions) -> dict:
    """What a resumed run must share with the run it continues (its input is checked line by line)."""
    stateful = embedder.elmo_bilm.stateful
    return {
        "version": MANIFEST_VERSION,
        "input": name,
        "output_format": options.output_format,
        "use_sentence_keys": options.use_sentence_keys,
        "forget_sentences": options.forget_sentences,
        "stateful": stateful,
        "batch_size": options.batch_size if stateful else None,
        **({"tokenize": True} if options.tokenize else {}),  # (absent otherwise: older work areas resume)
        **(
            {
                "fasta": True,
                "fasta_id_rule": [options.fasta_split_char, options.fasta_id_field],
                "per_protein": options.per_protein,
                # (absent with the default rules: older work areas resume)
                **(
                    {"fasta_residue_rule": [options.fasta_stop, options.fasta_gaps]}
                    if (options.fasta_stop, options.fasta_gaps) != (None, None)
                    else {}
                ),
            }
            if options.fasta
            else {}
        ),
        **_model_identity(embedder),
    }


def _file_digest(path: str) -> str:
    return hash_file(path, "blake2b", digest_size=16)[1]


def _model_identity(embedder: Embedder) -> dict:
    bilm = embedder.elmo_bilm
    return {
        **{role: _file_digest(os.fspath(path)) for role, path in embedder.model_files.items()},
        "backend": bilm.backend,
        "dtype": str(bilm.compute_dtype),
        "device": embedder.device.type,
    }


#: what :func:`read_manifest` returns for a manifest that is unreadable or does not match its check
DAMAGED: dict = {"damaged": True}


def read_manifest(work: str) -> dict | None:
    """The work directory's manifest; None when there is none; :data:`DAMAGED` when it cannot be
    trusted (written atomically, so only a bad disk or a hand edit gets there)."""
    path = os.path.join(work, MANIFEST)
    try:
        manifest = read_sealed(path)
    except FileNotFoundError:
        return None
    except OSError as e:  # not "damaged": a passing I/O error must not throw the saved work away
        raise ElmoFastError(f"{path}: cannot read it ({durable.describe_os_error(e)})") from None
    return DAMAGED if manifest is None else manifest


def write_manifest(work: str, manifest: dict) -> None:
    durable.write_json(os.path.join(work, MANIFEST), seal(manifest), indent=1, sort_keys=True)


def differences(then: dict, now: dict) -> list[str]:
    """What differs between two runs' manifests, one "key: then, now" each."""
    # the input's name may change (a moved file, stdin): its lines are checked against digests instead
    # (a key that only some runs record, as "tokenize", counts from either side)
    keys = sorted(set(now) | ({"tokenize"} & set(then)))

    def get(record: dict, k: str) -> Any:
        return record.get(k, False) if k == "tokenize" else record.get(k)

    return [
        f"{k}: {get(then, k)!r} then, {get(now, k)!r} now"
        for k in keys
        if k not in ("input", "complete", "assembled") and get(then, k) != get(now, k)
    ]


# --- the files in the directory --------------------------------------------------------------------


def _is_ours(name: str) -> bool:
    parsed = durable.parse_temp_name(name)
    if parsed is not None:  # a temporary file of one of ours
        name = parsed[0]
    elif name.endswith(".tmp"):  # elmo-fast 0.1's temporary names
        name = name[: -len(".tmp")]
    return (
        name.startswith("shard-")
        and name.endswith((".h5", ".h5" + RECORD_SUFFIX))
        or name.startswith("progress-")
        and name.endswith(".json")
        or name in (MANIFEST, ASSEMBLING)
    )


def _is_cut_short(name: str) -> bool:
    """A file a killed run was writing: a temporary one, or an output assembled but not recorded as such."""
    return durable.parse_temp_name(name) is not None or name.endswith(".tmp") or name == ASSEMBLING


def remove_work_dir(work: str) -> None:
    """Delete a work directory: shards first, the manifest last, so that a directory that still
    has a manifest always has every shard it had (a kill in the middle leaves a void directory)."""
    names = os.listdir(work)
    strangers = [n for n in names if not _is_ours(n)]
    if strangers:
        raise ElmoFastError(
            f"{work} holds files elmo-fast did not write ({', '.join(sorted(strangers)[:3])}); "
            f"move them away or pick another output name"
        )
    for n in sorted(names, key=lambda n: n == MANIFEST):
        os.unlink(os.path.join(work, n))
    os.rmdir(work)


def shard_names(work: str) -> list[str]:
    return sorted(n for n in os.listdir(work) if n.startswith("shard-") and n.endswith(".h5"))


def list_shards(work: str, shards: list[dict] | None = None) -> list[dict]:
    """The complete shards of a work directory (those with a completion record; or ``shards``),
    by start, each named after its start and none overlapping the next (the windows of any number
    of ranks, or of runs with other windows)."""
    if shards is None:
        shards = recorded_shards(work, shard_names(work))
    shards = sorted(shards, key=lambda s: s["start"])
    for i, s in enumerate(shards):
        if s["name"] != shard_name(s["start"]):
            raise ElmoFastError(
                f"{work}: shard {s['name']} holds the sentences from {s['start']} on (expected the "
                f"name {shard_name(s['start'])}); remove {work} to start over"
            )
        if i and shards[i - 1]["start"] + shards[i - 1]["n"] > s["start"]:
            raise ElmoFastError(
                f"{work}: shards {shards[i - 1]['name']} and {s['name']} overlap; remove {work} to start over"
            )
    return shards


def open_work_dir(work: str, output: str, manifest: dict, role: str) -> tuple[dict, list[dict]]:
    """Create ``work`` with ``manifest``, or take up the interrupted run in it: its manifest (which
    must agree with this run's) and its complete shards, what a killed run was writing removed.
    role "member" (a rank other than 0) finds the directory that rank 0 prepared, and changes nothing."""
    existing = read_manifest(work) if os.path.isdir(work) else None
    if existing is DAMAGED and role != "member":
        note(f"{os.path.join(work, MANIFEST)} is damaged, so nothing in {work} can be trusted: starting over")
        existing = None
    if existing is None or existing is DAMAGED:
        if role == "member":
            raise ElmoFastError(
                f"{work}: no {'readable ' if existing is DAMAGED else ''}manifest, though rank 0 "
                f"wrote one: the output's directory must be on a filesystem that every rank shares"
            )
        if os.path.isdir(work):
            remove_work_dir(work)  # a void leftover (killed while created or torn down), or untrusted
        os.mkdir(work)
        try:
            write_manifest(work, manifest)
        except BaseException:  # a signal or a full disk now: nothing is done yet, so nothing stays
            remove_work_dir(work)
            raise
        return manifest, []
    differs = differences(existing, manifest)
    if differs:
        raise ElmoFastError(
            f"cannot resume {work}: the interrupted run differs ({'; '.join(differs)}); rerun "
            f"with its settings, or remove {work} to start over"
        )
    if role == "member":
        return existing, []
    if existing.get("complete"):  # the assembled file is final (shards may be gone), if it is whole
        if _assembled_whole(work, output, existing):
            return existing, []
        existing = {k: v for k, v in existing.items() if k not in ("complete", "assembled")}
        write_manifest(work, existing)
    for n in os.listdir(work):
        if _is_cut_short(n):
            os.unlink(os.path.join(work, n))  # cut short by the kill: redone
    return existing, list_shards(work, verified_shards(work, shard_names(work), bool(existing.get("stateful"))))


def assembled_record(path: str) -> dict:
    """What the manifest records of the assembled output, to check it before it is renamed."""
    size, sha = file_checksum(path)
    return {"bytes": size, "sha256": sha}


def _assembled_whole(work: str, output: str, manifest: dict) -> bool:
    """Whether the assembled output of a run marked complete (still ``assembling.h5``, or renamed onto
    the output already) matches the manifest's record of it; if not, a note says it is assembled again."""
    record = manifest.get("assembled")
    path = os.path.join(work, ASSEMBLING)
    if not os.path.exists(path):
        path = output
    if record is None:  # marked complete by an earlier build, which recorded no checksum
        return True
    try:
        whole = os.path.exists(path) and assembled_record(path) == record
    except OSError:
        whole = False
    if not whole:
        note(
            f"{path} does not match the record of the assembled output in {os.path.join(work, MANIFEST)}: "
            f"assembling it again from the saved windows"
        )
        if path != output:
            durable.remove_quietly(path)
    return whole


def covering_shards(work: str, total: int, patience: float) -> list[dict]:
    """The shards that hold sentences 0..total-1, in order. A group's shards were written on other
    machines: on a network filesystem a file renamed there may show here a moment later."""
    deadline = time.monotonic() + patience
    while True:
        shards = list_shards(work)
        end = 0
        for s in shards:
            if s["start"] != end:  # sentences end..start-1 missing
                break
            end += s["n"]
        else:
            if end == total:
                return shards
            if end > total:
                raise ElmoFastError(
                    f"{work} holds shards of {end} sentences, but the input has {total}; remove {work} to start over"
                )
        if time.monotonic() >= deadline:
            missing = next((s["start"] for s in shards if s["start"] > end), total)
            raise ElmoFastError(
                f"{work} holds no shard for sentences {end + 1}..{missing} of the input "
                f"(counted from 1): a rank's work is missing; is the directory on a filesystem "
                f"that every rank shares?"
            )
        time.sleep(0.5)


def saved_states(work: str, done: list[dict]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The LSTM states after the last complete shard (stateful runs: their shards are a prefix)."""
    import h5py

    if not done:
        return None
    with h5py.File(os.path.join(work, done[-1]["name"]), "r") as f:
        if "state_h" not in f:
            return None
        return torch.from_numpy(f["state_h"][...]), torch.from_numpy(f["state_c"][...])
