"""What --model takes (elmo_fast.pretrained.spec) and which files of a repository make a model
(elmo_fast.pretrained.hub_layouts): no network, no optional package."""

from __future__ import annotations

import pytest

from elmo_fast.errors import ElmoFastError
from elmo_fast.formats.model_dir import BILM_TF, MANYLANGS
from elmo_fast.pretrained.hub_layouts import find_model
from elmo_fast.pretrained.spec import BundledSpec, HubSpec, OfficialSpec, UrlSpec, parse_model_spec

PIN = "ab" * 32


@pytest.mark.parametrize(
    "text, expected",
    [
        ("default", BundledSpec()),
        ("original", OfficialSpec("original")),
        ("hf:lysandre/elmo-2x4096_512_2048cnn_2xhighway", HubSpec("lysandre/elmo-2x4096_512_2048cnn_2xhighway")),
        ("hf:o/r@v1.0", HubSpec("o/r", "v1.0")),
        ("hf:o/r@refs%2Fpr%2F1/uniref50_v2", HubSpec("o/r", "refs/pr/1", "uniref50_v2")),
        ("hf:o/r/a/b", HubSpec("o/r", None, "a/b")),
        (f"https://example.org/models/m/#sha256={PIN.upper()}", UrlSpec("https://example.org/models/m", PIN)),
    ],
)
def test_names_parse(text, expected):
    spec = parse_model_spec(text)
    assert spec == expected
    assert parse_model_spec(spec.text) == spec  # the name a record keeps names the same model


@pytest.mark.parametrize(
    "text, message",
    [
        ("nope", "unknown model 'nope'; valid names: default, default-v1, small, medium, original, original-5.5b"),
        ("hf:lonely", "a Hub model is hf:OWNER/REPO[@REVISION][/SUBFOLDER]"),
        ("hf:o/r@", "an empty revision"),
        ("hf:o/r/../x", "a plain path inside the repository"),
        ("hf:o w/r", "'o w' is not a Hub owner or repository name"),
        ("https://example.org/m", "needs its weights file's SHA-256 as a pin, URL#sha256=HEX"),
        ("https://example.org/m#sha256=abc", "64 hexadecimal digits, got 3"),
        (f"https://example.org/m?x=1#sha256={PIN}", "takes no query"),
        ("", "give 'default' (or 'default-v1'), an official name"),
    ],
)
def test_bad_names_are_one_line_errors(text, message):
    with pytest.raises(ElmoFastError) as info:
        parse_model_spec(text)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bilm_tf_layouts():
    m = find_model(["README.md", "options.json", "weights.hdf5", ".gitattributes"], None, "r")
    assert (m.layout, m.folder, m.files) == (BILM_TF, "", {"options": "options.json", "weights": "weights.hdf5"})
    long = "elmo_2x4096_512_2048cnn_2xhighway"
    m = find_model([f"{long}_options.json", f"{long}_weights.hdf5", "README.md"], "", "r")
    assert m.files == {"options": f"{long}_options.json", "weights": f"{long}_weights.hdf5"}
    pubmed = ["x/elmo_pubmed_options.json", "x/elmo_pubmed_weights_PubMed_only.hdf5"]
    assert find_model(pubmed, "x", "r").files["weights"] == pubmed[1]
    # a model elmo-fast trained: its softmax and vocabulary come along, weights named otherwise
    m = find_model(["options.json", "lm.hdf5", "softmax.hdf5", "vocab.txt"], None, "r")
    assert m.files == {"options": "options.json", "weights": "lm.hdf5", "softmax": "softmax.hdf5", "vocab": "vocab.txt"}


def test_seqvec_layout_one_folder_down():
    paths = ["README.md", "uniref50_v2/options.json", "uniref50_v2/weights.hdf5", "other/notes.txt"]
    m = find_model(paths, None, "hf:o/seqvec")
    assert (m.folder, m.files["options"], m.files["weights"]) == (
        "uniref50_v2",
        "uniref50_v2/options.json",
        "uniref50_v2/weights.hdf5",
    )


def test_manylangs_layout():
    paths = ["144/config.json", "144/char.dic", "144/word.dic", "144/encoder.pkl", "144/token_embedder.pkl"]
    paths += ["144/cnn_50_100_512_4096_sample.json", "144/README.md"]
    m = find_model(paths, "144", "r")
    assert m.layout == MANYLANGS and m.folder == "144"
    assert sorted(m.files.values()) == sorted(p for p in paths if not p.endswith("README.md"))


@pytest.mark.parametrize(
    "paths, folder, message",
    [
        (["README.md"], None, "hf:o/r holds no ELMo model: expected options.json + weights.hdf5"),
        (["options.json", "a.hdf5", "b.hdf5"], None, "several weights files (a.hdf5, b.hdf5)"),
        (["a/options.json", "a/weights.hdf5", "b/options.json", "b/weights.hdf5"], None, "several folders (a, b)"),
        (["x_options.json", "x_weights.hdf5", "y_options.json", "y_weights.hdf5"], None, "several models (x, y)"),
        (
            ["options.json", "weights.hdf5", "config.json", "encoder.pkl", "token_embedder.pkl"],
            None,
            "both a bilm-tf model",
        ),
        (["options.json", "weights.hdf5"], "sub", "holds no ELMo model"),
    ],
)
def test_what_is_not_one_model_is_a_one_line_error(paths, folder, message):
    with pytest.raises(ElmoFastError) as info:
        find_model(paths, folder, "hf:o/r")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_ray_model_choice_takes_every_name():
    from elmo_fast.ray.model_choice import ModelChoice

    assert ModelChoice(model="hf:o/r@v1/uniref50_v2").name == "hf:o/r@v1/uniref50_v2"
    ModelChoice(model=f"https://example.org/m#sha256={PIN}")
    with pytest.raises(ElmoFastError, match="model: model 'https://example.org/m': a model by URL needs"):
        ModelChoice(model="https://example.org/m")


def test_a_local_model_tells_what_it_can_be_given_as(tmp_path):
    from pathlib import Path

    from elmo_fast.pretrained import LocalModel

    plain = LocalModel(
        "hf:o/r", BILM_TF, {"options": tmp_path / "options.json", "weights": tmp_path / "w.hdf5"}, tmp_path
    )
    assert plain.model_dir() == tmp_path and plain.constructor_args() == {
        "options_file": tmp_path / "options.json",
        "weight_file": tmp_path / "w.hdf5",
    }
    long = LocalModel(
        "hf:o/r", BILM_TF, {"options": Path("/x/a_options.json"), "weights": Path("/x/a_weights.hdf5")}, Path("/x")
    )
    with pytest.raises(ElmoFastError, match=r"its files \(a_options.json, a_weights.hdf5\) are not a model directory"):
        long.model_dir()
    many = LocalModel("hf:o/m", MANYLANGS, {"config.json": tmp_path / "config.json"}, tmp_path)
    assert many.constructor_args() == {"model_dir": tmp_path, "model_format": "elmoformanylangs"}
    with pytest.raises(ElmoFastError, match="model hf:o/m: an ELMoForManyLangs model"):
        many.bilm_tf_files()
