"""SeqVec (Heinzinger et al. 2019, protein sequences) is an ELMo in bilm-tf's format over amino-acid
characters: ElmoEmbedder and `elmo-fast embed` run it, one residue per token.

SeqVec's options.json, as published with its weights (``uniref50_v2/options.json`` of the SeqVec
download; md5 cede355187778de3ac302a83c761f5f9, the checksum kipoi's SeqVec model card records)
is bilm-tf's training options of the original ELMo (char CNN 2048 filters, 2 highway layers, 2
LSTM layers of 4096 cells projected to 512, clips 3) with a 28-token vocabulary, unrolled over 100
residues. No weights are downloaded: a random model of exactly these shapes stands in for them (one short
protein, as the full size costs seconds per protein on CI's 2 cores), and one of the same family at
test size (every width scaled down) for batches and the command line.
"""

from __future__ import annotations

import json
import os
import sys

import cli_process
import h5py
import numpy as np
import pytest
from repo_paths import SUPPORT

from elmo_fast import ElmoEmbedder
from elmo_fast.errors import ElmoFastError
from elmo_fast.formats.bilm_tf import ElmoOptions
from elmo_fast.formats.random_models import PRESETS, random_weights, write_model

SEQVEC_OPTIONS = {
    "bidirectional": True,
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 16},
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "max_characters_per_token": 50,
        "n_characters": 262,
        "n_highway": 2,
    },
    "dropout": 0.1,
    "lstm": {
        "cell_clip": 3,
        "dim": 4096,
        "n_layers": 2,
        "proj_clip": 3,
        "projection_dim": 512,
        "use_skip_connections": True,
    },
    "all_clip_norm_val": 10.0,
    "n_epochs": 10,
    "n_train_tokens": 9577889953,
    "batch_size": 48,
    "n_tokens_vocab": 28,
    "unroll_steps": 100,
    "n_negative_samples_batch": 20,
}

# a few proteins' starts (residues as one-letter codes, with the rarer X, U and B) and awkward lengths
PROTEINS = [
    "MVTYDFGSDEMHD",
    "M",
    "SEQWENCE",
    "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ",
    "GXUBZ",
]


#: SeqVec's shape family at test size (CI has 2 cores): its options with every width scaled down
SEQVEC_SMALL = {
    **SEQVEC_OPTIONS,
    "char_cnn": {
        **SEQVEC_OPTIONS["char_cnn"],
        "filters": [[1, 4], [2, 4], [3, 8], [4, 16], [5, 32], [6, 64], [7, 128]],
    },
    "lstm": {**SEQVEC_OPTIONS["lstm"], "dim": 256, "projection_dim": 32},
}


@pytest.fixture(scope="module")
def seqvec_small(tmp_path_factory):
    """(options.json, weights.hdf5): SeqVec's options at test size, random weights."""
    directory = tmp_path_factory.mktemp("seqvec_small")
    options = ElmoOptions.from_dict(SEQVEC_SMALL)
    _, weights = write_model(directory, options, random_weights(options, seed=3, exercise_clips=True))
    (directory / "options.json").write_text(json.dumps(SEQVEC_SMALL))  # SeqVec's file, training keys and all
    return directory / "options.json", weights


def test_seqvec_options_are_the_original_elmo_shape():
    assert ElmoOptions.from_dict(SEQVEC_OPTIONS) == PRESETS["original"]


@pytest.mark.slow
def test_embedder_runs_seqvec_at_full_size(random_models, tmp_path):
    """SeqVec's own options and shapes: (3, L, 1024) per protein (test_fast_model holds this model's fast
    path to the reference; the test-size family below does it again with SeqVec's options)."""
    _, weights = random_models("original", exercise_clips=True)  # shared with test_fast_model's session model
    options = tmp_path / "options.json"
    options.write_text(json.dumps(SEQVEC_OPTIONS))
    protein = list(PROTEINS[0])
    got = ElmoEmbedder(options, weights, backend="auto").embed_sentence(protein)
    assert got.shape == (3, len(protein), 1024)  # SeqVec's layers: CNN, LSTM1, LSTM2, per residue
    assert np.isfinite(got).all() and np.array_equal(got[0, :, :512], got[0, :, 512:])  # layer 0: the token twice
    assert 0.05 < float(np.abs(got[1:]).mean()) < 3  # LSTM layers alive and within the clips' range


