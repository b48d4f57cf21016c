"""`elmo-fast convert`: bilm-tf training folders and TF-Hub modules read without TensorFlow.

The fixtures in tests/fixtures/tf_checkpoints/ were written once by TensorFlow 2.21
(tests/fixtures/recorders/record_tf_checkpoints.py, which also saved every array as bilm-tf's
dump_weights would write it, in expected.npz): these tests need no TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import cli_process
import h5py
import numpy as np
import pytest
from repo_paths import FIXTURES, REPO

from elmo_fast import ElmoEmbedder
from elmo_fast.convert import OUTPUT_FILES, convert
from elmo_fast.convert.variables import _dataset_name
from elmo_fast.durable import WriteError
from elmo_fast.errors import ModelFileError
from elmo_fast.formats.bilm_tf import expected_datasets, load_model_files, load_options
from elmo_fast.formats.crc32c import _loop, crc32c, masked, unmasked
from elmo_fast.formats.random_models import write_model
from elmo_fast.formats.sstable import MAGIC, read_table
from elmo_fast.formats.tf_checkpoint import TensorBundle, read_checkpoint_state

FIX = FIXTURES / "tf_checkpoints"
RUN, HUB, VOCAB = FIX / "bilm_tf_run", FIX / "hub_module", FIX / "vocab.txt"
SENTENCES = [["The", "ELMo", "of", "a", "run", "."], ["x"], ["and", "to", "the", "fog"]]


@pytest.fixture(scope="module")
def expected():
    with np.load(FIX / "expected.npz") as f:
        return {k: f[k] for k in f.files}


def _arrays(expected, prefix):
    return {k[len(prefix) :]: v for k, v in expected.items() if k.startswith(prefix)}


def _hdf5(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(
            lambda name, obj: out.__setitem__(name, (obj[...], obj.dtype)) if isinstance(obj, h5py.Dataset) else None
        )
    return out


def _embed(options, weights):
    return [v.copy() for v in ElmoEmbedder(options, weights, backend="reference").embed_sentences(SENTENCES)]


# ---- CRC-32C and the table format ----------------------------------------------------------------


def test_crc32c_standard_values_lanes_and_extension():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA and crc32c(b"") == 0
    rng = np.random.default_rng(7)
    for n in (1, 3, 4095, 4096, 4097, 65537, (3 << 20) + 5):  # the plain loop, lanes, lanes + a tail
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        want = _loop(0xFFFFFFFF, data) ^ 0xFFFFFFFF
        assert crc32c(data) == want, n
        k = int(rng.integers(0, n + 1))
        assert crc32c(data[k:], crc32c(data[:k])) == want  # TensorFlow's crc32c::Extend
    for x in (0, 1, 0xE3069283, 0xFFFFFFFF):
        assert unmasked(masked(x)) == x and masked(x) != x


def _varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def write_table(path, rows):
    """A LevelDB table of ``rows`` (sorted (key, value) bytes), one data block, as TensorFlow writes."""
    data = bytearray()

    def block(entries):
        body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
        body += struct.pack("<II", 0, 1)  # one restart point, at 0
        offset = len(data)
        data.extend(body + b"\x00" + struct.pack("<I", masked(crc32c(body + b"\x00"))))
        return _varint(offset) + _varint(len(body))

    handle = block(rows)
    meta = block([])
    index = block([(rows[-1][0], handle)])
    footer = (meta + index).ljust(40, b"\x00") + struct.pack("<Q", MAGIC)
    Path(path).write_bytes(bytes(data) + footer)


def rewrite_index(prefix, out_prefix, rename=lambda k: k):
    """A copy of checkpoint ``prefix`` with its tensors renamed (None: dropped); data shards copied."""
    rows = read_table(str(prefix) + ".index")
    renamed = [rows[0]] + [(rename(k.decode()).encode(), v) for k, v in rows[1:] if rename(k.decode()) is not None]
    write_table(str(out_prefix) + ".index", sorted(renamed))
    for shard in Path(prefix).parent.glob(Path(prefix).name + ".data-*"):
        if Path(prefix) != Path(out_prefix):
            shutil.copy(shard, Path(out_prefix).parent / (Path(out_prefix).name + shard.name[len(Path(prefix).name) :]))


def test_table_written_here_reads_back_and_a_real_index_reads_whole():
    rows = read_table(RUN / "model.ckpt-3.index")
    assert rows[0][0] == b"" and [k for k, _ in rows] == sorted(k for k, _ in rows)
    bundle = TensorBundle(RUN / "model.ckpt-3")
    assert (
        bundle.num_shards == 1 and len(bundle.entries) == 64
    )  # 29 weights + 2 softmax, their Adagrad slots, 2 scalars
    assert float(bundle.read("global_step")) == 3.0  # bilm-tf's float32 global step, after 3 steps


def test_every_weight_dtype_reads_as_tensorflow_wrote_it(expected):
    bundle = TensorBundle(FIX / "dtypes" / "ckpt")
    for name in ("f16", "f64", "bf16", "i64", "i32", "scalar"):
        got, want = bundle.read(name), expected[f"dtypes/{name}"]
        assert got.shape == want.shape and np.array_equal(got, want), name
    assert bundle.read("f16").dtype == np.float16 and bundle.read("bf16").dtype == np.float32  # bfloat16 widened
    assert bundle.read("i64")[2] == 2**40


def test_checkpoint_state_file():
    latest, listed = read_checkpoint_state(RUN / "checkpoint")
    assert latest.endswith("/model.ckpt-3") and [p[-12:] for p in listed] == ["model.ckpt-2", "model.ckpt-3"]


# ---- conversions ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_bilm_tf_run_converts_to_dump_weights_datasets_softmax_and_vocab(expected, tmp_path):
    out = tmp_path / "model"
    lines = []
    convert(RUN, out, vocab=VOCAB, log=lines.append)
    want = _arrays(expected, "step3/")
    got = _hdf5(out / "weights.hdf5")
    softmax = {k: want.pop(k) for k in ("softmax/W", "softmax/b")}
    assert set(got) == set(want)  # exactly dump_weights' datasets, nothing more
    for name, (value, dtype) in got.items():
        assert dtype == np.float32 and value.shape == want[name].shape and np.array_equal(value, want[name]), name
    assert got["char_embed"][0].shape == (261, 3)  # as dump_weights writes it: no padding row
    sm = _hdf5(out / "softmax.hdf5")
    assert set(sm) == set(softmax) and all(np.array_equal(sm[k][0], softmax[k]) for k in softmax)
    assert (out / "vocab.txt").read_text() == VOCAB.read_text()
    options = json.loads((out / "options.json").read_text())
    assert options["char_cnn"]["n_characters"] == 262 and options["n_tokens_vocab"] == 12
    assert options["lstm"]["cell_clip"] == 3 and options["lstm"]["proj_clip"] == 3
    # the datasets are those its options call for, and the model computes what the dumped arrays compute
    parsed = load_options(out / "options.json")
    assert {k: v[0] for k, v in expected_datasets(parsed).items()} == {k: v.shape for k, v in want.items()}
    direct = write_model(tmp_path / "direct", parsed, want)
    for a, b in zip(_embed(out / "options.json", out / "weights.hdf5"), _embed(*direct)):
        assert a.shape[0] == 3 and np.array_equal(a, b)
    text = "\n".join(lines)
    assert "step 3 (the latest); also here: step 2" in text
    assert f"cell_clip 3.0: {RUN / 'options.json'}" in text and "proj_clip 3.0" in text
    assert "(training and run-time state): global_step, train_perplexity and 31 Adagrad accumulators" in text


def test_step_picks_an_earlier_checkpoint(expected, tmp_path):
    convert(RUN, tmp_path / "m", step=2)
    want = _arrays(expected, "step2/")
    got = _hdf5(tmp_path / "m" / "weights.hdf5")
    assert all(np.array_equal(got[k][0], want[k]) for k in got)
    assert not np.array_equal(got["char_embed"][0], expected["step3/char_embed"])
    assert not (tmp_path / "m" / "vocab.txt").exists()  # none given, none beside the run
    with pytest.raises(ModelFileError, match=r"--step 7: .* no checkpoint of step 7 .*steps here: 2, 3$"):
        convert(RUN, tmp_path / "n", step=7)
    assert not (tmp_path / "n").exists()


def test_checkpoint_paths_of_another_machine_and_flags_over_options(expected, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "checkpoint").write_text(
        'model_checkpoint_path: "C:\\\\runs\\\\elmo\\\\model.ckpt-2"\n'
        'all_model_checkpoint_paths: "C:\\\\runs\\\\elmo\\\\model.ckpt-2"\n'
    )
    lines = []
    convert(run, tmp_path / "m", cell_clip=5.0, log=lines.append)
    assert np.array_equal(_hdf5(tmp_path / "m" / "weights.hdf5")["char_embed"][0], expected["step2/char_embed"])
    options = load_options(tmp_path / "m" / "options.json")
    assert options.cell_clip == 5.0 and options.proj_clip == 3.0
    assert any("cell_clip 5.0: --cell-clip, over 3 in" in line for line in lines)
    # without options.json the clips are the published models' 3, said as such
    (run / "options.json").unlink()
    lines = []
    convert(run, tmp_path / "m2", log=lines.append)
    assert load_options(tmp_path / "m2" / "options.json").cell_clip == 3.0
    assert any("cell_clip 3.0: default: the published models' value (--cell-clip sets it)" in x for x in lines)


def test_tf_hub_module_converts(expected, tmp_path):
    out = tmp_path / "hub"
    convert(HUB, out)
    want = _arrays(expected, "hub/")
    mix = {k: want.pop(k) for k in ("aggregation/weights", "aggregation/scaling")}
    got = _hdf5(out / "weights.hdf5")
    assert set(got) == set(want)
    assert all(got[k][1] == np.float32 and np.array_equal(got[k][0], want[k]) for k in got)
    assert got["char_embed"][0].shape == (261, 3)  # the module's padding row dropped, as dump_weights has it
    assert sorted(os.listdir(out)) == ["hub_scalar_mix.json", "options.json", "weights.hdf5"]
    scalar_mix = json.loads((out / "hub_scalar_mix.json").read_text())
    assert np.allclose(scalar_mix["scalar_mix_parameters"], mix["aggregation/weights"])
    assert scalar_mix["gamma"] == pytest.approx(float(mix["aggregation/scaling"]))
    weights = load_model_files(out / "options.json", out / "weights.hdf5")
    assert weights.options.n_characters == 262 and weights.options.cell_clip == 3.0
    vectors = _embed(out / "options.json", out / "weights.hdf5")
    assert [v.shape for v in vectors] == [(3, len(s), 16) for s in SENTENCES]
    from elmo_fast import HubElmo

    hub = HubElmo(out / "options.json", out / "weights.hdf5", scalar_mix_parameters=scalar_mix["scalar_mix_parameters"])
    assert hub(["the fog"], as_dict=True)["elmo"].shape == (1, 2, 16)


def test_variable_names_of_other_tensorflow_versions():
    cell = "RNN/MultiRNNCell/Cell{}/LSTMCell/"
    assert _dataset_name("RNN_1/rnn/lstm_cell/projection/kernel") == "RNN_1/" + cell.format(0) + "W_P_0"  # one layer
    assert _dataset_name("RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B") == "RNN_0/" + cell.format(1) + "B"  # TF < 1.2
    assert _dataset_name("RNN_0/RNN/MultiRNNCell/Cell1/rnn/lstm_cell/kernel") == "RNN_0/" + cell.format(1) + "W_0"
    assert _dataset_name("CNN_high_3/b_carry") == "CNN_high_3/b_carry"
    assert _dataset_name("RNN_0/rnn/gru_cell/kernel") is None and _dataset_name("softmax/W") is None


# ---- bad sources: one line naming the file, OUT_DIR untouched ------------------------------------


def _copy_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    return run


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _damage(kind, run):
    index, shard = run / "model.ckpt-3.index", run / "model.ckpt-3.data-00000-of-00001"
    if kind == "missing shard":
        shard.unlink()
        return r"model\.ckpt-3\.data-00000-of-00001: missing \(the checkpoint index model\.ckpt-3\.index names 1"
    if kind == "truncated index":
        index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
        return r"model\.ckpt-3\.index: no table footer .*truncated or corrupt"
    if kind == "index flipped byte":
        _flip(index, 40)
        return r"model\.ckpt-3\.index: checksum mismatch in the data block at byte 0"
    if kind == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:-100])
        return r"model\.ckpt-3\.data-00000-of-00001: \d+ bytes, but tensor '.*' needs bytes .*truncated data shard"
    if kind == "shard flipped byte":
        entry = TensorBundle(run / "model.ckpt-3").entries["lm/CNN_proj/W_proj"]
        _flip(shard, entry.offset + 7)
        return r"model\.ckpt-3\.data-00000-of-00001: checksum mismatch in tensor 'lm/CNN_proj/W_proj' .*damaged"
    if kind == "unknown names":
        rewrite_index(
            run / "model.ckpt-3",
            run / "model.ckpt-3",
            lambda k: k.replace("lm/CNN_proj/b_proj", "lm/CNN_proj/bias_proj"),
        )
        return (
            r"model\.ckpt-3\.index: 2 variable\(s\) of no ELMo biLM: 'lm/CNN_proj/bias_proj', .*expected only bilm-tf's"
        )
    if kind == "another model":
        rewrite_index(run / "model.ckpt-3", run / "model.ckpt-3", lambda k: k.replace("lm/", "bert/encoder/"))
        return r"model\.ckpt-3\.index: holds no ELMo biLM: expected 'lm/char_embed' .* found 'bert/encoder/"
    if kind == "missing tensor":
        rewrite_index(
            run / "model.ckpt-3",
            run / "model.ckpt-3",
            lambda k: None if k.startswith("lm/RNN_1/rnn/multi_rnn_cell/cell_1/") else k,
        )
        return r"model\.ckpt-3\.index: the forward LSTM \(RNN_0\) has 2 layer\(s\), the backward one \(RNN_1\) 1"
    if kind == "options of another model":
        options = json.loads((run / "options.json").read_text())
        options["lstm"]["dim"] = 4096
        (run / "options.json").write_text(json.dumps(options))
        return r"options\.json: 'lstm\.dim' is 4096, but the checkpoint .* holds 12: the options of another model"
    if kind == "checkpoint names a missing one":
        (run / "checkpoint").write_text('model_checkpoint_path: "/elsewhere/model.ckpt-9"\n')
        return r"model\.ckpt-9\.index: missing; .*checkpoint names model\.ckpt-9 .*steps 2, 3 are here"
    if kind == "empty folder":
        for p in run.iterdir():
            p.unlink()
        return r"run: holds no TensorFlow checkpoint; expected a bilm-tf training folder"
    if kind == "vocabulary of another run":
        (run / "vocab.txt").write_text("</S>\n<S>\n<UNK>\nthe\n")
        return r"vocab\.txt: 4 tokens, but the checkpoint's softmax has 12 rows"
    raise AssertionError(kind)


BAD = [
    "missing shard",
    "truncated index",
    "index flipped byte",
    "truncated shard",
    "shard flipped byte",
    "unknown names",
    "another model",
    "missing tensor",
    "options of another model",
    "checkpoint names a missing one",
    "empty folder",
    "vocabulary of another run",
]


@pytest.mark.parametrize("kind", BAD)
def test_bad_source_is_one_line_and_out_dir_is_untouched(kind, tmp_path):
    run = _copy_run(tmp_path)
    pattern = _damage(kind, run)
    out = tmp_path / "out"
    with pytest.raises(ModelFileError) as e:
        convert(run, out)
    message = str(e.value)
    assert "\n" not in message
    assert re.search(pattern, message), message
    assert not out.exists()  # nothing written, not even the folder
    existing = tmp_path / "existing"  # an existing OUT_DIR keeps what it held
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    with pytest.raises(ModelFileError):
        convert(run, existing)
    assert os.listdir(existing) == ["notes.txt"]


def test_existing_outputs_need_overwrite_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "m"
    convert(RUN, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ModelFileError, match=r"weights\.hdf5 already exists; pass overwrite=True to replace it"):
        convert(RUN, out, step=2)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    convert(RUN, out, step=2, overwrite=True)
    convert(RUN, out, vocab=VOCAB, overwrite=True)
    convert(HUB, out, overwrite=True)  # another model over it: the run's softmax and vocabulary go
    assert sorted(os.listdir(out)) == ["hub_scalar_mix.json", "options.json", "weights.hdf5"]
    # a write that fails half-way (disk full at the vocabulary) takes back what this run wrote
    import elmo_fast.convert.converter as converter

    def failing(path, *a, **k):
        raise WriteError(path, OSError(28, "No space left on device"))

    monkeypatch.setattr(converter, "durable_open", failing)
    fresh = tmp_path / "fresh"
    with pytest.raises(WriteError, match="vocab.txt: No space left on device"):
        convert(RUN, fresh, vocab=VOCAB)
    assert not fresh.exists()
    with pytest.raises(WriteError):  # over an earlier model: none is left half-replaced
        convert(RUN, out, vocab=VOCAB, overwrite=True)
    assert os.listdir(out) == []
    assert set(OUTPUT_FILES) >= {"weights.hdf5", "softmax.hdf5", "vocab.txt", "options.json"}


# ---- the command line ----------------------------------------------------------------------------


def run_cli(*args, env=None):
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.mark.slow
def test_cli_converts_and_finetune_continues_the_run(tmp_path, capsys):
    out = tmp_path / "model"
    r = run_cli("convert", RUN, out, "--vocab", VOCAB, "--proj-clip", "2.5")
    assert r.returncode == 0, r.stderr
    assert "proj_clip 2.5: --proj-clip, over 3" in r.stderr and "cell_clip 3.0:" in r.stderr
    assert sorted(os.listdir(out)) == ["options.json", "softmax.hdf5", "vocab.txt", "weights.hdf5"]
    text = tmp_path / "text.txt"
    text.write_text("the ELMo of a run .\nand to the fog , in a .\n" * 4)
    r = run_cli(
        "finetune",
        "--model-dir",
        out,
        "--train",
        text,
        "--out",
        tmp_path / "ft",
        "--max-steps",
        2,
        "--batch-size",
        4,
        "--negative-samples",
        4,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert "no softmax.hdf5" not in r.stderr  # it continued with the run's own softmax
    # refusals: one line, exit 2 (in-process: the same main() as the command)
    from elmo_fast.cli import main

    for args, message in (
        ([RUN, out], "weights.hdf5 already exists; pass --overwrite to replace it"),
        ([tmp_path / "nothing", tmp_path / "o2"], "nothing: not found"),
        ([RUN, tmp_path / "o3", "--step", "9"], "--step 9: "),
    ):
        assert main(["convert", *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("elmo-fast: error: ") and message in err, err
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


@pytest.mark.slow
def test_no_tensorflow_or_protobuf_is_imported(tmp_path):
    script = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "google", "tf_keras", "tensorboard"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from elmo_fast.convert import convert
convert({str(RUN)!r}, {str(tmp_path / "o")!r}, vocab={str(VOCAB)!r})
convert({str(HUB)!r}, {str(tmp_path / "h")!r})
print(sorted(m for m in sys.modules if m.split('.')[0] in ("tensorflow", "google")))
"""
    r = cli_process.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_the_converter_needs_only_files_and_formats():
    """elmo_fast/convert reads and writes files: it imports the formats, errors and durable rooms and
    itself, never the model, the kernels or the CLI (so it stays a file-to-file job)."""
    import ast

    package = REPO / "elmo_fast" / "convert"
    allowed = ("elmo_fast.formats", "elmo_fast.errors", "elmo_fast.durable", "elmo_fast.convert")
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = "elmo_fast.convert" if node.level == 1 else "elmo_fast." + (node.module or "")
                assert target.startswith(allowed), f"{path.name} imports {target}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.startswith("elmo_fast") and not n.startswith(allowed) for n in names), path.name
