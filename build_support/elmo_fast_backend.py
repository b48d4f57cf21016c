"""In-tree PEP 517 backend: setuptools.build_meta, building elmo_fast._C against the user's torch.

With build isolation (`pip install .`, `pip install elmo-fast` from an sdist, `pip wheel .`,
`python -m build`) the frontend runs the build in a temporary environment holding only the build
requirements. A compiled torch extension must be built against the very torch it will be loaded
by (torch's C++ ABI changes between releases, and a CUDA build of torch needs CUDA kernels that a
CPU torch cannot load), so listing "torch" as a build requirement would compile against whatever
torch the temporary environment got (the newest, often a multi-GB CUDA build), not the one
installed, and the extension would then fail to import.

So torch is not a static build requirement (pyproject.toml). At import, this backend looks for
torch in the environment the package is being installed into (pip runs the backend with that
environment's interpreter: it is asked in isolated mode, `python -E`, which ignores the PYTHONPATH
pip's isolation sets up) and, when it finds one, makes it importable in the build (appended to
sys.path: the build environment's own packages keep precedence). Nothing is downloaded and the
extension matches the installed torch exactly (version, CPU/CUDA variant). Only when no torch is
installed does the build ask for "torch" (then pip installs a torch in the build environment and,
as a dependency of elmo-fast, in the target one: the same release unless pinned otherwise).

Environment:
    ELMO_FAST_BUILD_TORCH=borrow   (default) as above
    ELMO_FAST_BUILD_TORCH=pin      no borrowing: ask for torch==<the installed version> (the frontend
                                   installs that torch in the build environment: a download unless
                                   it is in pip's cache or on a local index)
    ELMO_FAST_BUILD_TORCH=isolated no borrowing, no pin: ask for "torch" (the old behaviour)

Without isolation (`pip install --no-build-isolation -e .`) torch is importable already and this
backend changes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from setuptools import build_meta as _setuptools_backend
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks not wrapped below)

MODE_VAR = "ELMO_FAST_BUILD_TORCH"
MODES = ("borrow", "pin", "isolated")

# Printed by the child interpreter: where torch is and its version, read without importing torch.
_FIND_TORCH = r"""
import importlib.metadata, importlib.util, json, os
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    print("null")
else:
    site_dir = os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))
    version = None
    for dist in importlib.metadata.distributions(path=[site_dir]):
        if (dist.metadata["Name"] or "").lower() == "torch":
            version = dist.version
            break
    print(json.dumps({"site_dir": site_dir, "version": version}))
"""


def _log(message: str) -> None:
    print(f"elmo-fast build: {message}", file=sys.stderr, flush=True)


def _mode() -> str:
    mode = os.environ.get(MODE_VAR, "borrow").strip().lower() or "borrow"
    if mode not in MODES:
        raise SystemExit(f"{MODE_VAR}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _candidate_interpreters() -> list[str]:
    """Interpreters of the environment being installed into, most likely first.

    pip runs the backend with the target environment's interpreter. `python -m build` runs it
    in a throwaway venv of its own (under the temp directory): then the activated environment
    ($VIRTUAL_ENV, $CONDA_PREFIX), if any, is the one the wheel is built for."""
    found = [sys.executable]
    in_throwaway_env = sys.prefix != sys.base_prefix and os.path.realpath(sys.prefix).startswith(
        os.path.realpath(tempfile.gettempdir()) + os.sep
    )
    if in_throwaway_env:
        for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            prefix = os.environ.get(var)
            if prefix and os.path.realpath(prefix) != os.path.realpath(sys.prefix):
                found.append(
                    os.path.join(
                        prefix, "Scripts" if os.name == "nt" else "bin", "python.exe" if os.name == "nt" else "python"
                    )
                )
    return found


def find_installed_torch(interpreters: list[str] | None = None) -> dict | None:
    """{"site_dir", "version", "python"} of the torch installed in the target environment, or None."""
    for python in _candidate_interpreters() if interpreters is None else interpreters:
        if not os.path.isfile(python):
            continue
        try:
            proc = subprocess.run(
                [python, "-E", "-c", _FIND_TORCH],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tempfile.gettempdir(),
            )  # not the source tree: it must not shadow anything
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode != 0:
            continue
        try:
            info = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            continue
        if info and info.get("site_dir") and os.path.isdir(os.path.join(info["site_dir"], "torch")):
            info["python"] = python
            return info
    return None


def _torch_importable() -> bool:
    return importlib.util.find_spec("torch") is not None


# Decided once per hook process (each hook runs in a fresh interpreter).
_BORROWED: dict | None = None
_INSTALLED: dict | None = None
if not _torch_importable():
    if _mode() != "isolated":
        _INSTALLED = find_installed_torch()
    if _INSTALLED is not None and _mode() == "borrow":
        if _INSTALLED["site_dir"] not in sys.path:
            sys.path.append(_INSTALLED["site_dir"])  # after the build environment's own packages
        importlib.invalidate_caches()
        if _torch_importable():
            _BORROWED = _INSTALLED


def _torch_requirements() -> list[str]:
    """What the wheel/editable build asks the frontend for, on top of setuptools' requirements."""
    if _torch_importable():
        if _BORROWED is not None:
            _log(f"building against the installed torch {_BORROWED['version']} ({_BORROWED['site_dir']})")
        return []
    if _INSTALLED is not None and _INSTALLED.get("version"):
        _log(f"{MODE_VAR}={_mode()}: asking for torch=={_INSTALLED['version']} (the installed one)")
        return [f"torch=={_INSTALLED['version']}"]
    _log("no torch installed here: asking for torch (elmo_fast._C gets built against the newest release)")
    return ["torch"]


def _ninja_requirement() -> list[str]:
    """ninja lets torch's BuildExtension compile the sources in parallel (MAX_JOBS)."""
    import shutil

    return [] if shutil.which("ninja") else ["ninja"]


def get_requires_for_build_wheel(config_settings=None):
    return (
        _setuptools_backend.get_requires_for_build_wheel(config_settings) + _torch_requirements() + _ninja_requirement()
    )


def get_requires_for_build_editable(config_settings=None):
    return (
        _setuptools_backend.get_requires_for_build_editable(config_settings)
        + _torch_requirements()
        + _ninja_requirement()
    )
