"""docs/models.md's table of named models lists every name `--model` takes, with its source, width, size and
licence."""

from __future__ import annotations

import json
import re

from repo_paths import REPO

from elmo_fast.pretrained import model_names
from elmo_fast.pretrained.bundled import BUNDLED

PAGE = REPO / "docs" / "models.md"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [cell.strip() for cell in m.group(2).split("|")]
    return rows


def test_every_model_name_has_a_row_with_five_columns():
    rows = _rows()
    assert list(rows) == model_names(), "docs/models.md, the named models: add (or remove) the rows of these names"
    for name, cells in rows.items():
        assert len(cells) == 4 and cells[0] and cells[3], f"{name}: source, width, size, licence"


def test_the_bundled_models_width_and_terms_agree_with_their_files():
    from elmo_fast.pretrained import bundled_model_info

    for name, folder in BUNDLED.items():
        width = 2 * json.loads((folder / "options.json").read_text())["lstm"]["projection_dim"]
        cells = _rows()[name]
        assert cells[1] == str(width), name
        assert f"{name}/MODEL_CARD.md#licence" in cells[3], name
        if bundled_model_info(name=name).permissive:
            assert "Apache-2.0" in cells[3] and "not Apache-2.0" not in cells[3], name
        else:
            assert "not Apache-2.0" in cells[3], name
