"""Random-weight ELMo models written in the bilm-tf layout (and in ELMoForManyLangs' layout), for
tests and benchmarks: what ``elmo-fast random-model`` writes, and the architecture presets
(:data:`PRESETS`) that ``elmo-fast train --preset`` trains.

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
from pathlib import Path

import numpy as np

from ..durable import make_dirs, together
from .bilm_tf import FILE_CHAR_ROWS, ElmoOptions, LstmWeights, expected_datasets
from .manylangs_dir import ManyLangsConfig, ManyLangsWeights, save_manylangs

_FULL_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))

PRESETS: dict[str, ElmoOptions] = {
    # the shapes of ../shared/fixtures/bilm_tf_tiny (the real tiny biLM trained by bilm-tf)
    "tiny": ElmoOptions(
        filters=((1, 4), (2, 8), (3, 16), (4, 32), (5, 64)),
        char_dim=4,
        n_highway=2,
        projection_dim=16,
        cell_dim=64,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
    ),
    "small": ElmoOptions(
        filters=_FULL_FILTERS,
        char_dim=16,
        n_highway=1,
        projection_dim=128,
        cell_dim=1024,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
    ),
    "medium": ElmoOptions(
        filters=_FULL_FILTERS,
        char_dim=16,
        n_highway=1,
        projection_dim=256,
        cell_dim=2048,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
    ),
    "original": ElmoOptions(
        filters=_FULL_FILTERS,
        char_dim=16,
        n_highway=2,
        projection_dim=512,
        cell_dim=4096,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
    ),
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
            bias[2 * C : 3 * C] += forget_shift  # TF gate order i, j, f, o
            out[prefix + "B"] = bias
            out[prefix + "W_P_0"] = normal((C, P), proj_gain / np.sqrt(C))
    expected = expected_datasets(o)
    assert out.keys() == expected.keys() and all(out[k].shape == expected[k][0] for k in out)
    return out


def write_model(
    directory: str | os.PathLike,
    options: ElmoOptions,
    datasets: dict[str, np.ndarray],
    options_name: str = "options.json",
    weights_name: str = "weights.hdf5",
) -> tuple[Path, Path]:
    """Write ``options.json`` and a bilm-tf-layout ``weights.hdf5``; returns their paths.

    Both files are written together (:func:`elmo_fast.durable.together`): each under a temporary
    name, and renamed into place only when both are whole on disk, so that a failed or interrupted
    write leaves the directory as it was, never new weights beside old options.
    """
    make_dirs(directory, "model directory")
    directory = Path(directory)
    options_path, weights_path = directory / options_name, directory / weights_name
    with together() as files:
        weights_file = files.hdf5(weights_path)
        for name, value in datasets.items():
            weights_file.create_dataset(name, data=value)
        json.dump(options.to_dict(), files.open(options_path), indent=2)
    return options_path, weights_path


def random_model(
    preset: str, directory: str | os.PathLike, seed: int = 0, exercise_clips: bool = False
) -> tuple[Path, Path]:
    """Write a random model of a preset's shapes (``tiny``, ``small``, ``medium``, ``original``).

    Returns ``(options_path, weights_path)``. The weights are random: the vectors mean nothing.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    options = PRESETS[preset]
    return write_model(directory, options, random_weights(options, seed, exercise_clips))


# ---------------------------------------------------------------------------------------------
# ELMoForManyLangs model directories

MANYLANGS_PRESETS: dict[str, ManyLangsConfig] = {
    "tiny": ManyLangsConfig(
        filters=((1, 4), (2, 8), (3, 16), (4, 32)),
        char_dim=6,
        word_dim=8,
        n_highway=2,
        max_characters_per_token=50,
        projection_dim=16,
        cell_dim=48,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
    ),
    # the released models' shapes (cnn_50_100_512_4096_sample.json)
    "released": ManyLangsConfig(
        filters=_FULL_FILTERS,
        char_dim=50,
        word_dim=100,
        n_highway=2,
        max_characters_per_token=50,
        projection_dim=512,
        cell_dim=4096,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
    ),
}

#: characters of a random model's char.dic: ASCII, Latin letters with diacritics, Cyrillic, CJK
MANYLANGS_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"()-"
    "áéíóöőúüűÁÉÍÓÖŐÚÜŰßçñãõâêôàèìòùëïäåøæœ"
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюя"
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年"
)
MANYLANGS_SPECIAL_CHARS = ("<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>")
MANYLANGS_SPECIAL_WORDS = ("<oov>", "<bos>", "<eos>", "<pad>")


