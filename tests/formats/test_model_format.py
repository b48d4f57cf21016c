"""A model folder holding both a bilm-tf model and an ELMoForManyLangs model is never guessed: every
entry point asks which to load (model_format, the CLI's --model-format), and loads the one named."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from elmo_fast import Elmo, ElmoEmbedder, ModelFileError
from elmo_fast.cli import main
from elmo_fast.errors import ElmoFastError
from elmo_fast.formats.model_dir import BILM_TF, MANYLANGS, inspect_model_dir
from elmo_fast.formats.random_models import random_manylangs_model, random_model
from elmo_fast.manylangs import Embedder

SENTENCES = [["A", "bank", "."], ["x"]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    both = tmp_path_factory.mktemp("both")
    random_model("tiny", both, seed=1)
    random_manylangs_model("tiny", both, seed=2)
    alone = {BILM_TF: tmp_path_factory.mktemp("bilm_tf"), MANYLANGS: tmp_path_factory.mktemp("manylangs")}
    random_model("tiny", alone[BILM_TF], seed=1)
    random_manylangs_model("tiny", alone[MANYLANGS], seed=2)
    return both, alone


def test_a_folder_with_both_models_asks_which(folders):
    both, _ = folders
    with pytest.raises(ModelFileError) as info:
        inspect_model_dir(both)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"{both} holds both a bilm-tf model (options.json and weights.hdf5) and an ELMoForManyLangs "
        f"model (config.json, token_embedder.pkl, encoder.pkl): say which to load with "
        f"model_format='bilm-tf' or model_format='elmoformanylangs'"
    )
    for make in (
        lambda: ElmoEmbedder(model_dir=both),
        lambda: ElmoEmbedder(both),
        lambda: Elmo(both, num_output_representations=1),
        lambda: Embedder(both),
    ):
        with pytest.raises(ModelFileError, match="holds both a bilm-tf model"):
            make()


def test_the_cli_names_its_flag(folders, tmp_path):
    both, _ = folders
    inp = tmp_path / "in.txt"
    inp.write_text("a b\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["embed", str(inp), str(tmp_path / "o.h5"), "--all", "--model-dir", str(both)])
    assert code == 2
    assert (
        err.getvalue()
        .strip()
        .endswith("say which to load with --model-format bilm-tf or --model-format elmoformanylangs")
    )
    assert not (tmp_path / "o.h5").exists()
    with contextlib.redirect_stderr(io.StringIO()):
        code = main(
            [
                "embed",
                str(inp),
                str(tmp_path / "o.h5"),
                "--all",
                "--model-dir",
                str(both),
                "--model-format",
                "elmoformanylangs",
                "--quiet",
            ]
        )
    assert code == 0 and (tmp_path / "o.h5").exists()


@pytest.mark.parametrize(
    "model_format, kind", [("bilm-tf", BILM_TF), ("elmoformanylangs", MANYLANGS), ("ELMoForManyLangs", MANYLANGS)]
)
def test_model_format_loads_the_one_named(folders, model_format, kind):
    both, alone = folders
    assert inspect_model_dir(both, model_format).kind == kind
    got = ElmoEmbedder(model_dir=both, model_format=model_format).embed_batch(SENTENCES)
    want = ElmoEmbedder(model_dir=alone[kind]).embed_batch(SENTENCES)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert Elmo(both, num_output_representations=1, model_format=model_format) is not None
    assert Embedder(both, model_format=model_format).sents2elmo(SENTENCES)[0].shape == (3, want[0].shape[-1])


def test_model_format_checks(folders):
    both, alone = folders
    with pytest.raises(ModelFileError, match=r"model_format must be one of bilm-tf, elmoformanylangs, got 'hdf5'"):
        ElmoEmbedder(model_dir=both, model_format="hdf5")
    with pytest.raises(ModelFileError, match=r"missing config.json \(an ELMoForManyLangs model directory holds"):
        ElmoEmbedder(model_dir=alone[BILM_TF], model_format="elmoformanylangs")
    with pytest.raises(
        ElmoFastError,
        match=r"options_file and weight_file are a bilm-tf model, but model_format is "
        r"'elmoformanylangs'",
    ):
        ElmoEmbedder(alone[BILM_TF] / "options.json", alone[BILM_TF] / "weights.hdf5", model_format="elmoformanylangs")
    # one kind alone needs no model_format, as before
    assert inspect_model_dir(alone[BILM_TF]).kind == BILM_TF and inspect_model_dir(alone[MANYLANGS]).kind == MANYLANGS
