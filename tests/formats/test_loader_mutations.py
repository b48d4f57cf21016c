"""Mutation test of the model-file loader: damaged weights and options files are refused, cleanly.

Hypothesis starts from a valid model (the ``tiny`` random preset, and the real bilm-tf fixture
when present) and draws one mutation per example: a dataset deleted, reshaped, retyped, replaced
by a group (or a group by a dataset), poisoned with NaN/Inf, left unwritten; an extra dataset; the
file cut short, overwritten in the middle, emptied, or a directory; an options key removed or set
to a value of another type or size, the JSON cut short, non-UTF-8 bytes, nesting too deep.

Every mutated model must either load (only when the mutation is harmless, and then the loaded
weights are checked against what the file says) or raise an ``ElmoFastError`` (a ``ValueError``)
whose one-line message names the file. Any other exception fails the example; so does a hang
(``signal.alarm`` per example). libhdf5 is C code that a damaged file could crash, so the whole
hypothesis loop runs in a child process with a timeout: a segfault or a hang fails the test with
the mutation that caused it (the child announces each mutation on stderr before loading it).

Run by hand: ``python tests/formats/test_loader_mutations.py [FIXTURE_DIR]`` (the child's entry point).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: examples per source model; about 15 ms each, plus ~3 s to start the child
MAX_EXAMPLES = 400
#: seconds one load may take before the example counts as a hang (a tiny model loads in ~10 ms)
PER_EXAMPLE_TIMEOUT_S = 20
CHILD_TIMEOUT_S = 150


# ---- the mutations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """One change to a valid model; ``expect`` is what the loader must do with it.

    target: "weights" or "options". expect: "load" (harmless: must load, and match ``check``),
    "refuse" (must raise ElmoFastError naming the file and every string of ``says``), or "either"
    (random bytes overwritten: the loader cannot always tell, but must never fail otherwise).
    """

    target: str
    kind: str
    detail: str
    expect: str
    says: tuple[str, ...] = ()
    apply: Any = None  # callable(options_path, weights_path) -> expected ElmoOptions / arrays, or None

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return f"Mutation({self.target}: {self.kind} {self.detail} -> expect {self.expect})"


def _replace_dataset(weights_path: Path, name: str, make) -> None:
    import h5py

    with h5py.File(weights_path, "r+") as f:
        old = f[name][...]
        del f[name]
        make(f, name, old)


def _random_array(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@dataclass
class Base:
    """The valid model mutations start from: its files, its parsed content, its dataset layout."""

    options_path: Path
    weights_path: Path
    options_json: dict
    options_text: bytes
    layout: dict[str, tuple[tuple[int, ...], np.dtype]]
    groups: list[str]
    options: Any  # ElmoOptions
    arrays: dict[str, np.ndarray]


def load_base(options_path: Path, weights_path: Path) -> Base:
    import h5py

    from elmo_fast.formats.bilm_tf import load_options

    layout: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    groups: list[str] = []
    arrays: dict[str, np.ndarray] = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            layout[name] = (tuple(obj.shape), obj.dtype)
            arrays[name] = obj[...]
        else:
            groups.append(name)

    with h5py.File(weights_path, "r") as f:
        f.visititems(visit)
    text = Path(options_path).read_bytes()
    return Base(
        Path(options_path),
        Path(weights_path),
        json.loads(text),
        text,
        layout,
        sorted(groups),
        load_options(options_path),
        arrays,
    )


# Option keys by what the loader must accept for them. Shape-giving keys: only the file's own value
# (a whole float of it too); anything else disagrees with the weights or is no size at all.
_SHAPE_KEYS = {
    ("lstm", "projection_dim"),
    ("lstm", "dim"),
    ("lstm", "n_layers"),
    ("char_cnn", "n_highway"),
    ("char_cnn", "embedding", "dim"),
}
_DEFAULTS = {
    ("char_cnn", "activation"): ("activation", "relu"),
    ("char_cnn", "n_characters"): ("n_characters", 262),
    ("char_cnn", "max_characters_per_token"): ("max_characters_per_token", 50),
    ("lstm", "cell_clip"): ("cell_clip", None),
    ("lstm", "proj_clip"): ("proj_clip", None),
}


def _int_like(v: Any) -> bool:
    return (
        not isinstance(v, bool)
        and isinstance(v, (int, float))
        and (isinstance(v, int) or math.isfinite(v))
        and v == int(v)
    )


def expected_option(path: tuple, value: Any, base: Base):
    """The ElmoOptions the loader must produce with ``path`` set to ``value``, or None: refused.

    An independent restatement of the rules (allennlp's, plus elmo-fast's checks), not a call
    into the loader.
    """
    o = base.options
    original = base.options_json
    for k in path:
        original = original[k]
    if path in _SHAPE_KEYS:
        return o if _int_like(value) and int(value) == original else None
    if path[:2] == ("char_cnn", "filters"):

        def same(v, orig):
            if isinstance(orig, list):
                return isinstance(v, list) and len(v) == len(orig) and all(same(a, b) for a, b in zip(v, orig))
            return _int_like(v) and int(v) == orig

        return o if same(value, original) else None
    if path == ("char_cnn", "n_characters"):
        return replace(o, n_characters=int(value)) if _int_like(value) and int(value) in (261, 262) else None
    if path == ("char_cnn", "max_characters_per_token"):
        return o if _int_like(value) and int(value) == 50 else None
    if path == ("char_cnn", "activation"):
        return replace(o, activation=value) if isinstance(value, str) and value in ("relu", "tanh") else None
    if path in (("lstm", "cell_clip"), ("lstm", "proj_clip")):
        field = path[1]
        if value is None:
            return replace(o, **{field: None})
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            clip = float(value)
        except OverflowError:
            return None
        if not math.isfinite(clip) or clip < 0:
            return None
        return replace(o, **{field: clip or None})
    if path == ("lstm", "use_skip_connections"):
        return o if value else None  # allennlp: `if not options["lstm"].get("use_skip_connections")`
    raise AssertionError(f"no rule for option {path}")


def _leaf_paths(d: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(d, dict):
        return [p for k, v in d.items() for p in _leaf_paths(v, prefix + (k,))]
    if isinstance(d, list):
        return [prefix] + [p for i, v in enumerate(d) for p in _leaf_paths(v, prefix + (i,))]
    return [prefix]


def _set_path(d: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def mutations(base: Base):
    """The hypothesis strategy of mutations of ``base``."""
    from hypothesis import strategies as st

    names = sorted(base.layout)
    o = base.options
    values = st.one_of(
        st.integers(-3, 300),
        st.sampled_from([0, 1, 2, 261, 262, 10**9, 10**12, 2**63, 10**18, 10**100, -(10**12)]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([1e300, -0.0, 0.5, 3.0, 16.0, 64.0]),
        st.booleans(),
        st.none(),
        st.text(max_size=6),
        st.sampled_from(["16", "relu", "tanh", "sigmoid", "3"]),
        st.lists(st.integers(-2, 70), max_size=3),
        st.dictionaries(st.sampled_from(["dim", "a"]), st.integers(0, 20), max_size=2),
    )

    @st.composite
    def delete(draw):
        name = draw(st.sampled_from(names))
        return Mutation(
            "weights",
            "delete",
            name,
            "refuse",
            (name, "missing"),
            lambda op, wp: _replace_dataset(wp, name, lambda f, n, old: None),
        )

    @st.composite
    def reshape(draw):
        name = draw(st.sampled_from(names))
        shape = base.layout[name][0]
        options = [shape + (1,), (1,) + shape, shape[:-1], (int(np.prod(shape)),), (0,) + shape[1:], ()]
        for i in range(len(shape)):
            options += [
                shape[:i] + (shape[i] + 1,) + shape[i + 1 :],
                shape[:i] + (max(shape[i] - 1, 0),) + shape[i + 1 :],
            ]
        options.append(tuple(reversed(shape)))
        new = draw(st.sampled_from([s for s in options if s != shape]))
        seed = draw(st.integers(0, 2**32 - 1))
        return Mutation(
            "weights",
            "reshape",
            f"{name} {shape} -> {new}",
            "refuse",
            (name, str(shape), str(new)),
            lambda op, wp: _replace_dataset(
                wp, name, lambda f, n, old: f.create_dataset(n, data=_random_array(np.random.default_rng(seed), new))
            ),
        )

    refused_dtypes = {
        "int8": np.int8,
        "int32": np.int32,
        "int64": np.int64,
        "uint8": np.uint8,
        "bool": np.bool_,
        "complex64": np.complex64,
        "complex128": np.complex128,
    }

    @st.composite
    def retype(draw):
        import h5py

        name = draw(st.sampled_from(names))
        kind = draw(
            st.sampled_from(["float16", "float64", ">f4", *refused_dtypes, "bytes", "vlen str", "compound", "enum"])
        )
        if kind in ("float16", "float64", ">f4"):
            # float types load as fp32: float64 and big-endian fp32 hold the same values exactly, float16 rounds
            stored = base.arrays[name].astype(kind)
            assert np.isfinite(stored).all(), f"{name} does not fit {kind}: pick smaller test weights"

            def apply(op, wp):
                _replace_dataset(wp, name, lambda f, n, old: f.create_dataset(n, data=stored))
                return {**base.arrays, name: stored.astype(np.float32)}

            return Mutation("weights", "retype", f"{name} as {kind}", "load", apply=apply)

        def make(f, n, old):
            if kind in refused_dtypes:
                f.create_dataset(n, data=(old * 10).astype(refused_dtypes[kind]))
            elif kind == "bytes":
                f.create_dataset(n, data=np.full(old.shape, b"1.5"))
            elif kind == "vlen str":
                f.create_dataset(n, data=np.full(old.shape, "1.5", dtype=object), dtype=h5py.string_dtype())
            elif kind == "compound":
                f.create_dataset(n, data=np.zeros(old.shape, [("re", "f4"), ("im", "f4")]))
            else:
                f.create_dataset(
                    n, data=np.zeros(old.shape, np.int8), dtype=h5py.enum_dtype({"a": 0, "b": 1}, basetype="i1")
                )

        return Mutation(
            "weights",
            "retype",
            f"{name} as {kind}",
            "refuse",
            (name, "dtype"),
            lambda op, wp: _replace_dataset(wp, name, make),
        )

    @st.composite
    def poison(draw):
        name = draw(st.sampled_from(names))
        size = int(np.prod(base.layout[name][0]))
        index = draw(st.integers(0, size - 1))
        value, dtype = draw(
            st.sampled_from(
                [
                    (np.nan, np.float32),
                    (np.inf, np.float32),
                    (-np.inf, np.float32),
                    (np.nan, np.float16),
                    (1e39, np.float64),
                    (-1e300, np.float64),
                ]
            )
        )

        def make(f, n, old):
            new = old.astype(dtype)
            new.flat[index] = value
            f.create_dataset(n, data=new)

        says = (name, "NaN or Inf") if not np.isfinite(value) else (name, "too large for float32")
        return Mutation(
            "weights",
            "poison",
            f"{name}.flat[{index}] = {value} ({np.dtype(dtype).name})",
            "refuse",
            says,
            lambda op, wp: _replace_dataset(wp, name, make),
        )

    @st.composite
    def structure(draw):
        import h5py

        how = draw(
            st.sampled_from(["group for dataset", "dataset for group", "dangling link", "unwritten", "null dataspace"])
        )
        if how == "dataset for group":
            group = draw(st.sampled_from(base.groups))

            def apply(op, wp):
                with h5py.File(wp, "r+") as f:
                    del f[group]
                    f.create_dataset(group, data=np.ones(3, np.float32))

            # the first expected dataset under it is reported missing
            return Mutation("weights", "structure", f"{how} {group}", "refuse", (group + "/", "missing"), apply)
        name = draw(st.sampled_from(names))
        shape = base.layout[name][0]

        def make(f, n, old):
            if how == "group for dataset":
                f.create_group(n)
            elif how == "dangling link":
                f[n] = h5py.SoftLink("/nowhere/" + n)
            elif how == "unwritten":
                f.create_dataset(n, shape=shape, dtype="f4")
            else:
                f.create_dataset(n, shape=None, dtype="f4")

        says = {
            "group for dataset": (name, "group"),
            "dangling link": (name, "missing"),
            "unwritten": (name, "no stored values"),
            "null dataspace": (name, "no shape"),
        }[how]
        return Mutation(
            "weights", "structure", f"{how} {name}", "refuse", says, lambda op, wp: _replace_dataset(wp, name, make)
        )

    @st.composite
    def extra(draw):
        import h5py

        where = draw(st.sampled_from(["", *(g + "/" for g in base.groups)]))
        leaf = "extra_" + draw(st.text(alphabet="abcxyz_019", min_size=1, max_size=6))
        path = where + leaf
        kind = draw(st.sampled_from(["float32 matrix", "int scalar", "string", "group"]))

        def apply(op, wp):
            with h5py.File(wp, "r+") as f:
                if kind == "float32 matrix":
                    f.create_dataset(path, data=np.ones((3, 5), np.float32))
                elif kind == "int scalar":
                    f.create_dataset(path, data=np.int64(7))
                elif kind == "string":
                    f.create_dataset(path, data="notes", dtype=h5py.string_dtype())
                else:
                    f.create_group(path).create_dataset("x", data=np.zeros(2, np.float32))
            return base.arrays

        # ignored, as allennlp ignores them: it reads the datasets it needs by name
        return Mutation("weights", "extra", f"{kind} at {path}", "load", apply=apply)

    @st.composite
    def beyond(draw):
        # a layer the options do not have: options and weights are of different models
        cell = f"RNN_{draw(st.integers(0, 1))}/RNN/MultiRNNCell/Cell{o.n_layers}"
        path, reported = draw(
            st.sampled_from(
                [
                    (f"CNN_high_{o.n_highway}/W_transform", f"CNN_high_{o.n_highway}"),
                    (cell + "/LSTMCell/B", cell),
                    (f"CNN/W_cnn_{len(o.filters)}", f"CNN/W_cnn_{len(o.filters)}"),
                    ("RNN_2/RNN/MultiRNNCell/Cell0/LSTMCell/W_0", "RNN_2"),
                ]
            )
        )
        copy_of = draw(st.sampled_from(names))

        def apply(op, wp):
            import h5py

            with h5py.File(wp, "r+") as f:
                f.create_dataset(path, data=base.arrays[copy_of])

        return Mutation("weights", "beyond", path, "refuse", (reported, "beyond the options"), apply)

    @st.composite
    def damage(draw):
        size = base.weights_path.stat().st_size
        how = draw(st.sampled_from(["truncate", "overwrite", "zero length", "directory"]))
        if how == "truncate":
            at = draw(st.integers(0, size - 1))

            def apply(op, wp):
                with open(wp, "r+b") as f:
                    f.truncate(at)

            return Mutation("weights", "damage", f"truncated to {at} of {size} bytes", "refuse", (), apply)
        if how == "overwrite":
            at = draw(st.integers(0, size - 1))
            data = draw(st.binary(min_size=1, max_size=64))

            def apply(op, wp):
                with open(wp, "r+b") as f:
                    f.seek(at)
                    f.write(data[: size - at])

            return Mutation(
                "weights",
                "damage",
                f"{len(data)} bytes overwritten at {at} of {size}: {data[:16]!r}",
                "either",
                (),
                apply,
            )
        if how == "zero length":
            return Mutation(
                "weights", "damage", "zero-length file", "refuse", (), lambda op, wp: open(wp, "wb").close()
            )

        def to_dir(op, wp):
            os.unlink(wp)
            os.mkdir(wp)

        return Mutation("weights", "damage", "a directory instead of the file", "refuse", ("directory",), to_dir)

    leaf_paths = [p for p in _leaf_paths(base.options_json) if len(p) >= 2]

    def write_json(op, doc) -> None:
        Path(op).write_text(json.dumps(doc), encoding="utf-8")

    @st.composite
    def option_set(draw):
        path = draw(st.sampled_from(leaf_paths))
        original = base.options_json
        for k in path:
            original = original[k]
        value = draw(
            st.one_of(values, st.just(original), st.just(float(original)) if _int_like(original) else st.just(original))
        )
        expected = expected_option(path, value, base)
        doc = copy.deepcopy(base.options_json)
        _set_path(doc, path, value)
        label = ".".join(map(str, path)) + f" = {value!r}"
        if expected is None:
            return Mutation("options", "set", label, "refuse", (), lambda op, wp: write_json(op, doc))

        def apply(op, wp):
            write_json(op, doc)
            return expected

        return Mutation("options", "set", label, "load", apply=apply)

    @st.composite
    def option_remove(draw):
        path = draw(
            st.sampled_from(
                [p for p in leaf_paths if not isinstance(p[-1], int)]
                + [(k,) for k in base.options_json]
                + [("char_cnn", "embedding")]
            )
        )
        doc = copy.deepcopy(base.options_json)
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        del parent[path[-1]]
        label = ".".join(map(str, path))
        if path in _DEFAULTS:
            field, default = _DEFAULTS[path]

            def apply(op, wp):
                write_json(op, doc)
                return replace(base.options, **{field: default})

            return Mutation("options", "remove", label, "load", apply=apply)
        says = (path[-1],) if path != ("lstm", "use_skip_connections") else ("use_skip_connections",)
        return Mutation("options", "remove", label, "refuse", says, lambda op, wp: write_json(op, doc))

    @st.composite
    def option_retype(draw):
        section = draw(st.sampled_from([None, *base.options_json]))
        value = draw(st.sampled_from([[], [1, 2], "text", 3, None, True]))
        doc = copy.deepcopy(base.options_json) if section else value
        if section:
            doc[section] = value
        label = f"{section or 'the whole file'} = {value!r}"
        return Mutation("options", "retype", label, "refuse", (), lambda op, wp: write_json(op, doc))

    @st.composite
    def option_text(draw):
        text = base.options_text
        how = draw(
            st.sampled_from(["truncate", "non-UTF-8", "empty", "BOM", "deep nesting", "long integer", "directory"])
        )
        if how == "truncate":
            at = draw(st.integers(0, len(text) - 1))
            new = text[:at]
            try:  # the cut may only drop trailing whitespace: then it still is the same JSON
                harmless = json.loads(new.decode("utf-8")) == base.options_json
            except ValueError:
                harmless = False
            if harmless:

                def apply(op, wp):
                    Path(op).write_bytes(new)
                    return base.options

                return Mutation("options", "text", f"truncated to {at} of {len(text)} bytes", "load", apply=apply)
        elif how == "non-UTF-8":
            at = draw(st.integers(0, len(text)))
            bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xe2\x82", b"\x80", b"\xed\xa0\x80"]))
            new = text[:at] + bad + text[at:]
        elif how == "empty":
            new = b""
        elif how == "BOM":
            new = b"\xef\xbb\xbf" + text  # json.load refuses it, as it does for allennlp and bilm-tf
        elif how == "deep nesting":
            depth = draw(st.sampled_from([10**4, 10**5]))
            doc = copy.deepcopy(base.options_json)
            doc["lstm"]["dim"] = "@"
            new = json.dumps(doc).replace('"@"', "[" * depth + "]" * depth).encode()
        elif how == "long integer":
            doc = copy.deepcopy(base.options_json)
            doc["lstm"]["n_layers"] = "@"
            new = json.dumps(doc).replace('"@"', "9" * draw(st.integers(4301, 20000))).encode()
        else:

            def to_dir(op, wp):
                os.unlink(op)
                os.mkdir(op)

            return Mutation("options", "text", "a directory instead of the file", "refuse", ("directory",), to_dir)
        return Mutation(
            "options",
            "text",
            how + (f" at {at}" if how in ("truncate", "non-UTF-8") else ""),
            "refuse",
            (),
            lambda op, wp: Path(op).write_bytes(new),
        )

    return st.one_of(
        delete(),
        reshape(),
        retype(),
        poison(),
        structure(),
        extra(),
        beyond(),
        damage(),
        option_set(),
        option_remove(),
        option_retype(),
        option_text(),
    )


# ---- checking one mutation ----------------------------------------------------------------------


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"loading took more than {PER_EXAMPLE_TIMEOUT_S} s")


def check_mutation(base: Base, mutation: Mutation, workdir: Path) -> None:
    from elmo_fast.errors import ElmoFastError
    from elmo_fast.formats.bilm_tf import load_model_files

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    op, wp = workdir / "options.json", workdir / "weights.hdf5"
    shutil.copy(base.options_path, op)
    shutil.copy(base.weights_path, wp)
    expected = mutation.apply(op, wp)
    print(f"MUTATION {mutation!r}", file=sys.stderr, flush=True)  # the last words if libhdf5 crashes
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_EXAMPLE_TIMEOUT_S)
    try:
        try:
            weights = load_model_files(op, wp)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    except ElmoFastError as e:
        message = str(e)
        assert isinstance(e, ValueError)
        assert mutation.expect in ("refuse", "either"), f"{mutation!r} is harmless but was refused: {message}"
        named = str(wp) if mutation.target == "weights" else str(op)
        # an options value that disagrees with the weights is found in the weights file
        assert named in message or mutation.target == "options" and str(wp) in message, (
            f"{mutation!r}: the message does not name {named}: {message}"
        )
        assert "\n" not in message, f"{mutation!r}: the message is not one line: {message!r}"
        for part in mutation.says:
            assert part in message, f"{mutation!r}: the message does not say {part!r}: {message}"
        return
    assert mutation.expect in ("load", "either"), f"{mutation!r} loaded instead of being refused"
    if mutation.expect == "either":
        assert all(t.isfinite().all() for t in weights.tensors())
        return
    if mutation.target == "options":
        assert weights.options == expected, f"{mutation!r}: options {weights.options} != {expected}"
        expected = base.arrays
    else:
        assert weights.options == base.options
    _assert_weights_equal(weights, expected, mutation)


def _assert_weights_equal(weights, arrays: dict[str, np.ndarray], mutation: Mutation) -> None:
    """The loaded tensors are those of ``arrays`` (fp32 values per dataset), via one conversion path:
    write them as a clean fp32 file and load that."""
    from elmo_fast.formats.bilm_tf import load_weights
    from elmo_fast.formats.random_models import write_model

    with tempfile.TemporaryDirectory() as d:
        _, clean = write_model(d, weights.options, {k: np.asarray(v, np.float32) for k, v in arrays.items()})
        want = load_weights(clean, weights.options)
    for got, exp in zip(weights.tensors(), want.tensors(), strict=True):
        assert got.dtype == exp.dtype and got.shape == exp.shape and bool((got == exp).all()), (
            f"{mutation!r}: loaded weights differ from the file's values"
        )


def run_mutations(base: Base, max_examples: int) -> None:
    """The hypothesis loop (in the child process)."""
    from hypothesis import HealthCheck, given, settings

    workroot = Path(tempfile.mkdtemp(prefix="elmo_fast_mutations_"))
    try:

        @settings(
            max_examples=max_examples,
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(mutations(base))
        def loader_survives(mutation):
            check_mutation(base, mutation, workroot / "m")

        loader_survives()
    finally:
        shutil.rmtree(workroot, ignore_errors=True)


def child_main(argv: list[str]) -> int:
    """Entry point of the child: ``[FIXTURE_DIR]`` (the real model) or nothing (the tiny preset)."""
    from elmo_fast.formats.random_models import random_model

    with tempfile.TemporaryDirectory(prefix="elmo_fast_base_") as d:
        if argv:
            options_path, weights_path = Path(argv[0]) / "options.json", Path(argv[0]) / "lm_weights.hdf5"
        else:
            options_path, weights_path = random_model("tiny", d, seed=int.from_bytes(os.urandom(2), "little"))
        n = int(os.environ.get("ELMO_FAST_MUTATIONS", MAX_EXAMPLES))
        run_mutations(load_base(options_path, weights_path), n)
    print(f"OK {n} mutations", flush=True)
    return 0


# ---- the tests (parent side) --------------------------------------------------------------------


def _run_child(args: list[str]) -> None:
    import elmo_fast

    env = dict(os.environ)
    package_root = str(Path(elmo_fast.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    env["PYTHONFAULTHANDLER"] = "1"  # a crash in libhdf5 prints the Python stack
    try:
        proc = subprocess.run(
            [sys.executable, __file__, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            cwd=package_root,
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        last = [line for line in err.splitlines() if line.startswith("MUTATION ")][-1:]
        pytest.fail(f"the mutation loop hung (> {CHILD_TIMEOUT_S} s); last mutation: {last}")
    output = proc.stdout + proc.stderr
    if proc.returncode < 0:
        last = [line for line in proc.stderr.splitlines() if line.startswith("MUTATION ")][-1:]
        pytest.fail(f"the loader crashed the process (signal {-proc.returncode}) on {last}\n{output[-4000:]}")
    assert proc.returncode == 0, (
        "a mutation was mishandled (hypothesis' falsifying example below):\n"
        + "\n".join(line for line in output.splitlines() if not line.startswith("MUTATION "))[-8000:]
    )
    assert "OK " in proc.stdout


@pytest.mark.slow
def test_mutations_of_the_tiny_preset():
    _run_child([])


@pytest.mark.slow
def test_mutations_of_the_bilm_tf_fixture(bilm_tf_tiny):
    _run_child([str(bilm_tf_tiny)])


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
