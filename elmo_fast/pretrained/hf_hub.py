"""Models on the Hugging Face Hub: ``hf:OWNER/REPO[@REVISION][/SUBFOLDER]``, through ``huggingface_hub``
(the ``[hub]`` extra, imported only here and only when a Hub model is asked for).

The files stay where ``huggingface_hub`` keeps them (its cache: ``HF_HOME``, ``HF_HUB_CACHE``), fetched by
its own functions, so ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and revisions (branches, tags,
commits) mean what they mean there. Online, the repository's listing (``model_info``) picks the model's files
(:mod:`.hub_layouts`) and ``snapshot_download`` fetches those alone; offline (``HF_HUB_OFFLINE=1``, or
no network) the files already in the Hub's cache are used, with no request.

elmo-fast's record of a Hub model (:mod:`.records`) lives in its own cache, ``hub/OWNER--REPO/COMMIT/``:
each file's size and SHA-256, checked on the first load against the Hub's own digest of the file (the
name of its blob in the Hub's cache: the SHA-256 of a large (LFS) file, the git hash of a small one).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from ..cache_dir import cache_dir
from ..errors import DownloadError, ElmoFastError, ModelFileError
from .fetch_lock import FetchLock
from .hub_layouts import BILM_TF_FILES, MANYLANGS_FILES, RepoModel, find_model
from .records import ModelRecord, check_sizes, file_record, new_record, read_record, write_record
from .spec import HubSpec

EXTRA = "hub"
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _hub():
    """huggingface_hub (its ``constants`` and ``errors`` loaded), or a one-line error naming the extra."""
    try:
        hf = importlib.import_module("huggingface_hub")
        importlib.import_module("huggingface_hub.constants")
        importlib.import_module("huggingface_hub.errors")
    except ImportError:
        raise ElmoFastError(
            f"a model on the Hugging Face Hub needs huggingface_hub: pip install 'elmo-fast[{EXTRA}]'"
        ) from None
    return hf


def _constants():
    return sys.modules["huggingface_hub.constants"]


def _offline(hf) -> bool:
    constants = _constants()
    check = getattr(constants, "is_offline_mode", None)
    return bool(check()) if callable(check) else bool(getattr(constants, "HF_HUB_OFFLINE", False))


def download_command(spec: HubSpec, files: list[str]) -> str:
    """The command of the installed huggingface_hub that downloads ``files`` of ``spec``'s repository."""
    tool = "hf" if importlib.util.find_spec("huggingface_hub.cli.hf") is not None else "huggingface-cli"
    revision = f" --revision {shlex.quote(spec.revision)}" if spec.revision else ""
    return f"{tool} download {spec.repo} {' '.join(shlex.quote(f) for f in files)}{revision}"


def _is_network_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the Hub could not be reached (huggingface_hub then uses its cache)."""
    names = " ".join(t.__name__ for t in type(exc).__mro__)
    return isinstance(exc, OSError) or any(
        k in names for k in ("Connect", "Timeout", "OfflineModeIsEnabled", "Network")
    )


def _listing(hf, spec: HubSpec) -> list[str] | None:
    """The repository's files at the revision; None when the Hub cannot be reached."""
    errors = sys.modules["huggingface_hub.errors"]
    try:
        api = hf.HfApi()
        # the repository's info lists its files in one request (list_repo_files retries a refused
        # connection for half a minute before the cache may be used); an endpoint that leaves the
        # list out is asked for it
        siblings = api.model_info(spec.repo, revision=spec.revision).siblings
        if siblings is None:
            return list(api.list_repo_files(spec.repo, revision=spec.revision))
        return [s.rfilename for s in siblings]
    except errors.RevisionNotFoundError:
        raise DownloadError(f"{spec.text}: the repository has no revision {spec.revision!r}") from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as e:
        raise DownloadError(
            f"{spec.text}: no such repository at {_constants().ENDPOINT}, or it is private or gated and "
            f"this token may not read it (set HF_TOKEN, or run `hf auth login`): {_first_line(e)}"
        ) from None
    except errors.HfHubHTTPError as e:
        if e.response is not None and e.response.status_code < 500:
            raise DownloadError(f"{spec.text}: {_first_line(e)}") from None
        return None  # the Hub is down: its cache may hold the files
    except Exception as e:  # noqa: BLE001 - huggingface_hub's HTTP library's errors have no common base
        if _is_network_error(e):
            return None
        raise


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _local_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _snapshot(hf, spec: HubSpec, patterns: list[str] | None, *, force: bool, local: bool, progress: bool) -> Path:
    kwargs = {"revision": spec.revision, "local_files_only": local}
    if patterns is not None:
        kwargs["allow_patterns"] = patterns
    if force:
        kwargs["force_download"] = True
    if not progress:
        from tqdm import tqdm

        class _Quiet(tqdm):
            def __init__(self, *args, **kw):
                kw["disable"] = True
                super().__init__(*args, **kw)

        kwargs["tqdm_class"] = _Quiet
    return Path(hf.snapshot_download(spec.repo, **kwargs))


