"""CITATION.cff and CHANGELOG.md: present, well-formed, shipped in the sdist, and saying what they must."""

from __future__ import annotations

import re

import pytest
from repo_paths import REPO


def test_citation_file_cites_elmo_and_seqvec():
    yaml = pytest.importorskip("yaml", reason="PyYAML reads CITATION.cff (pip install pyyaml)")
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert {"message", "title", "authors", "version", "license"} <= set(cff)
    assert cff["license"] == "Apache-2.0"
    from elmo_fast import __version__

    assert str(cff["version"]) == __version__, "CITATION.cff's version is the package's"
    dois = {ref["doi"] for ref in cff["references"]}
    assert dois == {"10.18653/v1/N18-1202", "10.1186/s12859-019-3220-8"}  # ELMo (NAACL 2018), SeqVec (2019)
    for ref in cff["references"]:
        assert ref["title"] and ref["year"] and all("family-names" in a for a in ref["authors"])


def test_changelog_states_its_versioning_policy():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "\n## Versioning\n" in text and "semantic versioning" in text
    for breaking in ("Vectors", "The command line", "Files", "The Python API"):
        assert f"**{breaking}**" in text
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["Versioning", "Unreleased"]
    from elmo_fast import __version__

    assert __version__ in headings, f"CHANGELOG.md has no section for {__version__}"


def test_both_ship_in_the_sdist():
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8")
    include = next(line for line in manifest.splitlines() if line.startswith("include "))
    assert {"LICENSE", "CHANGELOG.md", "CITATION.cff"} <= set(include.split()[1:])
