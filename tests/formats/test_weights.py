"""The model-file loader (options.json + bilm-tf weights.hdf5) and the random-model writer.

Layout conversions are checked against the file arrays directly (h5py), restating allennlp's
loading rules with explicit slicing rather than calling the library's helpers.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from repo_paths import REPO

from elmo_fast.errors import ModelFileError
from elmo_fast.formats.bilm_tf import ElmoOptions, expected_datasets, load_model_files, load_options, load_weights
from elmo_fast.formats.random_models import PRESETS, random_model, random_weights, write_model

FIXTURE = REPO.parent / "shared" / "fixtures" / "bilm_tf_tiny"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "lm_weights.hdf5").is_file() or not (FIXTURE / "options.json").is_file(),
    reason=f"bilm-tf tiny fixture not found at {FIXTURE} (shared/fixtures is not part of the repo)",
)


def file_arrays(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def file_layout(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, (tuple(obj.shape), obj.dtype)) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return out


def tf_lstm_expected(w0: np.ndarray, b: np.ndarray, wp: np.ndarray, in_dim: int, cell: int):
    """allennlp's rule, restated: TF gates (i, j, f, o) over [x, h] @ W_0 -> torch (i, f, g=j, o)."""
    C = cell
    i, j, f, o = (w0[:, k * C : (k + 1) * C] for k in range(4))  # each [In + P, C]
    w = np.concatenate([i.T, f.T, j.T, o.T], axis=0)  # [4C, In + P]
    bi, bj, bf, bo = (b[k * C : (k + 1) * C] for k in range(4))
    bias = np.concatenate([bi, bf + 1.0, bj, bo])
    return w[:, :in_dim], w[:, in_dim:], bias, wp.T


def assert_equal(actual: torch.Tensor, expected: np.ndarray) -> None:
    assert actual.dtype == torch.float32
    assert tuple(actual.shape) == expected.shape
    np.testing.assert_array_equal(actual.numpy(), expected.astype(np.float32))


def check_conversion(weights, arrays: dict[str, np.ndarray], options: ElmoOptions) -> None:
    o = options
    F = sum(n for _, n in o.filters)
    emb = weights.char_embedding
    assert tuple(emb.shape) == (262, o.char_dim)
    assert (emb[0] == 0).all()
    assert_equal(emb[1:], arrays["char_embed"])
    assert len(weights.conv_weights) == len(weights.conv_biases) == len(o.filters)
    for i, (width, num) in enumerate(o.filters):
        assert tuple(weights.conv_weights[i].shape) == (num, o.char_dim, width)
        assert_equal(weights.conv_weights[i], arrays[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0))
        assert_equal(weights.conv_biases[i], arrays[f"CNN/b_cnn_{i}"])
    assert len(weights.highway_weights) == len(weights.highway_biases) == o.n_highway
    for k in range(o.n_highway):
        g = f"CNN_high_{k}/"
        assert tuple(weights.highway_weights[k].shape) == (2 * F, F)
        assert_equal(
            weights.highway_weights[k], np.concatenate([arrays[g + "W_transform"].T, -arrays[g + "W_carry"].T])
        )
        assert_equal(weights.highway_biases[k], np.concatenate([arrays[g + "b_transform"], -arrays[g + "b_carry"]]))
    assert_equal(weights.proj_weight, arrays["CNN_proj/W_proj"].T)
    assert_equal(weights.proj_bias, arrays["CNN_proj/b_proj"])
    assert len(weights.lstm) == o.n_layers
    for layer in range(o.n_layers):
        assert len(weights.lstm[layer]) == 2
        for d in range(2):  # RNN_0 forward, RNN_1 backward
            cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
            w_ih, w_hh, bias, w_proj = tf_lstm_expected(
                arrays[cell + "W_0"], arrays[cell + "B"], arrays[cell + "W_P_0"], o.projection_dim, o.cell_dim
            )
            got = weights.lstm[layer][d]
            assert_equal(got.w_ih, w_ih)
            assert_equal(got.w_hh, w_hh)
            assert_equal(got.bias, bias)
            assert_equal(got.w_proj, w_proj)
    for t in weights.tensors():
        assert t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()


# ---- the real fixture ----------------------------------------------------------------------