def _not_cached(hf, spec: HubSpec, why: str) -> DownloadError:
    folder = spec.subfolder
    files = [f"{folder}/{n}" if folder else n for n in BILM_TF_FILES]
    return DownloadError(
        f"{spec.text}: not in the Hugging Face cache ({_constants().HF_HUB_CACHE}) and {why}; where there is a "
        f"network, fetch it with `{download_command(spec, files)}` (an ELMoForManyLangs model's files: "
        f"{', '.join(MANYLANGS_FILES)})"
    )


def _record_folder(spec: HubSpec, commit: str, cache: Path) -> Path:
    owner, name = spec.repo.split("/")
    folder = cache / "hub" / f"{owner}--{name}" / commit
    return folder / spec.subfolder if spec.subfolder else folder


def _git_blob_sha1(path: Path, size: int) -> str:
    h = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _checked_against_hub(spec: HubSpec, role: str, path: Path, repo_path: str, commit: str, folder: Path):
    """The record of ``path``, its digest checked against the Hub's (the blob's name) where known."""
    record = file_record(role, path, folder, f"{spec.repo}/{repo_path} at {commit}")
    blob = Path(os.path.realpath(path)).name
    if _HEX.fullmatch(blob):
        found = record.sha256 if len(blob) == 64 else _git_blob_sha1(path, record.size)
        if found != blob:
            raise ModelFileError(
                f"{path}: {'SHA-256' if len(blob) == 64 else 'git hash'} {found} does not match {blob}, the "
                f"Hub's digest of {spec.repo}/{repo_path} at {commit}; fetch it again with "
                f"`elmo-fast models fetch {spec.text} --force`"
            )
    return record


def fetch_hub_model(
    spec: HubSpec, *, progress: bool = True, force: bool = False, cache: Path | None = None
) -> ModelRecord:
    """The record of the model in ``spec``'s repository, its files in the Hub's cache and checked: sizes
    on every load, digests (against the Hub's) when first seen (see the module's docstring)."""
    hf = _hub()
    root = cache if cache is not None else cache_dir()
    model: RepoModel | None = None
    listing = None if _offline(hf) else _listing(hf, spec)
    with FetchLock(root, f"hub-{spec.repo.replace('/', '--')}", spec.text, quiet=not progress):
        if listing is not None:
            model = find_model(listing, spec.subfolder, spec.text)
            snapshot = _snapshot(hf, spec, sorted(model.files.values()), force=force, local=False, progress=progress)
        else:
            why = "HF_HUB_OFFLINE is set" if _offline(hf) else "the Hub cannot be reached"
            try:
                snapshot = _snapshot(hf, spec, None, force=False, local=True, progress=progress)
            except Exception as e:  # noqa: BLE001 - LocalEntryNotFoundError and its kin, by version
                partial = getattr(e, "snapshot_path", None)  # the snapshot lacks files: perhaps not the model's
                if partial is not None:
                    snapshot = Path(partial)
                elif "LocalEntryNotFound" in type(e).__name__:
                    raise _not_cached(hf, spec, why) from None
                else:
                    raise
            try:
                model = find_model(_local_files(snapshot), spec.subfolder, f"{spec.text} (in the cache)")
            except ElmoFastError as e:
                raise _not_cached(hf, spec, f"{why} ({e})") from None
        commit = snapshot.name
        paths = {role: snapshot / p for role, p in model.files.items()}
        missing = [p for p in model.files.values() if not (snapshot / p).is_file()]
        if missing:
            raise DownloadError(
                f"{spec.text}: {', '.join(missing)} missing from the Hugging Face cache at {snapshot}; fetch "
                f"them with `{download_command(spec, missing)}`"
            )
        folder = _record_folder(spec, commit, root)
        record = None if force else read_record(folder)
        if record is not None and record.paths() == paths:
            check_sizes(record)
            return record
        files = [_checked_against_hub(spec, role, paths[role], p, commit, folder) for role, p in model.files.items()]
        source = {
            "kind": "hub",
            "repo": spec.repo,
            "revision": spec.revision or _constants().DEFAULT_REVISION,
            "commit": commit,
            "subfolder": model.folder,
            "endpoint": _constants().ENDPOINT,
        }
        record = new_record(spec.text, source, model.layout, files, folder)
        return write_record(replace(record, verified=record.recorded))  # hashed and checked just now
