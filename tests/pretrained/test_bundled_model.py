"""The models bundled in the package (``default``, and the previous default ``default-v1`` by name):
present, small, ``default`` used whenever no model is named, and real (it knows English word order; "bank"
by its context). Their numbers are in each one's MODEL_CARD.md (scripts/model_card.py)."""

from __future__ import annotations

import fnmatch
import json
import logging
import random
import re
import sys

import cli_process
import h5py
import numpy as np
import pytest
import torch
from repo_paths import REPO

from elmo_fast import Elmo, ElmoEmbedder, HubElmo, batch_to_ids
from elmo_fast.cli.models import bank_distances
from elmo_fast.pretrained import bundled_model
from elmo_fast.pretrained.bundled import BUNDLED, DESCRIPTIONS, DIRECTORY, USING_MESSAGE

pytestmark = pytest.mark.skipif(
    not (DIRECTORY / "weights.hdf5").is_file(), reason="the bundled model's files are not in this checkout"
)

ENGLISH = [
    "The cat sat on the mat .",
    "He opened the door and walked into the room .",
    "The function returns a list of strings .",
    "A small river flows through the valley .",
    "She wrote a letter to her brother in London .",
    "The kernel loads the module at boot time .",
    "Water freezes at zero degrees Celsius .",
    "The committee will meet again next week .",
]


def _cli(*args, cwd=None):
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_the_bundled_files_are_there_and_small(name):
    files = bundled_model(name)
    total = sum(p.stat().st_size for p in BUNDLED[name].iterdir() if p.is_file())
    assert total <= 25 * 2**20, f"{total / 2**20:.1f} MiB"
    options = json.loads(files.options.read_text())
    assert options["lstm"]["n_layers"] == 2
    lstm, filters = options["lstm"], sum(n for _, n in options["char_cnn"]["filters"])
    shape = f"2x{lstm['dim']}_{lstm['projection_dim']} LSTM, {filters} char filters, output dim {2 * lstm['projection_dim']}"
    assert shape in DESCRIPTIONS[name] or name != "default", f"its description is stale: the files say {shape}"
    assert len(files.vocab.read_text(encoding="utf-8").splitlines()) == options["n_tokens_vocab"]
    with h5py.File(files.softmax) as f:
        assert f["softmax/W"].shape == (options["n_tokens_vocab"], options["lstm"]["projection_dim"])
    assert (BUNDLED[name] / "MODEL_CARD.md").is_file() and (BUNDLED[name] / "learning_curve.png").is_file()


def test_setup_ships_every_bundled_file():
    """setup.py's package data patterns cover each file of the bundled models (wheel and sdist)."""
    text = (REPO / "setup.py").read_text()
    listed = re.search(r'package_data=\{\s*"elmo_fast":\s*(\[.*?\])', text, re.S)
    assert listed, "setup.py: package_data={'elmo_fast': [...]} not found"
    patterns = json.loads(re.sub(r",\s*\]$", "]", listed.group(1)))  # a trailing comma, as the formatter writes
    for path in (p for folder in BUNDLED.values() for p in folder.iterdir()):
        rel = path.relative_to(REPO / "elmo_fast").as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), rel
    assert "graft elmo_fast" in (REPO / "MANIFEST.in").read_text()


@pytest.fixture(scope="module")
def embedder():
    return ElmoEmbedder()


#: the width of the bundled model's vectors: 2 x its projection
WIDTH = (
    2 * json.loads((DIRECTORY / "options.json").read_text())["lstm"]["projection_dim"]
    if (DIRECTORY / "options.json").is_file()
    else 0
)


def test_no_model_named_means_the_bundled_one_said_in_one_line(caplog):
    with caplog.at_level(logging.WARNING, logger="elmo_fast"):
        e = ElmoEmbedder(batch_size=4)
    lines = [r.getMessage() for r in caplog.records if r.name == "elmo_fast"]
    assert len(lines) == 1 and "bundled model 'default'" in lines[0] and "--model original" in lines[0]
    named = ElmoEmbedder(model_dir=DIRECTORY)
    sentence = ENGLISH[1].split()
    np.testing.assert_array_equal(e.embed_sentence(sentence), named.embed_sentence(sentence))
    assert e.embed_sentence(sentence).shape == (3, len(sentence), WIDTH)