@needs_fixture
def test_fixture_options():
    opts = load_options(FIXTURE / "options.json")
    assert opts == PRESETS["tiny"]
    assert opts.filters == ((1, 4), (2, 8), (3, 16), (4, 32), (5, 64))
    assert (opts.char_dim, opts.n_highway, opts.projection_dim, opts.cell_dim, opts.n_layers) == (4, 2, 16, 64, 2)
    assert (opts.cell_clip, opts.proj_clip) == (3.0, 3.0)
    assert opts.n_filters == 124 and opts.output_dim == 32


@needs_fixture
def test_fixture_loads_in_torch_layout():
    weights = load_model_files(FIXTURE / "options.json", FIXTURE / "lm_weights.hdf5")
    arrays = file_arrays(FIXTURE / "lm_weights.hdf5")
    assert arrays["char_embed"].shape == (261, 4)
    check_conversion(weights, arrays, weights.options)
    # spot-check the gate reordering on single elements, independently of the slicing above
    C, P = 64, 16
    w0 = arrays["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"]
    b = arrays["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B"]
    bwd = weights.lstm[1][1]
    assert bwd.w_ih[C + 5, 3].item() == w0[3, 2 * C + 5]  # torch f <- TF f
    assert bwd.w_ih[2 * C + 7, 0].item() == w0[0, C + 7]  # torch g <- TF j
    assert bwd.w_hh[3 * C, P - 1].item() == w0[P + P - 1, 3 * C]  # torch o <- TF o, recurrent part
    assert bwd.bias[C + 1].item() == np.float32(b[2 * C + 1] + 1.0)
    assert bwd.bias[2 * C + 1].item() == b[C + 1]


@needs_fixture
def test_fixture_layout_matches_expected_datasets():
    layout = file_layout(FIXTURE / "lm_weights.hdf5")
    expected = expected_datasets(PRESETS["tiny"])
    assert {k: v[0] for k, v in layout.items()} == {k: v[0] for k, v in expected.items()}


# ---- the random-model writer ---------------------------------------------------------------


@needs_fixture
def test_random_tiny_has_the_fixture_layout(tmp_path):
    _, weights_path = random_model("tiny", tmp_path, seed=3)
    assert file_layout(weights_path) == file_layout(FIXTURE / "lm_weights.hdf5")


@pytest.mark.parametrize("preset", ["tiny", "small", "medium"])
@pytest.mark.slow
def test_random_model_writes_bilm_tf_layout(tmp_path, preset):
    options_path, weights_path = random_model(preset, tmp_path, seed=1)
    options = PRESETS[preset]
    assert load_options(options_path) == options
    layout = file_layout(weights_path)
    assert {k: v[0] for k, v in layout.items()} == {k: v[0] for k, v in expected_datasets(options).items()}
    assert all(dtype == np.float32 for _, dtype in layout.values())
    weights = load_model_files(options_path, weights_path)
    assert weights.options == options
    check_conversion(weights, file_arrays(weights_path), options)


def test_original_preset_shapes():
    # The official "original" ELMo (5.5B) shapes; its weights are ~370 MB, so only the layout is checked.
    o = PRESETS["original"]
    assert o.filters == ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    assert (o.char_dim, o.n_highway, o.projection_dim, o.cell_dim, o.n_layers) == (16, 2, 512, 4096, 2)
    ds = {k: v[0] for k, v in expected_datasets(o).items()}
    assert ds["char_embed"] == (261, 16)
    assert ds["CNN/W_cnn_6"] == (1, 7, 16, 1024)
    assert ds["CNN_high_1/W_carry"] == (2048, 2048)
    assert ds["CNN_proj/W_proj"] == (2048, 512)
    assert ds["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"] == (1024, 16384)
    assert ds["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"] == (16384,)
    assert ds["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"] == (4096, 512)
    assert len(ds) == 1 + 2 * 7 + 4 * 2 + 2 + 2 * 2 * 3
    assert sum(int(np.prod(s)) for s in ds.values()) * 4 > 350e6  # bytes of fp32 weights


@pytest.mark.parametrize("preset", list(PRESETS))
def test_options_round_trip(tmp_path, preset):
    path = tmp_path / "options.json"
    path.write_text(json.dumps(PRESETS[preset].to_dict()), encoding="utf-8")
    assert load_options(path) == PRESETS[preset]


