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
import subprocess
import sys

import h5py
import numpy as np
import pytest

from elmo_fast import ElmoEmbedder
from elmo_fast.formats.bilm_tf import ElmoOptions
from elmo_fast.formats.random_models import PRESETS, random_weights, write_model

SEQVEC_OPTIONS = {
    "bidirectional": True,
    "char_cnn": {"activation": "relu", "embedding": {"dim": 16},
                 "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                 "max_characters_per_token": 50, "n_characters": 262, "n_highway": 2},
    "dropout": 0.1,
    "lstm": {"cell_clip": 3, "dim": 4096, "n_layers": 2, "proj_clip": 3, "projection_dim": 512,
             "use_skip_connections": True},
    "all_clip_norm_val": 10.0, "n_epochs": 10, "n_train_tokens": 9577889953, "batch_size": 48,
    "n_tokens_vocab": 28, "unroll_steps": 100, "n_negative_samples_batch": 20,
}

# a few proteins' starts (residues as one-letter codes, with the rarer X, U and B) and awkward lengths
PROTEINS = ["MVTYDFGSDEMHD", "M", "SEQWENCE", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ",
            "GXUBZ"]


#: SeqVec's shape family at test size (CI has 2 cores): its options with every width scaled down
SEQVEC_SMALL = {**SEQVEC_OPTIONS,
                "char_cnn": {**SEQVEC_OPTIONS["char_cnn"],
                             "filters": [[1, 4], [2, 4], [3, 8], [4, 16], [5, 32], [6, 64], [7, 128]]},
                "lstm": {**SEQVEC_OPTIONS["lstm"], "dim": 256, "projection_dim": 32}}


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


def test_embed_command_runs_seqvec(seqvec_small, tmp_path):
    residues = tmp_path / "proteins.txt"
    residues.write_text("".join(" ".join(p) + "\n" for p in PROTEINS))  # one protein per line, residues spaced
    out = tmp_path / "seqvec.hdf5"
    r = subprocess.run([sys.executable, "-m", "elmo_fast", "embed", residues, out, "--all",
                        "--options", seqvec_small[0], "--weights", seqvec_small[1], "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    want = ElmoEmbedder(*seqvec_small, backend="reference")
    with h5py.File(out, "r") as f:
        for i, protein in enumerate(PROTEINS):
            got = f[str(i)][...]
            assert got.shape == (3, len(protein), 64)
            assert np.abs(got - want.embed_sentence(list(protein))).max() <= 1e-5
