"""Precision, one concept (elmo_fast.bilm.precision): the names and aliases every entry point takes,
each mode's stated bound against the fp32 reference, and the one-line refusals where a mode cannot
run. tf32 and fp16 on a GPU are checked in tests/bilm/test_bilm_cuda.py."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from tolerances import MODEL_BOUNDS, TOL

from elmo_fast import Elmo, ElmoBiLm, ElmoEmbedder, ElmoFastError, HubElmo, batch_to_ids
from elmo_fast.bilm import ops
from elmo_fast.bilm.precision import BF16, FP16, FP32, PRECISIONS, TF32, resolve_precision
from elmo_fast.cli.common import add_precision_flag, param_flags

HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
needs_fast = pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")


# --- the names ----------------------------------------------------------------------------------------


def test_names_and_the_dtype_alias():
    assert list(PRECISIONS) == ["fp32", "tf32", "bf16", "fp16"]
    assert resolve_precision() is FP32
    assert [resolve_precision(n) for n in PRECISIONS] == [FP32, TF32, BF16, FP16]
    assert resolve_precision(BF16) is BF16
    # dtype=, the API's older name: the three dtypes it meant, or a mode's name
    assert resolve_precision(dtype=torch.float32) is FP32
    assert resolve_precision(dtype=torch.bfloat16) is BF16
    assert resolve_precision(dtype=torch.float16) is FP16
    assert resolve_precision(dtype="tf32") is TF32
    assert resolve_precision("bf16", dtype=torch.bfloat16) is BF16  # both, agreeing
    with pytest.raises(ElmoFastError, match=r"give precision or dtype \(its older name\), not both \(got fp32 and "):
        resolve_precision("fp32", dtype=torch.bfloat16)
    with pytest.raises(ElmoFastError, match="precision must be one of fp32, tf32, bf16, fp16, got 'half'"):
        resolve_precision("half")
    with pytest.raises(ElmoFastError, match="dtype must be torch.float32, torch.bfloat16 or torch.float16"):
        resolve_precision(dtype=torch.float64)


def test_what_each_mode_computes_in():
    assert [(p.gemm_dtype, p.tf32, p.autocast_dtype) for p in PRECISIONS.values()] == [
        (torch.float32, False, None),
        (torch.float32, True, None),
        (torch.bfloat16, False, torch.bfloat16),
        (torch.float16, False, torch.float16),
    ]
    assert [p.low_precision for p in PRECISIONS.values()] == [False, False, True, True]
    # fp32's bound is the project's bar; the others are relative, looser the fewer mantissa bits
    assert FP32.bound.max_abs == TOL[torch.float32]["atol"] and FP32.bound.max_rel == 0.0
    assert TF32.bound.max_rel <= BF16.bound.max_rel and FP16.bound.rms_rel <= BF16.bound.rms_rel
    assert str(BF16.bound) == "max error <= 5% of each layer's max |value|, RMS error <= 1% of its RMS"
    assert str(FP32.bound) == "max abs error <= 1e-05"


def test_one_flag_with_one_meaning():
    p = argparse.ArgumentParser()
    add_precision_flag(p)
    assert p.parse_args([]).precision == "fp32"
    assert p.parse_args(["--precision", "bf16"]).precision == "bf16"
    assert param_flags(p)["precision"] == "--precision"  # errors naming precision= show the flag
    with pytest.raises(SystemExit):
        p.parse_args(["--precision", "fp64"])


def test_the_deprecated_alias_sets_the_same_value(capsys):
    p = argparse.ArgumentParser()
    add_precision_flag(p, training=True, deprecated_aliases=("--dtype",))
    assert p.parse_args(["--dtype", "bf16"]).precision == "bf16"
    assert "--dtype is deprecated: use --precision bf16" in capsys.readouterr().err
    assert param_flags(p)["precision"] == "--precision"


# --- the model ------------------------------------------------------------------------------------------


def _layers_within(got, ref, bound, what):
    mask = ref["mask"]
    for k, (r, x) in enumerate(zip(ref["activations"], got["activations"])):
        assert x.dtype == torch.float32
        r, x = r[mask].double(), x[mask].double()
        err = (x - r).abs()
        assert err.max() <= bound["max_rel"] * r.abs().max(), f"{what}, layer {k}: max error {err.max():.3g}"
        rms = err.pow(2).mean().sqrt() / r.pow(2).mean().sqrt()
        assert rms <= bound["rms_rel"], f"{what}, layer {k}: relative RMS error {rms:.3g}"


@needs_fast
@pytest.mark.slow
def test_bf16_by_either_name_within_its_bound(random_models):
    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(_sentences(np.random.default_rng(3), 9, 1, 13))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        by_name = ElmoBiLm(*files, backend="fast", precision="bf16")
        by_dtype = ElmoBiLm(*files, backend="fast", dtype=torch.bfloat16)
        got, alias = by_name(ids), by_dtype(ids)
    assert by_name.precision is BF16 and by_name.compute_dtype == torch.bfloat16
    for x, y in zip(got["activations"], alias["activations"]):
        assert torch.equal(x, y)  # one mode, two spellings
    _layers_within(got, ref, MODEL_BOUNDS["bf16"], "bf16")
    assert "precision=bf16" in str(by_name).splitlines()[1]


@needs_fast
def test_tf32_is_exactly_fp32_on_a_cpu(random_models):
    """CPUs have no TF32: the mode maps to fp32, bit for bit (its bound holds trivially)."""
    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(_sentences(np.random.default_rng(4), 7, 1, 11))
    with torch.inference_mode():
        fp32 = ElmoBiLm(*files, backend="fast")(ids)
        tf32 = ElmoBiLm(*files, backend="fast", precision="tf32")(ids)
    for x, y in zip(fp32["activations"], tf32["activations"]):
        assert torch.equal(x, y)
    emb = ElmoEmbedder(*files, precision="tf32", backend="fast")
    np.testing.assert_array_equal(
        emb.embed_sentence(["a", "b"]), ElmoEmbedder(*files, backend="fast").embed_sentence(["a", "b"])
    )


def test_fp16_is_refused_on_a_cpu_in_one_line(random_models):
    files = random_models("tiny")
    for make in (
        lambda: ElmoEmbedder(*files, precision="fp16"),
        lambda: HubElmo(*files, precision="fp16"),
        lambda: ElmoEmbedder(*files, dtype=torch.float16),
    ):
        with pytest.raises(
            ElmoFastError,
            match=r"^precision='fp16' runs on CUDA only \(the CPU kernels have no "
            r"fp16 GEMMs\); on cpu use bf16 or fp32$",
        ):
            make()
    if not ops.HAS_CUDA_KERNELS:  # a build that could never run it says so when the model is made
        with pytest.raises(ElmoFastError, match="precision='fp16' runs on CUDA only, and this build"):
            ElmoBiLm(*files, precision="fp16")
    else:  # a model made on the CPU to move to a GPU: refused at the forward if it stays
        bilm = ElmoBiLm(*files, precision="fp16")
        with pytest.raises(ElmoFastError, match="precision='fp16' runs on CUDA only"):
            bilm(batch_to_ids([["a"]]))


def test_low_precision_needs_the_fast_backend(random_models):
    files = random_models("tiny")
    for name in ("tf32", "bf16"):
        with pytest.raises(
            ElmoFastError, match=f"precision='{name}' needs the fast backend .*; got backend='reference'"
        ):
            ElmoBiLm(*files, backend="reference", precision=name)
    with pytest.raises(ElmoFastError, match="precision='tf32' needs the fast backend"):
        Elmo(*files, 1, backend="reference", precision="tf32")


@needs_fast
def test_every_entry_point_takes_it(random_models):
    files = random_models("tiny")
    assert Elmo(*files, 1, precision="bf16")._elmo_lstm.precision is BF16
    assert HubElmo(*files, precision="tf32").elmo_bilm.precision is TF32
    assert ElmoEmbedder(*files, precision="bf16").elmo_bilm.precision is BF16
    assert ElmoEmbedder(*files).elmo_bilm.precision is FP32


# --- TF32 on CUDA: the flag set for the forward and put back (checked without a GPU) -------------------


@pytest.fixture
def tf32_flag():
    matmul = torch.backends.cuda.matmul
    old = matmul.fp32_precision
    yield matmul
    matmul.allow_tf32 = False  # the legacy setter last: reading either API works again
    matmul.fp32_precision = old


def test_gemm_mode_sets_tf32_on_cuda_only_and_restores_it(tf32_flag):
    tf32_flag.allow_tf32 = True  # a process that turned TF32 on for itself
    with FP32.gemm_mode("cuda"):
        assert tf32_flag.allow_tf32 is False  # fp32 means fp32
    assert tf32_flag.allow_tf32 is True
    tf32_flag.allow_tf32 = False
    with TF32.gemm_mode("cuda:0"):
        assert tf32_flag.allow_tf32 is True
    assert tf32_flag.allow_tf32 is False
    with TF32.gemm_mode("cpu"):
        assert tf32_flag.allow_tf32 is False  # nothing to set on a CPU


def test_gemm_mode_follows_torchs_newer_api(tf32_flag):
    tf32_flag.fp32_precision = "tf32"  # torch refuses reads of the legacy flag after this
    with pytest.raises(RuntimeError):
        _ = tf32_flag.allow_tf32
    with FP32.gemm_mode("cuda"):
        assert tf32_flag.fp32_precision == "ieee"
    assert tf32_flag.fp32_precision == "tf32"


# --- training --------------------------------------------------------------------------------------------


def test_training_precision(tmp_path):
    from elmo_fast.formats.random_models import PRESETS
    from elmo_fast.formats.vocab import Vocabulary
    from elmo_fast.training.checkpoints import _with_precision
    from elmo_fast.training.trainer import TrainConfig, Trainer

    Vocabulary(["<S>", "</S>", "<UNK>", "a"]).save(tmp_path / "vocab.txt")
    base = dict(
        train=[],
        vocab=str(tmp_path / "vocab.txt"),
        out=str(tmp_path / "out"),
        options=PRESETS["tiny"].to_dict(),
        progress=False,
    )
    assert Trainer(TrainConfig(**base, precision="bf16")).precision is BF16
    with pytest.raises(ElmoFastError, match="precision='fp16' is not supported for training: fp16 needs loss scaling"):
        Trainer(TrainConfig(**base, precision="fp16"))
    # the Python API names its parameter (the CLI shows --precision from the same error: test_cli)
    with pytest.raises(ElmoFastError, match="^precision must be one of fp32, tf32, bf16, fp16, got 'half'"):
        Trainer(TrainConfig(**base, precision="half"))
    # a run checkpointed before --precision recorded it as dtype resumes under the new name
    assert _with_precision({"seed": 1, "dtype": "bf16"}) == {"seed": 1, "precision": "bf16"}
    assert _with_precision({"precision": "fp32"}) == {"precision": "fp32"}


@needs_fast
@pytest.mark.slow
def test_bf16_training_steps_run_and_track_fp32(tmp_path):
    # bf16 training (the forward under autocast: its GEMMs in bf16, weights and Adagrad fp32) on the fast
    # CPU ops: the highway's gate and the LSTM's recurrence take autocast's bf16 GEMM results in their
    # own dtype. A few steps from the same seed give nearly fp32's losses.
    import json

    from elmo_fast.cli import main

    sentences = [" ".join(f"w{(i * 7 + j * 3) % 23}" for j in range(3 + i % 9)) for i in range(64)]
    (tmp_path / "train.txt").write_text("\n".join(sentences) + "\n")
    (tmp_path / "vocab.txt").write_text("\n".join(["<S>", "</S>", "<UNK>"] + [f"w{i}" for i in range(23)]) + "\n")
    losses = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        assert (
            main(
                [
                    "train",
                    "--train",
                    str(tmp_path / "train.txt"),
                    "--vocab",
                    str(tmp_path / "vocab.txt"),
                    "--out",
                    str(out),
                    "--preset",
                    "tiny",
                    "--max-steps",
                    "4",
                    "--batch-size",
                    "16",
                    "--log-every",
                    "1",
                    "--backend",
                    "fast",
                    "--precision",
                    precision,
                    "--quiet",
                ]
            )
            == 0
        )
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses[precision] = [r["loss"] for r in rows if "loss" in r]
    assert len(losses["bf16"]) == 4 and all(np.isfinite(losses["bf16"]))
    assert np.allclose(losses["bf16"], losses["fp32"], rtol=0.02), losses


# --- the command line: embed --precision -------------------------------------------------------------------


@needs_fast
@pytest.mark.slow
def test_embed_precision_flag(tmp_path, random_models, capsys):
    import h5py

    from elmo_fast.cli import main

    options, weights = map(str, random_models("tiny", exercise_clips=True))
    inp = tmp_path / "in.txt"
    inp.write_text("the cat sat on the mat .\na b\nswans swim\n", encoding="utf-8")
    outputs = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.h5"
        assert (
            main(
                [
                    "embed",
                    str(inp),
                    str(out),
                    "--all",
                    "--quiet",
                    "--options",
                    options,
                    "--weights",
                    weights,
                    "--precision",
                    precision,
                ]
            )
            == 0
        ), capsys.readouterr().err
        with h5py.File(out, "r") as f:
            outputs[precision] = [f[str(i)][()] for i in range(3)]
    bound = MODEL_BOUNDS["bf16"]["max_rel"]
    for want, got in zip(outputs["fp32"], outputs["bf16"]):
        for k in range(3):
            err = np.abs(got[k] - want[k]).max()
            assert 0 < err <= bound * np.abs(want[k]).max()
    # a mode the device cannot run: one line, exit 2, nothing written
    code = main(
        [
            "embed",
            str(inp),
            str(tmp_path / "fp16.h5"),
            "--top",
            "--quiet",
            "--options",
            options,
            "--weights",
            weights,
            "--precision",
            "fp16",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == (
        "elmo-fast: error: --precision fp16 runs on CUDA only (the CPU kernels have "
        "no fp16 GEMMs); on cpu use bf16 or fp32"
    ), err
    assert not (tmp_path / "fp16.h5").exists()