def random_words(n: int, chars: str, seed: int = 0, max_len: int = 9) -> list[str]:
    """``n`` distinct random words over ``chars`` (lengths 1..max_len)."""
    rng = np.random.default_rng(seed)
    alphabet = list(chars)
    words: dict[str, None] = {}
    while len(words) < n:
        length = int(rng.integers(1, max_len + 1))
        words["".join(rng.choice(alphabet, length))] = None
    return list(words)


def random_manylangs_weights(
    config: ManyLangsConfig, chars: list[str], words: list[str], seed: int = 0, exercise_clips: bool = False
) -> ManyLangsWeights:
    """Random weights of an ELMoForManyLangs model, with dictionaries holding ``chars`` and ``words``
    (plus the marks its code needs), ids in the order ELMoForManyLangs' training gives them."""
    import torch

    rng = np.random.default_rng(seed)
    o = config
    T, P, C = o.n_filters, o.projection_dim, o.cell_dim
    proj_gain = 3.0 if exercise_clips else 1.5
    recurrent_gain = 0.35 if exercise_clips else 1.0
    forget_shift = 2.5 if exercise_clips else 1.0  # its biases carry the +1 TF adds at run time

    def normal(shape, std, mean=0.0):
        return torch.from_numpy((mean + std * rng.standard_normal(shape)).astype(np.float32))

    def table(rows: int, dim: int, std: float):
        t = normal((rows + 1, dim), std)
        t[0] = 0.0  # row 0: no token
        return t

    char_vocab = {c: i for i, c in enumerate(dict.fromkeys([*chars, *MANYLANGS_SPECIAL_CHARS]))} if o.char_dim else {}
    word_vocab = {w: i for i, w in enumerate(dict.fromkeys([*MANYLANGS_SPECIAL_WORDS, *words]))} if o.word_dim else {}
    conv_w = [normal((n, o.char_dim, w), 1.0 / np.sqrt(w * o.char_dim)) for w, n in o.filters]
    conv_b = [normal((n,), 0.1) for _, n in o.filters]
    hw_w = [normal((2 * T, T), 1.0 / np.sqrt(T)) for _ in range(o.n_highway)]
    hw_b = [torch.cat([normal((T,), 0.1), normal((T,), 0.5, mean=1.0)]) for _ in range(o.n_highway)]
    lstm = []
    for _ in range(o.n_layers):
        pair = []
        for _ in range(2):
            bias = normal((4 * C,), 0.1)
            bias[C : 2 * C] += forget_shift  # gates i, f, g, o
            pair.append(
                LstmWeights(
                    w_ih=normal((4 * C, P), 1.0 / np.sqrt(2 * P)),
                    w_hh=normal((4 * C, P), recurrent_gain / np.sqrt(2 * P)),
                    bias=bias,
                    w_proj=normal((P, C), proj_gain / np.sqrt(C)),
                )
            )
        lstm.append(tuple(pair))
    return ManyLangsWeights(
        options=o,
        char_vocab=char_vocab,
        word_vocab=word_vocab,
        word_embedding=table(len(word_vocab), o.word_dim, 0.5) if o.word_dim else None,
        char_embedding=table(len(char_vocab), o.char_dim, 1.0) if o.char_dim else None,
        conv_weights=conv_w,
        conv_biases=conv_b,
        highway_weights=hw_w,
        highway_biases=hw_b,
        proj_weight=normal((P, o.word_dim + T), 0.5 / np.sqrt(o.word_dim + T)),
        proj_bias=normal((P,), 0.1),
        lstm=lstm,
    )


def random_manylangs_model(
    preset: str | ManyLangsConfig,
    directory: str | os.PathLike,
    seed: int = 0,
    exercise_clips: bool = False,
    n_words: int = 500,
    chars: str = MANYLANGS_CHARS,
    legacy_format: bool = False,
) -> Path:
    """Write a random ELMoForManyLangs model directory (``tiny``, ``released`` or a config) with a
    vocabulary of ``n_words`` random words over ``chars``. The weights are random: the vectors mean nothing."""
    config = MANYLANGS_PRESETS[preset] if isinstance(preset, str) else preset
    words = random_words(n_words, chars, seed) if config.word_dim else []
    weights = random_manylangs_weights(config, list(chars), words, seed, exercise_clips)
    return save_manylangs(directory, weights, legacy_format=legacy_format)