def test_random_model_is_deterministic_per_seed(tmp_path):
    _, a = random_model("tiny", tmp_path / "a", seed=5)
    _, b = random_model("tiny", tmp_path / "b", seed=5)
    _, c = random_model("tiny", tmp_path / "c", seed=6)
    fa, fb, fc = file_arrays(a), file_arrays(b), file_arrays(c)
    assert all(np.array_equal(fa[k], fb[k]) for k in fa)
    assert not np.array_equal(fa["CNN_proj/W_proj"], fc["CNN_proj/W_proj"])
    ref = random_weights(PRESETS["tiny"], seed=5)
    assert all(np.array_equal(fa[k], ref[k]) for k in ref)


def test_exercise_clips_scales_only_the_lstm(tmp_path):
    base = random_weights(PRESETS["tiny"], seed=2)
    clip = random_weights(PRESETS["tiny"], seed=2, exercise_clips=True)
    assert base.keys() == clip.keys()
    assert all(base[k].shape == clip[k].shape for k in base)
    lstm = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/"
    assert np.abs(clip[lstm + "W_P_0"]).mean() > 1.5 * np.abs(base[lstm + "W_P_0"]).mean()
    assert (
        clip[lstm + "B"][128:192].mean() > base[lstm + "B"][128:192].mean() + 1
    )  # forget gate: TF order i, j, f, o; C = 64
    for name in base:
        if not name.startswith("RNN_"):
            np.testing.assert_array_equal(base[name], clip[name], err_msg=name)


def test_unknown_preset(tmp_path):
    with pytest.raises(ValueError, match="huge"):
        random_model("huge", tmp_path)


# ---- error cases -------------------------------------------------------------------------


@pytest.fixture
def tiny(tmp_path):
    return random_model("tiny", tmp_path / "model", seed=11)


def _replace(weights_path: Path, name: str, value: np.ndarray | None) -> None:
    with h5py.File(weights_path, "r+") as f:
        del f[name]
        if value is not None:
            f.create_dataset(name, data=value)


def _load_error(options_path: Path, weights_path: Path) -> str:
    with pytest.raises(ModelFileError) as info:
        load_model_files(options_path, weights_path)
    assert isinstance(info.value, ValueError)
    return str(info.value)


DATASETS = [
    "char_embed",
    "CNN/W_cnn_3",
    "CNN_high_1/b_carry",
    "CNN_proj/W_proj",
    "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_0",
    "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B",
]


