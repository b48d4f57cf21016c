"""The bundled model's licence terms: one owner (MODEL_INFO.json beside its weights), shown where users
meet the model (`elmo-fast --version`, `elmo-fast doctor`, its model card, the README)."""

from __future__ import annotations

import json

import pytest
from repo_paths import REPO

from elmo_fast.cli import main
from elmo_fast.errors import ModelFileError
from elmo_fast.pretrained import bundled_model_info
from elmo_fast.pretrained.bundled import BUNDLED, DIRECTORY, INFO_FILE, NAME, license_line, model_info


def test_the_terms_are_read_from_beside_the_weights():
    info = bundled_model_info()
    data = json.loads((DIRECTORY / INFO_FILE).read_text(encoding="utf-8"))
    assert info.name == NAME and info.license == data["license"] and info.permissive is data["permissive"]
    assert info.permissive and info.license.startswith("Apache-2.0") and not info.copyleft_training_text
    assert info.model_card == DIRECTORY / "MODEL_CARD.md" and info.model_card.is_file()
    assert info.to_dict()["license"] == info.license
    assert license_line() == f"bundled model '{NAME}': {info.license}; {info.model_card}"


def test_the_previous_default_keeps_its_terms():
    """default-v1 (trained partly on GPL and GFDL text) says so, by name, beside its own weights."""
    info = bundled_model_info(name="default-v1")
    assert info.name == "default-v1" and info.model_card == BUNDLED["default-v1"] / "MODEL_CARD.md"
    assert not info.permissive and "not Apache-2.0" in info.license  # GPL/GFDL-derived, said plainly
    assert {"GPL-2.0-only", "GPL-2.0-or-later"} <= set(info.copyleft_training_text)


def test_missing_or_malformed_terms_are_one_line(tmp_path):
    with pytest.raises(ModelFileError, match=r"MODEL_INFO.json: the bundled model's terms cannot be read"):
        model_info(tmp_path)
    (tmp_path / INFO_FILE).write_text('{"permissive": true}')
    with pytest.raises(ModelFileError, match=r"KeyError: 'license'"):
        model_info(tmp_path)
    (tmp_path / INFO_FILE).write_text('{"license": "MIT", "permissive": true}')
    assert model_info(tmp_path, "other").license == "MIT"


def test_version_names_the_bundled_model_and_its_terms(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("elmo-fast ")
    assert lines[1] == license_line()


def test_doctor_names_the_bundled_model_and_its_terms(capsys):
    assert main(["doctor", "--device", "cpu", "--no-model", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert report["bundled_model"] == bundled_model_info().to_dict()
    assert main(["doctor", "--device", "cpu", "--no-model"]) in (0, 1)
    assert capsys.readouterr().out.splitlines()[1] == license_line()


def test_the_cards_and_the_readme_state_the_terms():
    for folder in BUNDLED.values():
        card = (folder / "MODEL_CARD.md").read_text(encoding="utf-8")
        assert "\n## Licence\n" in card and "Redistributing the weight files" in card, folder
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme[readme.index("\n## Install\n") : readme.index("\n## Quickstarts\n")]  # before any command
    assert "Apache-2.0" in install and "default/MODEL_CARD.md#licence" in install
    assert "default-v1" in install and "GPL" in install  # the previous default's terms, where a user would pin it
