"""Random-weight ELMo models written in the bilm-tf layout, for tests and benchmarks.

The official weights cannot be downloaded everywhere (CI has no internet), so tests build models
of the official shapes with random weights, written exactly as bilm-tf writes them, and read
back through the same loader users' files go through. The scales keep activations in the range
of the real models (top-layer std about 0.5); ``exercise_clips=True`` makes cell states and
projections hit the +-3 clips, which a parity test must cover, while keeping the recurrence
contractive: a chaotic random LSTM would turn fp32 rounding differences (a GEMM's blocking
changes with the batch size) into 1e-2 output differences, and no parity bar could hold.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import numpy as np

from .formats.bilm_tf import FILE_CHAR_ROWS, ElmoOptions, expected_datasets

_FULL_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))

PRESETS: dict[str, ElmoOptions] = {
    # the shapes of ../shared/fixtures/bilm_tf_tiny (the real tiny biLM trained by bilm-tf)
    "tiny": ElmoOptions(filters=((1, 4), (2, 8), (3, 16), (4, 32), (5, 64)), char_dim=4, n_highway=2,
                        projection_dim=16, cell_dim=64, n_layers=2, cell_clip=3.0, proj_clip=3.0),
    "small": ElmoOptions(filters=_FULL_FILTERS, char_dim=16, n_highway=1,
                         projection_dim=128, cell_dim=1024, n_layers=2, cell_clip=3.0, proj_clip=3.0),
    "medium": ElmoOptions(filters=_FULL_FILTERS, char_dim=16, n_highway=1,
                          projection_dim=256, cell_dim=2048, n_layers=2, cell_clip=3.0, proj_clip=3.0),
    "original": ElmoOptions(filters=_FULL_FILTERS, char_dim=16, n_highway=2,
                            projection_dim=512, cell_dim=4096, n_layers=2, cell_clip=3.0, proj_clip=3.0),
}


def random_weights(options: ElmoOptions, seed: int = 0, exercise_clips: bool = False) -> dict[str, np.ndarray]:
    """Random datasets in the bilm-tf layout (TensorFlow shapes), keyed by dataset name."""
    rng = np.random.default_rng(seed)
    o = options
    F, P, C = o.n_filters, o.projection_dim, o.cell_dim
    # exercise_clips: a 2x larger projection hits the projection clip; the recurrent half of W_0
    # shrinks by as much so that the recurrence stays as tame as the default's; a forget bias of
    # +1.5 lets cells integrate their inputs up to the cell clip.
    proj_gain = 3.0 if exercise_clips else 1.5
    recurrent_gain = 0.35 if exercise_clips else 1.0
    forget_shift = 1.5 if exercise_clips else 0.0

    def normal(shape, std, mean=0.0):
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    out: dict[str, np.ndarray] = {"char_embed": normal((FILE_CHAR_ROWS, o.char_dim), 1.0)}
    for i, (width, num) in enumerate(o.filters):
        out[f"CNN/W_cnn_{i}"] = normal((1, width, o.char_dim, num), 1.0 / np.sqrt(width * o.char_dim))
        out[f"CNN/b_cnn_{i}"] = normal((num,), 0.1)
    for k in range(o.n_highway):
        out[f"CNN_high_{k}/W_transform"] = normal((F, F), 1.0 / np.sqrt(F))
        out[f"CNN_high_{k}/W_carry"] = normal((F, F), 1.0 / np.sqrt(F))
        out[f"CNN_high_{k}/b_transform"] = normal((F,), 0.1)
        out[f"CNN_high_{k}/b_carry"] = normal((F,), 0.5, mean=-1.0)  # gates lean to carrying x, as trained ones do
    out["CNN_proj/W_proj"] = normal((F, P), 0.5 / np.sqrt(F))
    out["CNN_proj/b_proj"] = normal((P,), 0.1)
    for d in range(2):
        for layer in range(o.n_layers):
            prefix = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
            w0 = normal((2 * P, 4 * C), 1.0 / np.sqrt(2 * P))
            w0[P:] *= recurrent_gain  # rows P: multiply the previous output h
            out[prefix + "W_0"] = w0
            bias = normal((4 * C,), 0.1)
            bias[2 * C:3 * C] += forget_shift  # TF gate order i, j, f, o
            out[prefix + "B"] = bias
            out[prefix + "W_P_0"] = normal((C, P), proj_gain / np.sqrt(C))
    expected = expected_datasets(o)
    assert out.keys() == expected.keys() and all(out[k].shape == expected[k][0] for k in out)
    return out


def write_model(directory: str | os.PathLike, options: ElmoOptions, datasets: dict[str, np.ndarray],
                options_name: str = "options.json", weights_name: str = "weights.hdf5") -> tuple[Path, Path]:
    """Write ``options.json`` and a bilm-tf-layout ``weights.hdf5``; returns their paths.

    Each file is written under a temporary name and renamed into place once complete, so that an
    interrupted write leaves the directory as it was (both renames come last, one after the other).
    """
    import h5py

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    options_path, weights_path = directory / options_name, directory / weights_name
    token = secrets.token_hex(4)
    tmp_options = directory / f".{options_name}.{token}.tmp"
    tmp_weights = directory / f".{weights_name}.{token}.tmp"
    try:
        with open(tmp_options, "x", encoding="utf-8") as f:
            json.dump(options.to_dict(), f, indent=2)
        with h5py.File(tmp_weights, "x") as f:
            for name, value in datasets.items():
                f.create_dataset(name, data=value)
        os.replace(tmp_weights, weights_path)
        os.replace(tmp_options, options_path)
    except BaseException:
        for tmp in (tmp_options, tmp_weights):
            tmp.unlink(missing_ok=True)
        raise
    return options_path, weights_path


def random_model(preset: str, directory: str | os.PathLike, seed: int = 0,
                 exercise_clips: bool = False) -> tuple[Path, Path]:
    """Write a random model of a preset's shapes (``tiny``, ``small``, ``medium``, ``original``).

    Returns ``(options_path, weights_path)``. The weights are random: the vectors mean nothing.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    options = PRESETS[preset]
    return write_model(directory, options, random_weights(options, seed, exercise_clips))
