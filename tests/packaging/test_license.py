"""The licence: the code's (LICENSE, Apache-2.0) in the package metadata and in every sdist and wheel."""

from __future__ import annotations

import sys

import cli_process
import pytest
from repo_paths import REPO as ROOT


def test_license_file_is_the_apache_2_0_text_with_the_copyright_line():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("Copyright ") and "the elmo-fast authors" in text.splitlines()[0]
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert len(text.splitlines()) > 200  # the full text, not a pointer to it


@pytest.mark.slow
def test_metadata_names_the_license_and_ships_the_file(tmp_path):
    """setup.py's metadata says Apache-2.0 and lists LICENSE; the sdist's file list (MANIFEST.in) holds it,
    and so does every wheel (license_files: .dist-info/licenses/LICENSE)."""
    proc = cli_process.run(
        [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "License classifiers are deprecated" not in proc.stderr
    (info,) = tmp_path.glob("*.egg-info")
    pkg_info = (info / "PKG-INFO").read_text(encoding="utf-8").splitlines()
    assert "License-Expression: Apache-2.0" in pkg_info or "License: Apache-2.0" in pkg_info, pkg_info[:20]
    assert "License-File: LICENSE" in pkg_info
    sources = (info / "SOURCES.txt").read_text(encoding="utf-8").splitlines()
    assert "LICENSE" in sources
    # the bundled model's own terms travel with its weights
    for name in ("default", "default-v1"):
        assert f"elmo_fast/pretrained/{name}/MODEL_INFO.json" in sources
        assert f"elmo_fast/pretrained/{name}/MODEL_CARD.md" in sources