@pytest.mark.parametrize("name", DATASETS)
def test_missing_dataset(tiny, name):
    options_path, weights_path = tiny
    _replace(weights_path, name, None)
    msg = _load_error(options_path, weights_path)
    shape = expected_datasets(PRESETS["tiny"])[name][0]
    assert str(weights_path) in msg and name in msg and "missing" in msg and str(shape) in msg


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("how", ["wrong_size", "reshaped"])
def test_wrong_shape(tiny, name, how):
    options_path, weights_path = tiny
    shape = expected_datasets(PRESETS["tiny"])[name][0]
    if how == "wrong_size":
        bad_shape = shape[:-1] + (shape[-1] + 1,)
    else:
        bad_shape = (int(np.prod(shape)),) if len(shape) > 1 else (1, shape[0])
    _replace(weights_path, name, np.zeros(bad_shape, np.float32))
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and name in msg and str(shape) in msg and str(bad_shape) in msg


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_non_float_dataset(tiny, dtype):
    options_path, weights_path = tiny
    name = "CNN_high_0/W_transform"
    _replace(weights_path, name, np.ones((124, 124), dtype))
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and name in msg and np.dtype(dtype).name in msg


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_float_dtypes_load_as_fp32(tiny, dtype):
    options_path, weights_path = tiny
    name = "CNN_proj/b_proj"
    value = np.linspace(-1, 1, 16).astype(dtype)
    _replace(weights_path, name, value)
    weights = load_model_files(options_path, weights_path)
    assert_equal(weights.proj_bias, value.astype(np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["char_embed", "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"])
def test_non_finite_values(tiny, name, bad):
    options_path, weights_path = tiny
    with h5py.File(weights_path, "r+") as f:
        value = f[name][...]
        value.flat[value.size // 2] = bad
        f[name][...] = value
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and name in msg and ("NaN" in msg or "Inf" in msg)


def test_truncated_weights_file(tiny):
    options_path, weights_path = tiny
    data = weights_path.read_bytes()
    weights_path.write_bytes(data[: len(data) // 2])
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg


def test_weights_file_not_hdf5(tiny):
    options_path, weights_path = tiny
    weights_path.write_text("this is not an HDF5 file\n" * 100, encoding="utf-8")
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "HDF5" in msg


def test_missing_weights_file(tiny):
    options_path, weights_path = tiny
    weights_path.unlink()
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "not found" in msg


def test_missing_options_file(tiny, tmp_path):
    _, weights_path = tiny
    missing = tmp_path / "nowhere" / "options.json"
    msg = _load_error(missing, weights_path)
    assert str(missing) in msg and "not found" in msg


@pytest.mark.parametrize("text", ["{not json", "", "\xff\xfe garbage", "[1, 2, 3]", "null"])
def test_options_not_json_object(tiny, text):
    options_path, weights_path = tiny
    options_path.write_text(text, encoding="latin-1")
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg


def _edit_options(options_path: Path, edit) -> None:
    raw = json.loads(options_path.read_text(encoding="utf-8"))
    edit(raw)
    options_path.write_text(json.dumps(raw), encoding="utf-8")


@pytest.mark.parametrize(
    "section,key",
    [
        ("lstm", "projection_dim"),
        ("lstm", "dim"),
        ("lstm", "n_layers"),
        ("char_cnn", "filters"),
        ("char_cnn", "n_highway"),
    ],
)
def test_options_missing_key(tiny, section, key):
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw[section].pop(key))
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and f"{section}.{key}" in msg


def test_options_missing_section(tiny):
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw.pop("lstm"))
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and "lstm." in msg


def test_options_projection_dim_disagrees_with_weights(tiny):
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw["lstm"].__setitem__("projection_dim", 8))
    msg = _load_error(options_path, weights_path)
    # the first dataset whose shape depends on the projection dim
    assert str(weights_path) in msg and "CNN_proj/W_proj" in msg
    assert "(124, 8)" in msg and "(124, 16)" in msg


def test_options_cell_dim_disagrees_with_weights(tiny):
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw["lstm"].__setitem__("dim", 32))
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "LSTMCell/W_0" in msg
    assert "(32, 128)" in msg and "(32, 256)" in msg


@pytest.mark.parametrize("value", [False, None])
def test_options_without_skip_connections(tiny, value):
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw["lstm"].__setitem__("use_skip_connections", value))
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and "use_skip_connections" in msg


def test_load_weights_accepts_str_paths(tiny):
    options_path, weights_path = tiny
    weights = load_weights(str(weights_path), load_options(str(options_path)))
    check_conversion(weights, file_arrays(weights_path), PRESETS["tiny"])


@needs_fixture
def test_fixture_copy_with_deleted_dataset(tmp_path):
    # the real file, not only our writer's: a deleted dataset is named with its expected shape
    shutil.copy(FIXTURE / "lm_weights.hdf5", tmp_path / "w.hdf5")
    _replace(tmp_path / "w.hdf5", "CNN_high_1/W_carry", None)
    msg = _load_error(FIXTURE / "options.json", tmp_path / "w.hdf5")
    assert "CNN_high_1/W_carry" in msg and "(124, 124)" in msg and str(tmp_path / "w.hdf5") in msg


# ---- regressions found by tests/formats/test_loader_mutations.py ---------------------------------------


def _set_option_text(options_path: Path, section: str, key: str, literal: str) -> None:
    """Write ``literal`` (raw JSON text, e.g. NaN) as the value of ``section.key``."""
    raw = json.loads(options_path.read_text(encoding="utf-8"))
    raw[section][key] = "@@"
    options_path.write_text(json.dumps(raw).replace('"@@"', literal), encoding="utf-8")


@pytest.mark.parametrize(
    "key,literal",
    [
        ("dim", "NaN"),
        ("dim", "Infinity"),
        ("n_layers", "-Infinity"),
        ("cell_clip", "NaN"),
        ("proj_clip", "Infinity"),
        ("cell_clip", "1" + "0" * 400),
    ],
)
def test_options_non_finite_or_overflowing_numbers(tiny, key, literal):
    # Python's json reads these; int(nan), int(inf) and float(10**400) used to escape as plain
    # ValueError / OverflowError, and a NaN clip loaded (every output NaN)
    options_path, weights_path = tiny
    _set_option_text(options_path, "lstm", key, literal)
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and f"lstm.{key}" in msg and len(msg) < 300


