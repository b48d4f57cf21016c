"""Packaging: what the build backend finds, what the wheel holds, and what a broken build says."""

from __future__ import annotations

import sys
from pathlib import Path

import cli_process
import pytest
import torch
from repo_paths import REPO as ROOT

sys.path.insert(0, str(ROOT / "build_support"))


def test_backend_finds_the_installed_torch_in_isolated_mode():
    import elmo_fast_backend as backend

    info = backend.find_installed_torch([sys.executable])
    assert info is not None
    assert Path(info["site_dir"], "torch").is_dir()
    assert info["version"] == torch.__version__
    assert backend.find_installed_torch([str(ROOT / "no-such-python")]) is None


def test_backend_asks_for_nothing_when_torch_is_importable():
    import elmo_fast_backend as backend

    assert backend._torch_requirements() == []


@pytest.mark.parametrize(
    "command, ok, output",
    [
        ("--name", True, "elmo-fast"),  # metadata, sdists: no torch needed
        ("bdist_wheel", False, "building elmo_fast._C needs torch; install torch first"),  # not a wheel without _C
        ("editable_wheel", False, "building elmo_fast._C needs torch; install torch first"),
    ],
)
def test_setup_py_without_torch(command, ok, output):
    code = (
        "import sys, runpy; sys.modules['torch'] = None;"
        f" sys.argv = ['setup.py', {command!r}];"
        f" runpy.run_path({str(ROOT / 'setup.py')!r}, run_name='__main__')"
    )
    proc = cli_process.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (proc.returncode == 0) == ok, proc.stderr
    assert output in proc.stdout + proc.stderr


def test_load_failure_says_which_torch_to_rebuild_against(monkeypatch):
    from types import SimpleNamespace

    from elmo_fast import _extension_info

    monkeypatch.setattr(_extension_info, "extension_file_exists", lambda: True)
    monkeypatch.setattr(_extension_info, "build_info", lambda: SimpleNamespace(TORCH_VERSION="2.0.0+cu118"))
    failed, message = _extension_info.describe_import_failure(ImportError("undefined symbol: _ZN3c10xyz"))
    assert failed
    assert f"built against torch 2.0.0+cu118 but this environment has torch {torch.__version__}" in message
    assert f"rebuilt against torch {torch.__version__}" in message
    assert "undefined symbol: _ZN3c10xyz" in message and "--no-cache-dir" in message


def test_extension_built_against_another_release_is_flagged_even_if_it_loads(monkeypatch):
    from types import SimpleNamespace

    from elmo_fast import _extension_info

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    for built, flagged in [
        (torch.__version__, False),
        (f"{major}.{minor}.99+cu999", False),
        (f"{major}.{minor + 1}.0", True),
        (f"{major - 1}.{minor}.0+cpu", True),
    ]:
        monkeypatch.setattr(_extension_info, "build_info", lambda: SimpleNamespace(TORCH_VERSION=built))
        message = _extension_info.loaded_against_other_release()
        assert (message is not None) == flagged, built
        if flagged:
            assert f"built against torch {built} but runs with torch {torch.__version__}" in message
    monkeypatch.setattr(_extension_info, "build_info", lambda: None)
    assert _extension_info.loaded_against_other_release() is None


def test_missing_extension_is_not_a_load_failure(monkeypatch):
    from elmo_fast import _extension_info

    monkeypatch.setattr(_extension_info, "extension_file_exists", lambda: False)
    failed, message = _extension_info.describe_import_failure(ModuleNotFoundError("No module named 'elmo_fast._C'"))
    assert not failed and message == "ModuleNotFoundError: No module named 'elmo_fast._C'"


def test_require_extension_and_auto_backend_say_why_it_does_not_load(monkeypatch):
    from elmo_fast.bilm import backends as backends_module
    from elmo_fast.bilm import ops
    from elmo_fast.errors import ExtensionNotBuiltError

    reason = "elmo_fast._C was built against torch 1.0 but this environment has torch 2; it must be rebuilt"
    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    monkeypatch.setattr(ops, "EXTENSION_LOAD_FAILED", True)
    monkeypatch.setattr(ops, "EXTENSION_IMPORT_ERROR", reason)
    monkeypatch.setattr(backends_module, "_warned_fallback", False)
    with pytest.raises(ExtensionNotBuiltError, match="does not load: elmo_fast._C was built against torch 1.0"):
        ops.require_extension()
    with pytest.warns(RuntimeWarning, match="reference path.*does not load.*rebuilt"):
        assert backends_module.resolve_backend("auto") == "reference"
