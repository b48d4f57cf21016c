#!/usr/bin/env python
"""THE PEER SIDE: runs simple_elmo 0.9.2 on TensorFlow, in its own virtual environment only.

Never imported by elmo-fast, its tests or its benchmarks: they run this file as a subprocess with
the side environment's Python (TensorFlow is never a dependency of elmo-fast). Make the environment:

    python3 -m venv /work/simple_elmo_env
    /work/simple_elmo_env/bin/pip install tensorflow-cpu==2.21.0 simple-elmo==0.9.2
    /work/simple_elmo_env/bin/pip install --no-deps tf-keras==2.21.0

and run with TF_USE_LEGACY_KERAS=1 (simple_elmo needs Keras 2). Two commands:

    record PLAN.json OUT.npz   run the calls of each case of PLAN (scripts/record_simple_elmo.py
                               writes it) and save each result under "case/i": an array, or a JSON
                               string (substitutes), or "ERROR: Type: message"
    bench  PLAN.json OUT.json  load a model, time get_elmo_vectors on texts (benchmarks/bench_simple_elmo.py)

A case whose archive is a full model (``"checkpoint": true``) first gets a TensorFlow checkpoint
written beside its ``model.hdf5`` and ``softmax.hdf5`` (simple_elmo's ``full=True`` reads one):
simple_elmo's own ``LanguageModel`` graph, its variables set from those two files (the names of
bilm-tf's ``dump_weights``), saved with ``tf.train.Saver``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import logging  # noqa: E402

import numpy as np  # noqa: E402


def _hdf5_name(tf_name: str) -> str:
    """bilm-tf's dump_weights naming: a TensorFlow variable's dataset in the HDF5 files."""
    name = re.sub(":0$", "", tf_name)
    name = name[len("lm/"):] if name.startswith("lm/") else name
    name = name.replace("/rnn/", "/RNN/").replace("/multi_rnn_cell/", "/MultiRNNCell/")
    name = re.sub("/cell_", "/Cell", name).replace("/lstm_cell/", "/LSTMCell/")
    if "/RNN/" in name:
        name = name.replace("projection/kernel", "W_P_0") if "projection" in name else \
            re.sub("/bias$", "/B", re.sub("/kernel$", "/W_0", name))
    return name


def make_checkpoint(folder: str) -> None:
    import h5py
    import tensorflow as tf
    from simple_elmo.training import LanguageModel

    tf.compat.v1.disable_eager_execution()
    with open(os.path.join(folder, "options.json")) as f:
        options = json.load(f)
    options = dict(options, batch_size=1, unroll_steps=1)
    options["char_cnn"] = dict(options["char_cnn"], n_characters=261)
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.variable_scope("lm"):
            LanguageModel(options, False)
        variables = tf.compat.v1.global_variables()
        with h5py.File(os.path.join(folder, "model.hdf5"), "r") as w, \
                h5py.File(os.path.join(folder, "softmax.hdf5"), "r") as s, tf.compat.v1.Session() as sess:
            for v in variables:
                name = _hdf5_name(v.name)
                value = (s if name.startswith("softmax/") else w)[name][...]
                assert tuple(value.shape) == tuple(v.shape.as_list()), (v.name, value.shape, v.shape)
                v.load(value, sess)
            tf.compat.v1.train.Saver(variables).save(sess, os.path.join(folder, "model.ckpt"), global_step=1)


def _result(value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    return np.array(json.dumps(value))


def record(plan_path: str, out_path: str) -> None:
    import tensorflow as tf
    from simple_elmo import ElmoModel

    with open(plan_path) as f:
        plan = json.load(f)
    done_checkpoints = set()
    results: dict[str, np.ndarray] = {}
    for name, case in plan["cases"].items():
        if case.get("checkpoint") and case["path"] not in done_checkpoints:
            make_checkpoint(case["path"])
            done_checkpoints.add(case["path"])
        with tf.Graph().as_default():
            model = ElmoModel()
            model.load(case["path"], **case["load"])
            for i, (method, kwargs) in enumerate(case["calls"]):
                try:
                    results[f"{name}/{i}"] = _result(getattr(model, method)(**kwargs))
                except Exception as e:  # recorded: the behaviour to reproduce
                    results[f"{name}/{i}"] = np.array(f"ERROR: {type(e).__name__}: {e}")
        print(f"recorded {name}", file=sys.stderr)
    np.savez_compressed(out_path, **results)


def _peak_rss_mb() -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def bench(plan_path: str, out_path: str) -> None:
    """Load the model, embed the texts ``repeats`` times; the times of each."""
    started = time.perf_counter()
    import tensorflow as tf
    from simple_elmo import ElmoModel

    with open(plan_path) as f:
        plan = json.load(f)
    if plan.get("threads"):
        tf.config.threading.set_intra_op_parallelism_threads(plan["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(plan["threads"])
    imported = time.perf_counter()
    model = ElmoModel()
    model.load(plan["path"], max_batch_size=plan["batch_size"])
    loaded = time.perf_counter()
    times = []
    for _ in range(plan["repeats"]):
        t0 = time.perf_counter()
        vectors = model.get_elmo_vectors(plan["texts"], warmup=plan["warmup"], layers=plan["layers"])
        times.append(time.perf_counter() - t0)
    out = {"import_s": imported - started, "load_s": loaded - imported, "call_s": times,
           "shape": list(vectors.shape), "tensorflow": tf.__version__, "peak_rss_mb": _peak_rss_mb()}
    if plan.get("save_vectors"):
        np.save(plan["save_vectors"], vectors.astype(np.float32))
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    logging.disable(logging.INFO)  # simple_elmo logs every batch at INFO
    command, *args = sys.argv[1:]
    {"record": record, "bench": bench}[command](*args)