@pytest.mark.parametrize("value", [-3, -0.5])
def test_options_negative_clip(tiny, value):
    # clamp(x, -c, c) with c < 0 sets everything to c: a negative clip is refused, not applied
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw["lstm"].__setitem__("proj_clip", value))
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and "lstm.proj_clip" in msg and ">= 0" in msg


def test_options_whole_floats_are_integers(tiny):
    options_path, weights_path = tiny
    _edit_options(
        options_path,
        lambda raw: (
            raw["char_cnn"]["embedding"].__setitem__("dim", 4.0),
            raw["char_cnn"].__setitem__("filters", [[1.0, 4], [2, 8.0], [3, 16], [4, 32], [5, 64]]),
            raw["lstm"].__setitem__("dim", 64.0),
        ),
    )
    assert load_options(options_path) == PRESETS["tiny"]
    _edit_options(options_path, lambda raw: raw["char_cnn"].__setitem__("filters", [[1.5, 4]]))
    assert "char_cnn.filters[0][0]" in _load_error(options_path, weights_path)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"lstm": {"dim": ' + "9" * 5000 + "}}"])
def test_options_json_beyond_python_limits(tiny, text):
    # nesting too deep for the decoder (RecursionError) and ints past Python's 4300-digit limit
    # (a plain ValueError) used to escape as other exception types
    options_path, weights_path = tiny
    options_path.write_text(text, encoding="utf-8")
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and "JSON" in msg and len(msg) < 400


@pytest.mark.parametrize("section,value", [("lstm", [1, 2]), ("char_cnn", "relu"), ("lstm", None)])
def test_options_section_not_an_object(tiny, section, value):
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw.__setitem__(section, value))
    msg = _load_error(options_path, weights_path)
    assert str(options_path) in msg and f"'{section}' must be a JSON object" in msg


@pytest.mark.parametrize(
    "section,key,value,missing",
    [
        ("lstm", "n_layers", 10**12, "RNN_0/RNN/MultiRNNCell/Cell2/LSTMCell/W_0"),
        ("char_cnn", "n_highway", 10**12, "CNN_high_2/W_transform"),
    ],
)
def test_huge_layer_counts_fail_fast(tiny, section, key, value, missing):
    # expected_datasets used to build the whole list first: 10**12 layers hung the loader
    import time

    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw[section].__setitem__(key, value))
    start = time.perf_counter()
    msg = _load_error(options_path, weights_path)
    assert time.perf_counter() - start < 5
    assert missing in msg and "missing" in msg and f"{section}.{key} = {value}" in msg


@pytest.mark.parametrize(
    "edit,dataset",
    [
        (lambda raw: raw["lstm"].__setitem__("projection_dim", 10**9), "CNN_proj/W_proj"),
        (lambda raw: raw["lstm"].__setitem__("dim", 10**12), "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"),
        (lambda raw: raw["char_cnn"]["embedding"].__setitem__("dim", 10**12), "char_embed"),
        (lambda raw: raw["char_cnn"].__setitem__("filters", [[1, 10**12]]), "CNN/W_cnn_0"),
    ],
)
def test_huge_sizes_are_compared_with_the_file_before_any_allocation(tiny, edit, dataset):
    # ElmoEmbedder (which sizes its token cache from the options) and ElmoBiLm must compare the
    # options with the weights' shapes before allocating anything of the options' sizes
    import resource
    import time

    from elmo_fast import ElmoEmbedder

    options_path, weights_path = tiny
    _edit_options(options_path, edit)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(ModelFileError) as info:
        ElmoEmbedder(options_path, weights_path, backend="reference")
    assert time.perf_counter() - start < 5
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # ru_maxrss is in KiB on Linux
    assert grown_mb < 200, f"peak memory grew by {grown_mb:.0f} MiB"
    msg = str(info.value)
    assert str(weights_path) in msg and dataset in msg and "expected" in msg


@pytest.mark.parametrize("section,key", [("char_cnn", "n_highway"), ("lstm", "n_layers")])
def test_options_with_fewer_layers_than_the_file(tiny, section, key):
    # used to load, silently dropping the file's last highway / LSTM layer
    options_path, weights_path = tiny
    _edit_options(options_path, lambda raw: raw[section].__setitem__(key, 1))
    msg = _load_error(options_path, weights_path)
    layer = "CNN_high_1" if key == "n_highway" else "RNN_0/RNN/MultiRNNCell/Cell1"
    assert str(weights_path) in msg and layer in msg and f"{section}.{key} = 1" in msg


