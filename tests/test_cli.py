"""`elmo-fast` on the command line, run as a user runs it (a subprocess)."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from test_reference import expected_top_layers


def run_cli(*args, stdin=None, env=None):
    return subprocess.run([sys.executable, "-m", "elmo_fast.cli", *map(str, args)], input=stdin, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


def test_embed_all_matches_bilm_tf(tmp_path, bilm_tf_tiny, tiny_files, fixture_sentences):
    """`embed --all` on the fixture model: allennlp's layout, bilm-tf's numbers (stateful, batches of 3)."""
    order = [fixture_sentences[k][i] for i in range(10) for k in range(3)]
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(order) + "\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    r = run_cli("embed", inp, out, "--all", "--options", tiny_files[0], "--weights", tiny_files[1],
                "--batch-size", 3, "--stateful")
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stderr
    expected = expected_top_layers(bilm_tf_tiny)
    with h5py.File(out, "r") as f:
        assert set(f.keys()) == {str(n) for n in range(30)} | {"sentence_to_index"}
        assert f["sentence_to_index"].shape == (1,)
        assert json.loads(f["sentence_to_index"][0]) == {s: str(n) for n, s in enumerate(order)}
        for n in range(30):
            i, k = divmod(n, 3)
            ds = f[str(n)]
            assert ds.dtype == np.float32 and ds.shape == (3, len(order[n].split()), 32)
            assert np.abs(ds[2] - expected[k][i]).max() <= 1e-5


def test_embed_stdin_top_and_errors(tmp_path, random_models):
    options, weights = random_models("tiny")
    out = tmp_path / "out.hdf5"
    r = run_cli("embed", "-", out, "--top", "--options", options, "--weights", weights, "--quiet",
                stdin="first line .\nsecond one\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    with h5py.File(out, "r") as f:
        assert f["0"].shape == (3, 32) and f["1"].shape == (2, 32)

    r = run_cli("embed", "-", tmp_path / "bad.hdf5", "--top", "--options", options, "--weights", weights,
                stdin="fine\n\nalso fine\n")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("elmo-fast: error:") and "line 2 is empty" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "bad.hdf5").exists()

    r = run_cli("embed", "-", tmp_path / "x.hdf5", "--top", "--options", options, "--weights", tmp_path / "none.hdf5",
                stdin="a\n")
    assert r.returncode == 2 and "weights file not found" in r.stderr and "Traceback" not in r.stderr

    r = run_cli("embed", "-", tmp_path / "x.hdf5", "--options", options, "--weights", weights, stdin="a\n")
    assert r.returncode == 2  # argparse: one of --all/--top/--average is required


def test_random_model_command_warns(tmp_path):
    r = run_cli("random-model", "tiny", tmp_path / "m", "--seed", 3)
    assert r.returncode == 0, r.stderr
    assert "RANDOM" in r.stderr
    assert (tmp_path / "m" / "options.json").exists() and (tmp_path / "m" / "weights.hdf5").exists()


def test_embed_by_model_name_from_local_server(tmp_path, random_models):
    """--model NAME downloads once into $ELMO_FAST_CACHE (served from 127.0.0.1, never the internet)."""
    import functools
    import http.server
    import shutil
    import threading

    from elmo_fast.hub import MODELS

    options, weights = random_models("tiny")
    root = tmp_path / "srv"
    rel_opts, rel_weights = MODELS["small"]
    for src, rel in ((options, rel_opts), (weights, rel_weights)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / rel)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"ELMO_FAST_BASE_URL": f"http://127.0.0.1:{server.server_port}", "ELMO_FAST_CACHE": str(tmp_path / "cache")}
        r = run_cli("embed", "-", tmp_path / "o.hdf5", "--average", "--model", "small", stdin="a b c\n", env=env)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "cache" / "small" / "weights.hdf5").exists()
        with h5py.File(tmp_path / "o.hdf5", "r") as f:
            assert f["0"].shape == (3, 32)
    finally:
        server.shutdown()
    # offline now: the cached copy is used without any request
    r = run_cli("embed", "-", tmp_path / "o2.hdf5", "--average", "--model", "small", stdin="a b c\n", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli("embed", "-", tmp_path / "o3.hdf5", "--average", "--model", "nope", stdin="a\n", env=env)
    assert r.returncode == 2 and "original-5.5b" in r.stderr
