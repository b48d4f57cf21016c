"""`elmo-fast export onnx` as a user runs it (a subprocess): the model named as everywhere else, one line
on success, one line and exit status 2 for what is refused before any work, no file left behind."""

import sys

import cli_process
import numpy as np
import pytest
from onnx_graphs import random_batch, require_onnx_extra

from elmo_fast import batch_to_ids
from elmo_fast.bilm.model import ElmoBiLm
from elmo_fast.errors import ElmoFastError
from elmo_fast.export import contract
from elmo_fast.export.libraries import require


def run_cli(*args):
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *map(str, args)], capture_output=True, text=True, timeout=900
    )


def one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.slow
def test_export_a_model_directory_at_another_opset(tmp_path, random_models):
    """The highest opset the export takes, from a model directory, equal to the reference."""
    require_onnx_extra()
    import onnx
    import onnxruntime as ort

    options, weights = random_models("tiny", exercise_clips=True, seed=5)
    out = tmp_path / "model.onnx"
    r = run_cli("export", "onnx", out, "--model-dir", options.parent, "--opset", contract.MAX_OPSET)
    assert r.returncode == 0, r.stderr
    line = one_line(r)
    assert (
        line.startswith(f"elmo-fast: wrote {out} (")
        and f"opset {contract.MAX_OPSET}, 3 layers x 32, quantization none" in line
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert {o.version for o in model.opset_import if o.domain == ""} == {contract.MAX_OPSET}
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ids = batch_to_ids(random_batch(np.random.default_rng(9), [9, 1, 4]))
    layers, mask = session.run(None, {"char_ids": ids.numpy()})
    want, want_mask = ElmoBiLm(options, weights, backend="reference").eval().embed(ids)
    assert np.array_equal(mask.astype(bool), want_mask.numpy())
    assert np.abs(layers - want.detach().numpy()).max() <= 1e-5
    # the same command again: the file exists
    r = run_cli("export", "onnx", out, "--model-dir", options.parent)
    assert r.returncode == 2 and f"{out} exists: pass --overwrite to replace it" in one_line(r)


@pytest.mark.parametrize(
    "flags, status, expected",
    [
        (["--opset", "17"], 2, "--opset must be an ONNX opset from 18 to 23 (default 18), got 17"),
        (["--quantize", "int4"], 2, "invalid choice: 'int4'"),
        (["--model", "no-such-model"], 2, "unknown model 'no-such-model'"),
        (["--options", "{options}"], 2, "give --options F and --weights F together"),
    ],
)
def test_refusals_before_any_work(flags, status, expected, tmp_path, random_models):
    require_onnx_extra()
    options, _ = random_models("tiny")
    flags = [f.format(options=options) for f in flags]
    r = run_cli("export", "onnx", tmp_path / "out.onnx", *flags)
    assert r.returncode == status, r.stderr
    assert expected in r.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_output_in_a_missing_folder(tmp_path, random_models):
    require_onnx_extra()
    options, _ = random_models("tiny")
    r = run_cli("export", "onnx", tmp_path / "no" / "out.onnx", "--model-dir", options.parent)
    assert r.returncode == 2 and "does not exist" in one_line(r)  # known before any work: bad input


@pytest.mark.slow
def test_an_elmoformanylangs_model_is_refused(tmp_path):
    require_onnx_extra()
    from manylangs_models import write_variant

    model_dir = write_variant("words+chars", tmp_path / "model")
    r = run_cli("export", "onnx", tmp_path / "out.onnx", "--model-dir", model_dir)
    assert r.returncode == 2 and "an ELMoForManyLangs model cannot be exported to ONNX" in one_line(r)
    assert not (tmp_path / "out.onnx").exists()


def test_a_missing_library_names_the_extra():
    with pytest.raises(ElmoFastError) as e:
        require("elmo_fast_no_such_library", "elmo-fast export onnx")
    assert str(e.value) == (
        "elmo-fast export onnx needs the [onnx] extra (missing: elmo_fast_no_such_library): "
        'pip install "elmo-fast[onnx]"'
    )
