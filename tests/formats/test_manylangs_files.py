"""ELMoForManyLangs model directories as files: what is read and how (dictionaries, configs, pickles),
which kind of model a directory holds, one-line errors for everything else, and `elmo-fast embed
--model-dir` on both kinds of directory."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmo_fast import ElmoEmbedder
from elmo_fast.cli import main
from elmo_fast.errors import ModelFileError
from elmo_fast.formats.manylangs_dir import (
    ManyLangsConfig,
    find_config,
    load_manylangs,
    read_dictionary,
    shipped_configs_dir,
)
from elmo_fast.formats.model_dir import BILM_TF, MANYLANGS, inspect_model_dir, load_model_dir
from elmo_fast.formats.random_models import MANYLANGS_PRESETS, random_manylangs_model, random_model
from elmo_fast.manylangs import Embedder

TINY = MANYLANGS_PRESETS["tiny"]


@pytest.fixture
def model(tmp_path) -> Path:
    """A fresh tiny ELMoForManyLangs directory, to break."""
    return random_manylangs_model("tiny", tmp_path / "model", n_words=50)


def load_error(directory) -> str:
    with pytest.raises(ModelFileError) as info:
        load_model_dir(directory)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --- dictionaries ------------------------------------------------------------------------------


def test_dictionary_rules(tmp_path):
    path = tmp_path / "char.dic"
    lines = ["a\t1", "b\t2", "\u3000\t3", "a\t4", "", "c d\t5", "x\t+6", "\u2028", "\xa0\t7", "z\t8"]
    path.write_text("\n".join(lines) + "\r\n\n", encoding="utf-8")
    assert read_dictionary(path) == {"a": 4, "b": 2, "\u3000": 7, "c d": 5, "x": 6, "z": 8}


@pytest.mark.parametrize(
    "text,match",
    [
        ("a\t1\tb\n", r"line 1: expected 'token<TAB>id'"),
        ("a\tone\n", r"line 1: the id 'one' is not an integer"),
        ("a\t-1\n", r"line 1: negative id -1"),
        ("\n\n", r"the dictionary is empty"),
        ("\ufeffa\t1\n", r"byte-order mark"),
    ],
)
def test_dictionary_errors(tmp_path, text, match):
    path = tmp_path / "word.dic"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ModelFileError, match=match):
        read_dictionary(path)


def test_dictionary_not_utf8(tmp_path):
    path = tmp_path / "word.dic"
    path.write_bytes(b"a\t1\n\xff\t2\n")
    with pytest.raises(ModelFileError, match=r"word.dic: not UTF-8"):
        read_dictionary(path)


@pytest.mark.peers
def test_elmoformanylangs_reads_dictionaries_the_same_way(tmp_path):
    """Its own reader (codecs, strip, split, U+3000) on a file of every quirk it survives (a blank line, or
    a token that is a line boundary such as U+2028, stops it)."""
    from peers import manylangs

    manylangs()
    import codecs

    path = tmp_path / "char.dic"
    path.write_text("a\t1\r\nb\t2\n\u3000\t3\na\t4\n\xa0\t7\nc d\t5\r\nx\t+6\nz\t8", encoding="utf-8")
    theirs = {}
    with codecs.open(str(path), "r", encoding="utf-8") as fpi:  # elmo.py's loop, verbatim
        for line in fpi:
            tokens = line.strip().split("\t")
            if len(tokens) == 1:
                tokens.insert(0, "\u3000")
            token, i = tokens
            theirs[token] = int(i)
    assert read_dictionary(path) == theirs


# --- configs ----------------------------------------------------------------------------------


def test_config_path_resolution(model, tmp_path):
    (model / "config.json").write_text(json.dumps({"config_path": "C:\\Users\\someone\\configs\\config.model.json"}))
    assert find_config(model) == model / "config.model.json"
    sub = model / "configs"
    sub.mkdir()
    shutil.move(model / "config.model.json", sub / "c.json")
    (model / "config.json").write_text(json.dumps({"config_path": "configs/c.json"}))
    assert find_config(model) == sub / "c.json"
    (model / "config.json").write_text(json.dumps({"config_path": str((sub / "c.json").resolve())}))
    assert find_config(model) == (sub / "c.json").resolve()
    # the order: the path relative to the directory first, then its base name in the directory
    shutil.copy(sub / "c.json", model / "c.json")
    (model / "config.json").write_text(json.dumps({"config_path": "configs/c.json"}))
    assert find_config(model) == sub / "c.json"
    (model / "config.json").write_text(json.dumps({"config_path": "elsewhere/c.json"}))
    assert find_config(model) == model / "c.json"


@pytest.mark.peers
def test_shipped_configs_are_found_last(model):
    from peers import INSTALL, use_peers

    use_peers()
    shipped = shipped_configs_dir()
    if shipped is None:
        pytest.skip(f"elmoformanylangs is not installed: {INSTALL}")
    (model / "config.json").write_text(json.dumps({"config_path": "/opt/elmo/cnn_50_100_512_4096_sample.json"}))
    path = find_config(model)
    assert path == shipped / "cnn_50_100_512_4096_sample.json"
    # a file of that base name in the directory comes before the shipped one
    shutil.copy(model / "config.model.json", model / "cnn_50_100_512_4096_sample.json")
    assert find_config(model) == model / "cnn_50_100_512_4096_sample.json"
    (model / "cnn_50_100_512_4096_sample.json").unlink()
    config = ManyLangsConfig.from_dict(json.loads(path.read_text()))
    assert (config.char_dim, config.word_dim, config.projection_dim, config.cell_dim, config.n_filters) == (
        50,
        100,
        512,
        4096,
        2048,
    )


def _edit_config(model: Path, edit) -> None:
    path = model / "config.model.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda c: c["encoder"].pop("projection_dim"), r"config.model.json: missing key 'encoder.projection_dim'"),
        (lambda c: c.pop("token_embedder"), r"missing key 'token_embedder'"),
        (
            lambda c: c["token_embedder"].update(name="lstm"),
            r"'token_embedder.name' is 'lstm', which ELMoForManyLangs itself cannot run",
        ),
        (
            lambda c: c["encoder"].update(name="lstm"),
            r"'encoder.name' is 'lstm', which ELMoForManyLangs itself cannot run",
        ),
        (lambda c: c["encoder"].update(name="transformer"), r"'encoder.name' must be 'elmo'"),
        (
            lambda c: c["token_embedder"].update(activation="gelu"),
            r"'token_embedder.activation' must be 'relu' or 'tanh'",
        ),
        (lambda c: c["token_embedder"].update(max_characters_per_token=5), r"must be >= 7"),
        (lambda c: c["token_embedder"].update(filters=[[60, 4]]), r"widths in 1..50"),
        (lambda c: c["encoder"].update(cell_clip=-3), r"'encoder.cell_clip' must be a number >= 0"),
        (lambda c: c["encoder"].update(dim="4096"), r"'encoder.dim' must be an integer >= 1, got '4096'"),
        (lambda c: c["token_embedder"].update(char_dim=0, word_dim=0), r"both 0"),
    ],
)
def test_config_errors(model, edit, match):
    _edit_config(model, edit)
    assert re.search(match, load_error(model)), load_error(model)


def test_outer_config_errors(model):
    (model / "config.json").write_text("{}")
    assert "missing key 'config_path'" in load_error(model)
    (model / "config.json").write_text(json.dumps({"config_path": "/nowhere/else.json"}))
    msg = load_error(model)
    assert "config_path '/nowhere/else.json' is not found: tried" in msg and str(model / "else.json") in msg
    (model / "config.json").write_text("{not json")
    assert "config.json: cannot read ELMoForManyLangs config as JSON" in load_error(model)


# --- state dicts ------------------------------------------------------------------------------


def _edit_pickle(path: Path, edit) -> None:
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


@pytest.mark.parametrize(
    "name,edit,match",
    [
        (
            "token_embedder.pkl",
            lambda s: s.update({"convolutions.1.weight": torch.zeros(8, 6, 3)}),
            r"token_embedder.pkl: 'convolutions.1.weight' has shape \(8, 6, 3\), expected \(8, 6, 2\) "
            r"\(from token_embedder.filters\[1\] = \[2, 8\], char_dim 6\)",
        ),
        ("token_embedder.pkl", lambda s: s.pop("projection.bias"), r"token_embedder.pkl: missing 'projection.bias'"),
        (
            "token_embedder.pkl",
            lambda s: s.pop("word_emb_layer.embedding.weight"),
            r"missing 'word_emb_layer.embedding.weight'",
        ),
        (
            "encoder.pkl",
            lambda s: s.pop("backward_layer_1.state_projection.weight"),
            r"encoder.pkl: missing 'backward_layer_1.state_projection.weight' \(expected shape \(16, 48\)",
        ),
        (
            "encoder.pkl",
            lambda s: s.update({"forward_layer_2.input_linearity.weight": torch.zeros(192, 16)}),
            r"encoder.pkl: holds 'forward_layer_2.input_linearity.weight', which the config does not describe",
        ),
        (
            "encoder.pkl",
            lambda s: s["forward_layer_0.state_linearity.bias"].__setitem__(3, float("nan")),
            r"'forward_layer_0.state_linearity.bias' holds NaN or Inf values",
        ),
        (
            "encoder.pkl",
            lambda s: s.update({"forward_layer_0.state_linearity.bias": torch.zeros(192, dtype=torch.long)}),
            r"'forward_layer_0.state_linearity.bias' has dtype torch.int64, expected a float type",
        ),
        (
            "token_embedder.pkl",
            lambda s: s.update({"highways._layers.0.bias": torch.full((120,), 1e300, dtype=torch.float64)}),
            r"'highways._layers.0.bias' holds values too large for float32",
        ),
    ],
)
def test_state_dict_errors(model, name, edit, match):
    _edit_pickle(model / name, edit)
    assert re.search(match, load_error(model)), load_error(model)


def test_other_float_dtypes_load_as_fp32(model):
    want = load_manylangs(model)
    _edit_pickle(model / "encoder.pkl", lambda s: s.update({k: v.double() for k, v in s.items()}))
    got = load_manylangs(model)
    assert got.lstm[1][0].w_hh.dtype == torch.float32
    assert torch.equal(got.lstm[1][0].w_hh, want.lstm[1][0].w_hh)


def test_unreadable_pickles(model):
    path = model / "encoder.pkl"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    assert "encoder.pkl: cannot read as a PyTorch state dict (truncated or corrupt?)" in load_error(model)
    torch.save([torch.zeros(3)], path)
    assert "encoder.pkl: holds a list, expected a state dict" in load_error(model)
    torch.save({"a": 1}, path)
    assert "entry 'a' is of type int, expected a tensor" in load_error(model)


class _Exploit:
    def __reduce__(self):
        return (print, ("code ran while loading",))


def test_pickles_cannot_run_code(model, capsys):
    for legacy in (False, True):
        torch.save({"x": _Exploit()}, model / "token_embedder.pkl", _use_new_zipfile_serialization=not legacy)
        assert "cannot read as a PyTorch state dict" in load_error(model)
    assert "code ran" not in capsys.readouterr().out


def test_vocabulary_errors(model):
    text = (model / "char.dic").read_text(encoding="utf-8")
    (model / "char.dic").write_text(text.replace("<eow>\t", "<EOW>\t"), encoding="utf-8")
    assert "char.dic: missing the entry '<eow>'" in load_error(model)
    (model / "char.dic").write_text(text + "q\t100000\n", encoding="utf-8")
    assert "char.dic: 'q' has id 100000, but token_embedder.pkl's char_emb_layer has" in load_error(model)


# --- which kind of directory ------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["token_embedder.pkl", "encoder.pkl", "char.dic", "word.dic"])
def test_missing_manylangs_files(model, missing):
    (model / missing).unlink()
    msg = load_error(model)
    assert msg.startswith(f"{model}: missing {missing} (an ELMoForManyLangs model directory holds")


def test_directory_kinds(model, tmp_path):
    assert inspect_model_dir(model).kind == MANYLANGS
    bilm_dir = tmp_path / "bilm"
    random_model("tiny", bilm_dir)
    found = inspect_model_dir(bilm_dir)
    assert found.kind == BILM_TF and found.files == {
        "options": bilm_dir / "options.json",
        "weights": bilm_dir / "weights.hdf5",
    }
    (tmp_path / "empty").mkdir()
    msg = load_error(tmp_path / "empty")
    assert "not a model directory: it holds neither options.json and weights.hdf5 (bilm-tf, allennlp) nor" in msg
    (bilm_dir / "weights.hdf5").unlink()
    assert (
        load_error(bilm_dir) == f"{bilm_dir}: missing weights.hdf5 (a bilm-tf model directory holds options.json "
        "and weights.hdf5)"
    )
    (model / "config.json").unlink()
    assert "missing config.json (an ELMoForManyLangs model directory" in load_error(model)
    assert "model directory not found" in load_error(tmp_path / "nowhere")
    assert "not a directory" in load_error(bilm_dir / "options.json")


def test_words_only_model_needs_no_char_dic(tmp_path):
    d = random_manylangs_model(replace(TINY, char_dim=0, filters=(), n_highway=0), tmp_path / "m", n_words=20)
    assert not (d / "char.dic").exists()
    assert set(inspect_model_dir(d).files) == {
        "config.json",
        "config_path",
        "word.dic",
        "token_embedder.pkl",
        "encoder.pkl",
    }
    assert Embedder(d).sents2elmo([["a", "b"]])[0].shape == (2, 32)


def test_bilm_tf_directory_equals_its_files(tmp_path):
    options, weights = random_model("tiny", tmp_path / "bilm")
    sents = [["The", "cat", "."], ["A"]]
    by_files = ElmoEmbedder(options, weights).embed_batch(sents)
    for e in (
        ElmoEmbedder(tmp_path / "bilm"),
        ElmoEmbedder(model_dir=tmp_path / "bilm"),
        Embedder(tmp_path / "bilm").embedder,
    ):
        for a, b in zip(e.embed_batch(sents), by_files):
            assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="either model_dir or options_file"):
        ElmoEmbedder(options, model_dir=tmp_path / "bilm")
    with pytest.raises(ValueError, match="give options_file and weight_file"):
        ElmoEmbedder(options)


# --- elmo-fast embed --model-dir --------------------------------------------------------------

SENTENCES = ["Jó reggelt !", "a b c d e", "hosszú" * 9 + " 日本 😀", "<bos> x <eos>"]


@pytest.mark.parametrize("fmt", ["all", "top", "average"])
def test_embed_model_dir_manylangs(model, tmp_path, fmt, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(inp), str(out), f"--{fmt}", "--model-dir", str(model), "--quiet"]) == 0
    layer = {"all": -2, "top": 2, "average": -1}[fmt]
    want = Embedder(model).sents2elmo([s.split() for s in SENTENCES], output_layer=layer)
    with h5py.File(out, "r") as f:
        for i, w in enumerate(want):
            assert f[str(i)].shape == w.shape
            assert np.abs(f[str(i)][...] - w).max() <= 1e-6


def test_embed_model_dir_bilm_tf_and_resume(tmp_path, model):
    options, weights = random_model("tiny", tmp_path / "bilm")
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    a, b = tmp_path / "a.hdf5", tmp_path / "b.hdf5"
    assert main(["embed", str(inp), str(a), "--all", "--model-dir", str(tmp_path / "bilm"), "--quiet"]) == 0
    assert (
        main(["embed", str(inp), str(b), "--all", "--options", str(options), "--weights", str(weights), "--quiet"]) == 0
    )
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert all(np.array_equal(fa[str(i)][...], fb[str(i)][...]) for i in range(len(SENTENCES)))
    c = tmp_path / "c.hdf5"
    assert main(["embed", str(inp), str(c), "--all", "--model-dir", str(model), "--quiet", "--resume"]) == 0
    assert main(["embed", str(inp), str(c), "--all", "--model-dir", str(model), "--quiet", "--resume"]) == 0


def test_embed_model_dir_errors(tmp_path, model, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("a b\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(inp), str(out), "--all", "--model-dir", str(model), "--options", "x"]) == 2
    assert "give one of --model-dir DIR, --model NAME or --options F --weights F" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["embed", str(inp), str(out), "--all", "--model-dir", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a model directory" in err
    (model / "encoder.pkl").unlink()
    assert main(["embed", str(inp), str(out), "--all", "--model-dir", str(model)]) == 2
    assert "missing encoder.pkl" in capsys.readouterr().err
    assert not out.exists()


def test_training_commands_name_an_elmoformanylangs_directory(tmp_path, model, capsys):
    """finetune and perplexity work through bilm-tf's softmax, which this layout does not hold: one line
    saying what the directory is and what works with it."""
    inp = tmp_path / "in.txt"
    inp.write_text("a b\n", encoding="utf-8")
    assert main(["perplexity", str(inp), "--model-dir", str(model)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "an ELMoForManyLangs model, which has no bilm-tf softmax" in err, err