@pytest.mark.slow
def test_embedder_runs_seqvec_one_residue_per_token(seqvec_small):
    fast = ElmoEmbedder(*seqvec_small, backend="auto")
    ref = ElmoEmbedder(*seqvec_small, backend="reference")
    batch = list(fast.embed_sentences([list(p) for p in PROTEINS], batch_size=3))
    for protein, got in zip(PROTEINS, batch):
        assert got.shape == (3, len(protein), 64)
        want = ref.embed_sentence(list(protein))
        assert np.abs(got - want).max() <= 1e-5
    # a residue's layer-0 vector is its own (context-free); the LSTM layers see the whole protein
    m = [v for p, v in zip(PROTEINS, batch) if p.startswith("M")]
    assert all(np.array_equal(v[0, 0], m[0][0, 0]) for v in m)
    assert not np.allclose(m[0][1, 0], m[1][1, 0])


@pytest.mark.slow
def test_embed_command_runs_seqvec(seqvec_small, tmp_path):
    residues = tmp_path / "proteins.txt"
    residues.write_text("".join(" ".join(p) + "\n" for p in PROTEINS))  # one protein per line, residues spaced
    out = tmp_path / "seqvec.hdf5"
    r = cli_process.run(
        [
            sys.executable,
            "-m",
            "elmo_fast",
            "embed",
            residues,
            out,
            "--all",
            "--options",
            seqvec_small[0],
            "--weights",
            seqvec_small[1],
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    want = ElmoEmbedder(*seqvec_small, backend="reference")
    with h5py.File(out, "r") as f:
        for i, protein in enumerate(PROTEINS):
            got = f[str(i)][...]
            assert got.shape == (3, len(protein), 64)
            assert np.abs(got - want.embed_sentence(list(protein))).max() <= 1e-5


# ---- seqvec and bio_embeddings, unchanged, on elmo-fast; `elmo-fast embed --fasta` ------------------------

# distinct lengths, ascending (seqvec sorts by length; these keep its order and ours the same), headers in
# UniProt's form, which seqvec's default id rule (field 1 at '|') reads
FASTA_RECORDS = [
    ("sp|P00001|ONE", "M"),
    ("sp|P00002|TWO", "GXUBZ"),
    ("tr|Q00003|THREE", "SEQWENCE"),
    ("sp|P00004|FOUR", "MVTYDFGSDEMHD"),
    ("sp|P00005|FIVE", "mktayiakqrqisfvkshfsrq"),
    ("sp|P00006|SIX", PROTEINS[3]),
]


def _write_fasta(path, records=FASTA_RECORDS, width=10):
    with open(path, "w") as f:
        for header, seq in records:
            f.write(f">{header} some description\n")
            for i in range(0, len(seq), width):  # sequences wrapped over lines, as FASTA files do
                f.write(seq[i : i + width] + "\n")


@pytest.fixture(scope="module")
def seqvec_model_dir(seqvec_small, tmp_path_factory):
    """seqvec's --model folder: weights.hdf5 + options.json."""
    import shutil

    directory = tmp_path_factory.mktemp("seqvec_model")
    shutil.copy(seqvec_small[0], directory / "options.json")
    shutil.copy(seqvec_small[1], directory / "weights.hdf5")
    return directory


def _read_h5(path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: (f[k][...], dict(f[k].attrs)) for k in f}


@pytest.mark.peers
@pytest.mark.slow
def test_seqvec_cli_unchanged_gives_its_allennlp_09_numbers_and_embed_fasta_agrees(seqvec_model_dir, tmp_path):
    """seqvec 0.4.1's own command line, run with ELMO_FAST_AS_ALLENNLP=1 (no code edited: the .pth hook), writes
    what it writes on allennlp 0.9.0 itself; `elmo-fast embed --fasta` keys the same ids, gives the same
    context-free layer, and, driven as seqvec drives allennlp (stateful, one protein a batch, length order),
    the same vectors; its --per-protein is seqvec's --protein."""
    from peers import PEERS
    from shim_runs import child_env, require, require_no_real_allennlp

    require_no_real_allennlp()
    require("seqvec", "bash tests/install_peers.sh (pip install --no-deps seqvec==0.4.1)")
    if not (PEERS / "allennlp-0.9" / "allennlp").is_dir():
        pytest.skip("allennlp 0.9 is not in .peers/allennlp-0.9: bash tests/install_peers.sh")
    fasta = tmp_path / "proteins.fasta"
    _write_fasta(fasta)
    runs = {"all": ["--layer", "all"], "cnn": ["--layer", "CNN"], "protein": ["--protein"]}
    steps = [
        [
            "seqvec",
            [
                "-i",
                str(fasta),
                "-o",
                str(tmp_path / f"real_{name}.h5"),
                "--model",
                str(seqvec_model_dir),
                "--cpu",
                "--batchsize",
                "1",
                "--silent",
                *flags,
            ],
        ]
        for name, flags in runs.items()
    ]
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "options": str(seqvec_model_dir / "options.json"),
                "weights": str(seqvec_model_dir / "weights.hdf5"),
                "steps": steps,
            }
        )
    )
    peer = cli_process.run(
        [sys.executable, str(SUPPORT / "allennlp09_peer.py"), str(job), str(tmp_path / "peer.npz")],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=900,
    )
    assert peer.returncode == 0, peer.stderr[-3000:]
    seqvec_cli = os.path.join(os.path.dirname(sys.executable), "seqvec")
    for name, flags in runs.items():
        proc = cli_process.run(
            [
                seqvec_cli,
                "-i",
                str(fasta),
                "-o",
                str(tmp_path / f"shim_{name}.h5"),
                "--model",
                str(seqvec_model_dir),
                "--cpu",
                "--batchsize",
                "1",
                "--silent",
                *flags,
            ],
            capture_output=True,
            text=True,
            env=child_env(ELMO_FAST_AS_ALLENNLP="1"),
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        real, shim = _read_h5(tmp_path / f"real_{name}.h5"), _read_h5(tmp_path / f"shim_{name}.h5")
        assert sorted(real) == sorted(shim) == sorted(h.split("|")[1] for h, _ in FASTA_RECORDS)
        for key in real:
            # fp32's bar is 1e-5 on outputs of magnitude ~1; this model's reach ~6 (its clips exercised), and
            # allennlp 0.9's fp32 LSTM is itself up to 8e-6 from the float64 result there, while elmo-fast's
            # calibrated kernels are nearer it (tests/bilm/test_fast_model.py holds that): scaled, as the bar says
            bound = 1e-5 * max(1.0, float(np.abs(real[key][0]).max()))
            assert real[key][0].shape == shim[key][0].shape and np.abs(real[key][0] - shim[key][0]).max() <= bound
    shim_all, shim_cnn = _read_h5(tmp_path / "shim_all.h5"), _read_h5(tmp_path / "shim_cnn.h5")
    shim_protein = _read_h5(tmp_path / "shim_protein.h5")

    def embed(out, *flags):
        proc = cli_process.run(
            [
                sys.executable,
                "-m",
                "elmo_fast",
                "embed",
                "--fasta",
                str(fasta),
                str(out),
                "--model-dir",
                str(seqvec_model_dir),
                "--split-char",
                "|",
                "--id",
                "1",
                "--quiet",
                *flags,
            ],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        return _read_h5(out)

    stateful = embed(tmp_path / "stateful.h5", "--all", "--stateful", "--batch-size", "1")
    per_protein = embed(tmp_path / "per_protein.h5", "--sum", "--stateful", "--batch-size", "1", "--per-protein")
    stateless = embed(tmp_path / "stateless.h5", "--all", "--per-protein", "also")
    for header, seq in FASTA_RECORDS:
        key = header.split("|")[1]
        ours = stateful[key][0]
        assert ours.shape == (3, len(seq), 64)
        assert np.abs(np.concatenate(ours, axis=1) - shim_all[key][0]).max() <= 1e-5  # seqvec's --layer all
        assert np.abs(per_protein[key][0] - shim_protein[key][0]).max() <= 1e-5  # --protein: sum, mean
        vectors, attrs = stateless[key]
        assert np.abs(vectors[0] - shim_cnn[key][0]).max() <= 1e-5  # the context-free layer: state plays no part
        assert np.abs(attrs["per_protein"] - vectors.mean(axis=1)).max() <= 1e-6


@pytest.mark.peers
@pytest.mark.slow
def test_seqvec_embedder_gives_bio_embeddings_numbers(seqvec_small, tmp_path):
    """bio_embeddings 0.2.2's own SeqVecEmbedder source (its file, loaded alone: its package imports every
    embedder it has), run on elmo-fast's allennlp import path, and elmo_fast.compat.seqvec's class give the
    same arrays for the same calls (4 warm-up rounds, embed, embed_batch, embed_many by residues)."""
    from peers import PEERS
    from shim_runs import child_env, require_no_real_allennlp, run_python

    require_no_real_allennlp()
    source = PEERS / "bio-embeddings" / "bio_embeddings" / "embed"
    if not (source / "seqvec_embedder.py").is_file():
        pytest.skip("bio-embeddings is not in .peers/bio-embeddings: bash tests/install_peers.sh")
    options, weights = seqvec_small
    calls = {"one": PROTEINS[3], "batch": PROTEINS[:4], "many": PROTEINS + PROTEINS[::-1], "batch_size": 20}
    out = tmp_path / "theirs.npz"
    run_python(
        f"""
        import importlib.util, sys, types
        import numpy as np, torch
        import elmo_fast.as_allennlp
        # bio_embeddings' package and its utilities import every embedder and their libraries: stand-ins for
        # the package and for the three helpers its SeqVec path uses
        package = types.ModuleType("bio_embeddings"); package.__path__ = []
        embed = types.ModuleType("bio_embeddings.embed"); embed.__path__ = [{str(source)!r}]
        utilities = types.ModuleType("bio_embeddings.utilities")
        def get_device(device=None):  # bio_embeddings.utilities.helpers.get_device
            if isinstance(device, torch.device):
                return device
            return torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        def no_download(**kwargs):
            raise AssertionError("no download in tests")
        utilities.get_device = get_device
        utilities.get_model_file = utilities.get_model_directories_from_zip = no_download
        sys.modules.update({{"bio_embeddings": package, "bio_embeddings.embed": embed,
                            "bio_embeddings.utilities": utilities}})
        from bio_embeddings.embed.seqvec_embedder import SeqVecEmbedder
        e = SeqVecEmbedder(weights_file={str(weights)!r}, options_file={str(options)!r}, device="cpu")
        calls = {calls!r}
        arrays = {{"one": e.embed(calls["one"])}}
        arrays.update({{f"batch{{i}}": a for i, a in enumerate(e.embed_batch(calls["batch"]))}})
        arrays.update({{f"many{{i}}": a for i, a in enumerate(e.embed_many(calls["many"], calls["batch_size"]))}})
        arrays["reduced"] = SeqVecEmbedder.reduce_per_protein(arrays["one"])
        arrays["dims"] = np.array([SeqVecEmbedder.embedding_dimension, SeqVecEmbedder.number_of_layers])
        np.savez({str(out)!r}, **arrays)
    """,
        env=child_env(),
        fresh=False,  # bio_embeddings' class on elmo-fast is the point, not a fresh interpreter's modules
    )
    theirs = dict(np.load(out))
    from elmo_fast.compat.seqvec import SeqVecEmbedder

    e = SeqVecEmbedder(weights_file=weights, options_file=options, device="cpu")
    assert (e.name, e.embedding_dimension, e.number_of_layers) == ("seqvec", *theirs["dims"].tolist())
    ours = {"one": e.embed(calls["one"])}
    ours.update({f"batch{i}": a for i, a in enumerate(e.embed_batch(calls["batch"]))})
    ours.update({f"many{i}": a for i, a in enumerate(e.embed_many(calls["many"], calls["batch_size"]))})
    ours["reduced"] = SeqVecEmbedder.reduce_per_protein(ours["one"])
    assert sorted(ours) == sorted(k for k in theirs if k != "dims")
    for key, a in ours.items():
        assert a.shape == theirs[key].shape and np.abs(a - theirs[key]).max() <= 1e-5, key


def test_seqvec_embedder_falls_back_as_bio_embeddings(seqvec_small, monkeypatch):
    """On a GPU a failing batch is retried one sequence at a time, and a sequence failing alone goes to a CPU
    model (simulated: the device says cuda, the batch raises as CUDA's out-of-memory does)."""
    from elmo_fast.compat import seqvec as module

    e = module.SeqVecEmbedder(weights_file=seqvec_small[1], options_file=seqvec_small[0], device="cpu", warmup_rounds=0)
    e._device = __import__("torch").device("cuda")  # the fallbacks are for GPUs
    calls = []
    real = module.SeqVecEmbedder._embed_batch_impl

    def impl(self, batch, model):
        calls.append((len(batch), model is self._model))
        if model is self._model and (len(batch) > 1 or batch[0] == PROTEINS[3]):
            raise __import__("torch").OutOfMemoryError("CUDA out of memory")
        yield from real(self, batch, model)

    monkeypatch.setattr(module.SeqVecEmbedder, "_embed_batch_impl", impl)
    got = list(e.embed_batch(PROTEINS[2:5]))
    assert [g.shape[1] for g in got] == [len(p) for p in PROTEINS[2:5]]
    assert calls == [(3, True), (1, True), (1, True), (1, False), (1, True)]
    assert e._model_fallback is not None


def test_seqvec_embedder_frees_its_cpu_model_when_the_gpu_works_again(seqvec_small, monkeypatch):
    """The CPU model a fallback loads (a second full copy of the weights) is freed once a whole batch runs on
    the GPU again; its LSTM states are kept, so a later fallback loads it again and continues from them: the
    same vectors as a CPU model kept all along, as bio_embeddings keeps it (simulated CUDA out-of-memory)."""
    from elmo_fast.compat import seqvec as module

    real = module.SeqVecEmbedder._embed_batch_impl

    def impl(self, batch, model):
        if model is self._model and (len(batch) > 1 and PROTEINS[3] in batch or batch == [PROTEINS[3]]):
            raise __import__("torch").OutOfMemoryError("CUDA out of memory")
        yield from real(self, batch, model)

    monkeypatch.setattr(module.SeqVecEmbedder, "_embed_batch_impl", impl)
    calls = [PROTEINS[2:5], PROTEINS[:2], PROTEINS[3:4], PROTEINS[1:4]]

    def run(keep: bool):
        if keep:  # bio_embeddings' way: the CPU model stays
            monkeypatch.setattr(module.SeqVecEmbedder, "_release_fallback_model", lambda self: None)
        e = module.SeqVecEmbedder(weights_file=seqvec_small[1], options_file=seqvec_small[0], device="cpu")
        e._device = __import__("torch").device("cuda")  # the fallbacks are for GPUs
        loaded, out = [], []
        for batch in calls:
            out += list(e.embed_batch(batch))
            loaded.append(e._model_fallback is not None)
        monkeypatch.undo() if keep else None
        return loaded, out

    loaded, ours = run(keep=False)
    assert loaded == [True, False, True, True]  # freed after the GPU's whole batch (the second call)
    monkeypatch.setattr(module.SeqVecEmbedder, "_embed_batch_impl", impl)
    kept_loaded, theirs = run(keep=True)
    assert kept_loaded == [True, True, True, True]
    assert len(ours) == len(theirs) == sum(map(len, calls))
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-6


def test_seqvec_embedder_needs_its_files(tmp_path):
    from elmo_fast.compat.seqvec import SeqVecEmbedder

    with pytest.raises(ElmoFastError, match="weights_file and options_file"):
        SeqVecEmbedder()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'options.json'} not found"):  # as allennlp's
        SeqVecEmbedder(model_directory=tmp_path)
