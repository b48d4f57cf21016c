"""`elmo-fast` on the command line, run as a user runs it (a subprocess)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from test_reference import expected_top_layers


def run_cli(*args, stdin=None, env=None):
    return subprocess.run([sys.executable, "-m", "elmo_fast", *map(str, args)], input=stdin, capture_output=True,
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

    from elmo_fast.pretrained import MODELS

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


# --- bad input: one line on stderr, exit code 2, nothing left behind ------------------------------

def _broken_model(kind, tmp_path, options, weights):
    """(options, weights) broken one way; the datasets are those of a real bilm-tf file."""
    import shutil

    bad = tmp_path / "model"
    bad.mkdir()
    if kind == "truncated":
        data = weights.read_bytes()
        (bad / "w.hdf5").write_bytes(data[: len(data) * 2 // 3])
    elif kind == "corrupt":
        data = bytearray(weights.read_bytes())
        data[:8] = b"NOTHDF5!"
        (bad / "w.hdf5").write_bytes(bytes(data))
    else:
        shutil.copy(weights, bad / "w.hdf5")
        with h5py.File(bad / "w.hdf5", "r+") as f:
            name = "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"
            a = f[name][...]
            if kind == "nan":
                a[1, 2] = np.nan
            elif kind == "inf":
                a[-1, -1] = -np.inf
            if kind == "int":
                del f[name]
                f[name] = a.astype(np.int32)
            else:
                f[name][...] = a
    if kind == "disagree":
        opts = json.loads(options.read_text())
        opts["lstm"]["dim"] += 8
        (bad / "o.json").write_text(json.dumps(opts))
        return bad / "o.json", weights
    return options, bad / "w.hdf5"


BAD_INPUTS = {
    # case: (input bytes, extra arguments, what the message must say)
    "not utf-8": (b"fine line\nstill fine\nbad \xe9t\xe9\n", [], r"in.txt: line 3 is not valid UTF-8 .*--encoding-errors replace"),
    "empty line": (b"one\n\nthree\n", [], r"in.txt: line 2 is empty; .*--skip-empty"),
    "whitespace line": (b"one\ntwo\n \t \n", [], r"in.txt: line 3 is empty"),
    "empty file": (b"", [], r"in.txt: the input holds no sentences"),
    "only blank lines, skipped": (b"\n  \n", ["--skip-empty"], r"in.txt: the input holds no sentences"),
    "input missing": (None, [], r"in.txt: input file not found"),
    "output directory missing": (b"a\n", ["OUT=missing/out.hdf5"], r"the output's directory .*missing does not exist"),
    "output exists": (b"a\n", ["EXISTS"], r"out.hdf5 already exists; pass --overwrite to replace it"),
    "interrupted run left": (b"a\n", ["WORKDIR"], r"out.hdf5.partial holds an interrupted run .*pass --resume"),
    "weights truncated": (b"a\n", ["MODEL=truncated"], r"w.hdf5: not a readable HDF5 file \(truncated or corrupt"),
    "weights corrupt": (b"a\n", ["MODEL=corrupt"], r"w.hdf5: not a readable HDF5 file"),
    "options disagree": (b"a\n", ["MODEL=disagree"], r"has shape .*, expected .*lstm.dim"),
    "NaN in weights": (b"a\n", ["MODEL=nan"], r"dataset 'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' holds NaN or Inf"),
    "Inf in weights": (b"a\n", ["MODEL=inf"], r"dataset 'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' holds NaN or Inf"),
    "weights not float": (b"a\n", ["MODEL=int"], r"'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' has dtype int32, expected a float"),
    "unknown --model": (b"a\n", ["--model", "large"], r"unknown model 'large'; valid names: default, small, medium, original, original-5.5b$"),
    "stateful with a token budget": (b"a\n", ["--stateful", "--max-tokens-per-batch", "100"], r"cannot be used with --stateful"),
    "cuda without a GPU": (b"a\n", ["--device", "cuda"], r"device 'cuda' requested, but torch sees no CUDA GPU"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_one_line_and_exit_2(case, tmp_path, random_models, capsys):
    import re

    from elmo_fast.cli import main

    if case == "cuda without a GPU":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: this case needs a machine without one")
    data, extra, message = BAD_INPUTS[case]
    options, weights = map(Path, random_models("tiny"))
    inp = tmp_path / "in.txt"
    if data is not None:
        inp.write_bytes(data)
    out = tmp_path / "out.hdf5"
    model = ["--options", str(options), "--weights", str(weights)]
    for arg in list(extra):
        if arg.startswith("OUT="):
            out = tmp_path / arg[4:]
        elif arg == "EXISTS":
            out.write_bytes(b"an earlier result")
        elif arg == "WORKDIR":  # what a killed --resume run leaves
            (tmp_path / "out.hdf5.partial").mkdir()
            (tmp_path / "out.hdf5.partial" / "manifest.json").write_text("{}")
        elif arg.startswith("MODEL="):
            o, w = _broken_model(arg[6:], tmp_path, options, weights)
            model = ["--options", str(o), "--weights", str(w)]
        else:
            model += [arg]
    if "--model" in model:
        model = model[model.index("--model"):]
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    code = main(["embed", str(inp), str(out), "--top", "--quiet", *model])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("elmo-fast: error: "), err
    assert re.search(message, err.strip()), err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # nothing written or left


def test_bad_line_mid_stream_in_a_real_process(tmp_path, random_models):
    """Exit code and stderr of a real process: the bar, then one error line; no traceback, no output."""
    options, weights = random_models("tiny")
    lines = [f"sentence number {i} ." for i in range(150)]
    stdin = ("\n".join(lines[:120]) + "\n\udcff broken\n" + "\n".join(lines[120:]) + "\n")
    r = subprocess.run([sys.executable, "-m", "elmo_fast", "embed", "-", str(tmp_path / "o.hdf5"), "--all",
                        "--options", str(options), "--weights", str(weights), "--window", "50"],
                       input=stdin.encode("utf-8", "surrogateescape"), capture_output=True, timeout=300,
                       env={**os.environ})
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert err.strip().splitlines()[-1] == ("elmo-fast: error: <stdin>: line 121 is not valid UTF-8 (invalid start "
                                            "byte at byte 0 of the line); fix it, or pass --encoding-errors replace "
                                            "to read bad bytes as U+FFFD")
    assert "Traceback" not in err and "100line" in err  # the bar counted the two windows done
    assert os.listdir(tmp_path) == []


def test_embed_options_end_to_end(tmp_path, random_models, capsys):
    """--skip-empty, --encoding-errors replace, --overwrite, --forget-sentences, --use-sentence-keys,
    --max-tokens-per-batch, --window, --no-bucketing and --resume, through main()."""
    from elmo_fast.cli import main

    options, weights = random_models("tiny")
    inp = tmp_path / "in.txt"
    inp.write_bytes(b"first line\n\nbad \xff here\n   \nlast one of all .\n")
    out = tmp_path / "o.hdf5"
    model = ["--options", str(options), "--weights", str(weights), "--quiet"]
    runs = [["--skip-empty", "--encoding-errors", "replace"],
            ["--skip-empty", "--encoding-errors", "replace", "--overwrite", "--max-tokens-per-batch", "3",
             "--window", "2", "--resume"],
            ["--skip-empty", "--encoding-errors", "replace", "--overwrite", "--no-bucketing", "--forget-sentences"],
            ["--skip-empty", "--encoding-errors", "replace", "--overwrite", "--use-sentence-keys"]]
    results = []
    for extra in runs:
        assert main(["embed", str(inp), str(out), "--average", *model, *extra]) == 0, capsys.readouterr().err
        with h5py.File(out, "r") as f:
            mapping = json.loads(f["sentence_to_index"][0]) if "sentence_to_index" in f else None
            results.append(({k: f[k][...] for k in f if k != "sentence_to_index"}, mapping))
    assert capsys.readouterr().err == ""
    keys = {"first line": "0", "bad \ufffd here": "2", "last one of all .": "4"}
    assert results[0][1] == results[1][1] == keys and results[2][1] is None and results[3][1] is None
    assert sorted(results[3][0]) == sorted(keys)
    for k, v in keys.items():
        assert results[0][0][v].shape == (len(k.split()), 32)
        for other in (results[1][0][v], results[2][0][v], results[3][0][k]):
            np.testing.assert_allclose(other, results[0][0][v], atol=1e-5, rtol=0)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "o.hdf5"]