def test_options_with_fewer_filters_than_the_file(tmp_path):
    # one filter fewer, with n_filters kept equal, so that no shape disagrees
    options = replace(PRESETS["tiny"], filters=((1, 4), (2, 8), (3, 16), (4, 32), (5, 32), (6, 32)))
    datasets = random_weights(options, seed=2)
    fewer = replace(options, filters=options.filters[:4] + ((5, 64),))
    datasets["CNN/W_cnn_4"] = np.random.default_rng(0).standard_normal((1, 5, 4, 64)).astype(np.float32)
    datasets["CNN/b_cnn_4"] = np.zeros(64, np.float32)
    options_path, weights_path = write_model(tmp_path, fewer, datasets)
    msg = _load_error(options_path, weights_path)
    assert "CNN/W_cnn_5" in msg and "beyond the options" in msg


def test_extra_unrelated_datasets_are_ignored(tiny):
    # as in allennlp, which reads the datasets it needs by name
    options_path, weights_path = tiny
    with h5py.File(weights_path, "r+") as f:
        f.create_dataset("notes", data="trained on 1B words", dtype=h5py.string_dtype())
        f.create_dataset("CNN_high_0/extra", data=np.arange(3))
    check_conversion(load_model_files(options_path, weights_path), file_arrays(weights_path), PRESETS["tiny"])


def test_group_instead_of_dataset(tiny):
    options_path, weights_path = tiny
    with h5py.File(weights_path, "r+") as f:
        del f["CNN_proj/b_proj"]
        f.create_group("CNN_proj/b_proj")
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "'CNN_proj/b_proj' is a group" in msg and "(16,)" in msg


def test_dataset_with_null_dataspace(tiny):
    # h5py gives shape None; tuple(None) used to escape as a TypeError
    options_path, weights_path = tiny
    with h5py.File(weights_path, "r+") as f:
        del f["CNN_proj/b_proj"]
        f.create_dataset("CNN_proj/b_proj", shape=None, dtype="f4")
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "CNN_proj/b_proj" in msg and "no shape" in msg and "(16,)" in msg


def test_dataset_never_written(tiny):
    # bilm-tf's dump_weights creates each dataset, then writes it: a dump that died in between left
    # a dataset that reads as zeros, which used to load
    options_path, weights_path = tiny
    with h5py.File(weights_path, "r+") as f:
        del f["RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/B"]
        f.create_dataset("RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/B", shape=(256,), dtype="f4")
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "Cell0/LSTMCell/B" in msg and "no stored values" in msg


def test_float64_values_beyond_float32_range(tiny):
    options_path, weights_path = tiny
    value = np.linspace(-1, 1, 16)
    value[3] = 1e39
    _replace(weights_path, "CNN_proj/b_proj", value)
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "CNN_proj/b_proj" in msg and "too large for float32" in msg


@pytest.mark.parametrize("which", ["options", "weights"])
def test_directory_instead_of_file(tiny, which):
    options_path, weights_path = tiny
    path = options_path if which == "options" else weights_path
    path.unlink()
    path.mkdir()
    msg = _load_error(options_path, weights_path)
    assert str(path) in msg and "is a directory" in msg


def test_hdf5_errors_are_one_line(tiny):
    # libhdf5's messages span lines; the CLI prints one line per error
    options_path, weights_path = tiny
    data = weights_path.read_bytes()
    weights_path.write_bytes(data[: len(data) // 3])
    msg = _load_error(options_path, weights_path)
    assert str(weights_path) in msg and "\n" not in msg


def test_the_old_name_of_random_models_still_imports_with_a_warning():
    """elmo_fast.testing (the examples once imported random_model from it) is an alias that warns."""
    import importlib
    import sys

    sys.modules.pop("elmo_fast.testing", None)
    with pytest.warns(DeprecationWarning, match="import elmo_fast.formats.random_models instead"):
        testing = importlib.import_module("elmo_fast.testing")
    assert testing.random_model is random_model and testing.PRESETS is PRESETS and testing.write_model is write_model