def test_elmo_and_hub_elmo_without_files_use_it():
    ids = batch_to_ids([s.split() for s in ENGLISH[:3]])
    elmo = Elmo(num_output_representations=2, dropout=0.0)
    out = elmo(ids)
    assert len(out["elmo_representations"]) == 2 and out["elmo_representations"][0].shape[-1] == WIDTH
    hub = HubElmo()
    got = hub(ENGLISH[:3])
    assert got["elmo"].shape == (3, max(len(s.split()) for s in ENGLISH[:3]), WIDTH)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bank_by_its_context(name):
    """The classic check: layer 0 gives every "bank" one vector; at layers 1 and 2 the two money
    banks are closer to each other than either is to the river bank."""
    layers = bank_distances(ElmoEmbedder(model=name))
    assert max(layers[0].values()) < 1e-5
    for k in (1, 2):
        d = layers[k]
        assert d["money-money"] < min(d["money1-river"], d["money2-river"]), (k, d)


@pytest.mark.slow
def test_it_knows_word_order(tmp_path):
    """Held-out perplexity of English sentences far below the vocabulary size, and far below that
    of the same sentences with their words shuffled (`elmo-fast perplexity` without --model-dir)."""
    rng = random.Random(0)
    shuffled = []
    for s in ENGLISH:
        words = s.split()
        rng.shuffle(words)
        shuffled.append(" ".join(words))
    (tmp_path / "en.txt").write_text("\n".join(ENGLISH) + "\n")
    (tmp_path / "shuffled.txt").write_text("\n".join(shuffled) + "\n")
    results = {}
    for name in ("en", "shuffled"):
        r = _cli("perplexity", tmp_path / f"{name}.txt", "--json")
        assert r.returncode == 0, r.stderr
        assert r.stderr.strip() == USING_MESSAGE
        results[name] = json.loads(r.stdout)
    assert results["en"]["mean"] < 1000 < 32000
    assert results["shuffled"]["mean"] > 3 * results["en"]["mean"], results


@pytest.mark.slow
def test_embed_without_a_model_uses_it(tmp_path, embedder):
    (tmp_path / "in.txt").write_text("\n".join(ENGLISH[:4]) + "\n")
    r = _cli("embed", tmp_path / "in.txt", tmp_path / "out.hdf5", "--all", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == USING_MESSAGE
    with h5py.File(tmp_path / "out.hdf5") as f:
        for i, s in enumerate(ENGLISH[:4]):
            np.testing.assert_allclose(f[str(i)][...], embedder.embed_sentence(s.split()), atol=1e-5, rtol=0)
    r = _cli("embed", tmp_path / "in.txt", tmp_path / "named.hdf5", "--all", "--quiet", "--model", "default")
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.slow
def test_finetune_starts_from_it(tmp_path):
    """`elmo-fast finetune` without --model-dir continues the bundled model (its softmax included)."""
    (tmp_path / "train.txt").write_text("\n".join(ENGLISH * 4) + "\n")
    r = _cli(
        "finetune",
        "--train",
        tmp_path / "train.txt",
        "--out",
        tmp_path / "ft",
        "--max-steps",
        2,
        "--batch-size",
        8,
        "--negative-samples",
        64,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert USING_MESSAGE in r.stderr and "has no softmax.hdf5" not in r.stderr
    tuned = ElmoEmbedder(model_dir=tmp_path / "ft")
    base = ElmoEmbedder(model_dir=DIRECTORY)
    s = ENGLISH[0].split()
    assert not np.allclose(tuned.embed_sentence(s), base.embed_sentence(s))
    with torch.no_grad():
        assert tuned.elmo_bilm.options.to_dict() == base.elmo_bilm.options.to_dict()
