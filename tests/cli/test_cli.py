"""`elmo-fast` on the command line, run as a user runs it (a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import cli_process
import h5py
import numpy as np
import pytest
from bilm_cases import expected_top_layers


def run_cli(*args, stdin=None, env=None):
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.mark.slow
def test_embed_all_matches_bilm_tf(tmp_path, bilm_tf_tiny, tiny_files, fixture_sentences):
    """`embed --all` on the fixture model: allennlp's layout, bilm-tf's numbers (stateful, batches of 3)."""
    order = [fixture_sentences[k][i] for i in range(10) for k in range(3)]
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(order) + "\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    r = run_cli(
        "embed",
        inp,
        out,
        "--all",
        "--options",
        tiny_files[0],
        "--weights",
        tiny_files[1],
        "--batch-size",
        3,
        "--stateful",
    )
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


@pytest.mark.slow
def test_embed_stdin_top_and_errors(tmp_path, random_models):
    options, weights = random_models("tiny")
    out = tmp_path / "out.hdf5"
    r = run_cli(
        "embed",
        "-",
        out,
        "--top",
        "--options",
        options,
        "--weights",
        weights,
        "--quiet",
        stdin="first line .\nsecond one\n",
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    with h5py.File(out, "r") as f:
        assert f["0"].shape == (3, 32) and f["1"].shape == (2, 32)

    r = run_cli(
        "embed",
        "-",
        tmp_path / "bad.hdf5",
        "--top",
        "--options",
        options,
        "--weights",
        weights,
        stdin="fine\n\nalso fine\n",
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("elmo-fast: error:") and "line 2 is empty" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "bad.hdf5").exists()

    r = run_cli(
        "embed",
        "-",
        tmp_path / "x.hdf5",
        "--top",
        "--options",
        options,
        "--weights",
        tmp_path / "none.hdf5",
        stdin="a\n",
    )
    assert r.returncode == 2 and "weights file not found" in r.stderr and "Traceback" not in r.stderr

    r = run_cli("embed", "-", tmp_path / "x.hdf5", "--options", options, "--weights", weights, stdin="a\n")
    assert r.returncode == 2  # argparse: one of --all/--top/--average is required


@pytest.mark.slow
def test_random_model_command_warns(tmp_path):
    r = run_cli("random-model", "tiny", tmp_path / "m", "--seed", 3)
    assert r.returncode == 0, r.stderr
    assert "RANDOM" in r.stderr
    assert (tmp_path / "m" / "options.json").exists() and (tmp_path / "m" / "weights.hdf5").exists()


@pytest.mark.slow
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
        env = {
            "ELMO_FAST_BASE_URL": f"http://127.0.0.1:{server.server_port}",
            "ELMO_FAST_CACHE": str(tmp_path / "cache"),
        }
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
    "not utf-8": (
        b"fine line\nstill fine\nbad \xe9t\xe9\n",
        [],
        r"in.txt: line 3 is not valid UTF-8 .*--encoding-errors replace",
    ),
    "empty line": (b"one\n\nthree\n", [], r"in.txt: line 2 is empty; .*--skip-empty"),
    "whitespace line": (b"one\ntwo\n \t \n", [], r"in.txt: line 3 is empty"),
    "empty file": (b"", [], r"in.txt: the input holds no sentences"),
    "only blank lines, skipped": (b"\n  \n", ["--skip-empty"], r"in.txt: the input holds no sentences"),
    "input missing": (None, [], r"in.txt: input file not found"),
    "output exists": (b"a\n", ["EXISTS"], r"out.hdf5 already exists; pass --overwrite to replace it"),
    "interrupted run left": (b"a\n", ["WORKDIR"], r"out.hdf5.partial holds an interrupted run .*pass --resume"),
    "weights truncated": (b"a\n", ["MODEL=truncated"], r"w.hdf5: not a readable HDF5 file \(truncated or corrupt"),
    "weights corrupt": (b"a\n", ["MODEL=corrupt"], r"w.hdf5: not a readable HDF5 file"),
    "options disagree": (b"a\n", ["MODEL=disagree"], r"has shape .*, expected .*lstm.dim"),
    "NaN in weights": (b"a\n", ["MODEL=nan"], r"dataset 'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' holds NaN or Inf"),
    "Inf in weights": (b"a\n", ["MODEL=inf"], r"dataset 'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' holds NaN or Inf"),
    "weights not float": (
        b"a\n",
        ["MODEL=int"],
        r"'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' has dtype int32, expected a float",
    ),
    "unknown --model": (
        b"a\n",
        ["--model", "large"],
        r"unknown model 'large'; valid names: default, default-v1, small, medium, original, original-5.5b, pt, pubmed; "
        r"or hf:OWNER/REPO\[@REVISION\]\[/SUBFOLDER\], or URL#sha256=HEX$",
    ),
    "stateful with a token budget": (
        b"a\n",
        ["--stateful", "--max-tokens-per-batch", "100"],
        r"cannot be used with --stateful",
    ),
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
        model = model[model.index("--model") :]
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    code = main(["embed", str(inp), str(out), "--top", "--quiet", *model])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("elmo-fast: error: "), err
    assert re.search(message, err.strip()), err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # nothing written or left


@pytest.mark.slow
def test_bad_line_mid_stream_in_a_real_process(tmp_path, random_models):
    """Exit code and stderr of a real process: the bar, then one error line; no traceback, no output."""
    options, weights = random_models("tiny")
    lines = [f"sentence number {i} ." for i in range(150)]
    stdin = "\n".join(lines[:120]) + "\n\udcff broken\n" + "\n".join(lines[120:]) + "\n"
    r = cli_process.run(
        [
            sys.executable,
            "-m",
            "elmo_fast",
            "embed",
            "-",
            str(tmp_path / "o.hdf5"),
            "--all",
            "--options",
            str(options),
            "--weights",
            str(weights),
            "--window",
            "50",
        ],
        input=stdin.encode("utf-8", "surrogateescape"),
        capture_output=True,
        timeout=300,
        env={**os.environ},
    )
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert err.strip().splitlines()[-1] == (
        "elmo-fast: error: <stdin>: line 121 is not valid UTF-8 (invalid start "
        "byte at byte 0 of the line); fix it, or pass --encoding-errors replace "
        "to read bad bytes as U+FFFD"
    )
    assert "Traceback" not in err and "400tok" in err  # the bar counted the two windows done: 100 lines of 4 tokens
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
    runs = [
        ["--skip-empty", "--encoding-errors", "replace"],
        [
            "--skip-empty",
            "--encoding-errors",
            "replace",
            "--overwrite",
            "--max-tokens-per-batch",
            "3",
            "--window",
            "2",
            "--resume",
        ],
        ["--skip-empty", "--encoding-errors", "replace", "--overwrite", "--no-bucketing", "--forget-sentences"],
        ["--skip-empty", "--encoding-errors", "replace", "--overwrite", "--use-sentence-keys"],
    ]
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
    # --tokenize: raw text, split by elmo-fast's tokenizer; keys stay the lines
    inp.write_text("Don't panic, it's fine.\n", encoding="utf-8")
    assert main(["embed", str(inp), str(out), "--top", *model, "--overwrite", "--tokenize"]) == 0
    with h5py.File(out, "r") as f:
        assert f["0"].shape == (8, 32)  # Do n't panic , it 's fine .
        assert json.loads(f["sentence_to_index"][0]) == {"Don't panic, it's fine.": "0"}


# --- termination signals: the job schedulers' way to stop a run ---------------------------------


def _sentences(n, seed):
    import random

    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", ".", "Über", "東京", "dogs", "x" * 60]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def _signal_mid_run(tmp_path, args, lines, signum, ready):
    """Start `elmo-fast embed - ...`, feed it `lines` but keep stdin open, so that it is mid-run for sure
    (blocked reading the next window); once `ready()` holds, send `signum`. Returns (returncode, stderr)."""
    import signal
    import time

    proc = cli_process.Popen(
        [sys.executable, "-m", "elmo_fast", "embed", "-", *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ},
        # as from a terminal: under `nohup` (SIGHUP ignored, and inherited) the CLI
        # rightly keeps ignoring it, which is not what these tests look at
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    try:
        proc.stdin.write(("\n".join(lines) + "\n").encode())
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the run never got to the point to stop it at"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)  # closes stdin too: a run that ignored the signal would finish
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err.decode()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
@pytest.mark.slow
def test_a_terminated_plain_run_leaves_nothing(tmp_path, random_models, signame):
    import signal

    options, weights = random_models("tiny")
    out = tmp_path / "o.h5"
    args = [out, "--all", "--options", options, "--weights", weights, "--window", "16", "--quiet"]

    def writing():  # the temporary files exist: the run is under way
        return any(p.name.endswith(".elmo-tmp") for p in tmp_path.iterdir())

    signum = getattr(signal, signame)
    code, err = _signal_mid_run(tmp_path, args, _sentences(40, 1), signum, writing)
    assert code == 128 + signum, err
    assert err.strip().splitlines()[-1] == f"elmo-fast: terminated by {signame}; no output was written"
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_terminated_resume_run_leaves_a_work_area_that_resume_completes(tmp_path, random_models):
    import signal

    options, weights = random_models("tiny")
    lines = _sentences(60, 2)
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--all", "--options", options, "--weights", weights, "--window", "16", "--quiet"]
    r = run_cli("embed", inp, tmp_path / "want.h5", *common)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "o.h5"
    work = tmp_path / "o.h5.partial"
    code, err = _signal_mid_run(
        tmp_path,
        [out, *common, "--resume"],
        lines[:40],
        signal.SIGTERM,
        # named by its first sentence; its record is written after it (a signal
        # between the two leaves the shard unrecorded, to be redone: waited past here)
        lambda: (work / "shard-000016.h5.done").exists(),
    )
    assert code == 143, err
    assert err.strip().splitlines()[-1] == (
        f"elmo-fast: terminated by SIGTERM; completed windows are kept in {work}: "
        f"run the same command (with --resume) to continue"
    )
    assert sorted(p.name for p in work.iterdir()) == [
        "manifest.json",
        "shard-000000.h5",
        "shard-000000.h5.done",
        "shard-000016.h5",
        "shard-000016.h5.done",
    ]
    assert not out.exists()
    r = run_cli("embed", "-", out, *common, "--resume", stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "o.h5", "want.h5"]
    with h5py.File(out, "r") as got, h5py.File(tmp_path / "want.h5", "r") as want:
        assert sorted(got) == sorted(want) and got["sentence_to_index"][0] == want["sentence_to_index"][0]
        for key in want:
            if key != "sentence_to_index":
                np.testing.assert_allclose(got[key][...], want[key][...], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_killed_runs_temporary_files_are_removed_by_the_next_run(tmp_path, random_models):
    """kill -9 runs no cleanup: the next run for the same output finds the files by their exact name and
    removes them, as their process is gone, and says so."""
    import re
    import signal
    import socket

    options, weights = random_models("tiny")
    out = tmp_path / "o.h5"
    args = [out, "--top", "--options", options, "--weights", weights, "--window", "16"]
    stale = []

    def writing():
        stale[:] = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".elmo-tmp"))
        return len(stale) == 2  # the HDF5 file and the sentence list

    code, _ = _signal_mid_run(tmp_path, args, _sentences(40, 3), signal.SIGKILL, writing)
    assert code == -signal.SIGKILL
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64]
    for name in stale:
        assert re.fullmatch(rf"\.o\.h5\.{re.escape(host)}-[0-9]+\.[0-9a-f]{{8}}(\.sentences)?\.elmo-tmp", name), name
    # and the run's lock file, which never blocks the next run (the kernel dropped the lock with the process)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(stale + [".o.h5.elmo-lock"])
    r = run_cli("embed", "-", out, *args[1:], stdin="one line\n")
    assert r.returncode == 0, r.stderr
    for name in stale:
        assert f"elmo-fast: removed {tmp_path / name}, left by a run that was killed" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.h5"]


# --- allennlp's command line, flags in messages, swapped files, the closing lines --------------------


@pytest.mark.slow
def test_an_allennlp_elmo_command_line_works(tmp_path, random_models):
    """`allennlp elmo ...` with `allennlp elmo` replaced by `elmo-fast embed`: allennlp 0.9's flags
    (--cuda-device -1 is the CPU; --include-package and --vocab-path are accepted, and ignored)."""
    options, weights = random_models("tiny")
    lines = _sentences(23, 5)
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    allennlp = [
        "--options-file",
        options,
        "--weight-file",
        weights,
        "--batch-size",
        4,
        "--cuda-device",
        -1,
        "--use-sentence-keys",
        "--forget-sentences",
        "--file-friendly-logging",
        "--include-package",
        "my_package",
        "--vocab-path",
        tmp_path / "vocab.txt",
    ]
    r = run_cli("embed", inp, tmp_path / "a.h5", "--top", *allennlp)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "tokens/s" in r.stderr  # file-friendly: no carriage returns
    native = [
        "--options",
        options,
        "--weights",
        weights,
        "--batch-size",
        4,
        "--device",
        "cpu",
        "--use-sentence-keys",
        "--forget-sentences",
        "--quiet",
    ]
    r = run_cli("embed", inp, tmp_path / "n.h5", "--top", *native)
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "a.h5", "r") as a, h5py.File(tmp_path / "n.h5", "r") as n:
        assert sorted(a) == sorted(n) == sorted(set(lines)) and "sentence_to_index" not in a
        for key in n:
            np.testing.assert_array_equal(a[key][...], n[key][...])
    assert not (tmp_path / "vocab.txt").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--cuda-device", "0"], r"device 'cuda:0' requested, but torch sees no CUDA GPU"),
        (["--cuda-device", "-2"], r"invalid device -2: as an int, -1 is the CPU and N >= 0 the GPU cuda:N"),
        (["--cuda-device", "0", "--device", "cpu"], r"give --device or --cuda-device, not both"),
        (["--batch-size", "0"], r"^elmo-fast: error: --batch-size must be >= 1, got 0$"),
        (["--window", "0"], r"^elmo-fast: error: --window must be >= 1, got 0$"),
        (["--max-tokens-per-batch", "0"], r"^elmo-fast: error: --max-tokens-per-batch must be >= 1, got 0$"),
        (
            ["--use-sentence-keys", "DUPLICATES"],
            r"line 2 repeats the sentence of line 1; .*do not pass "
            r"--use-sentence-keys to encode duplicate sentences$",
        ),
        (
            ["SWAPPED"],
            r"the model files look swapped: --options .*weights.hdf5 is an HDF5 file \(weights\) and --weights "
            r".*options.json is JSON \(options\); pass them the other way round$",
        ),
        (
            ["BOTH HDF5"],
            r"weights.hdf5: --options is an HDF5 file \(weights\?\), expected the JSON options; .*weights.hdf5 "
            r"is HDF5 too: one file given for both\?$",
        ),
        (
            ["BOTH JSON"],
            r"options.json: --weights holds JSON \(options\?\), expected the HDF5 weights; .*options.json is "
            r"JSON too: one file given for both\?$",
        ),
        (
            [],
            r"give --options F and --weights F together \(or --model NAME, or --model-dir DIR, or none of them for the "
            r"bundled model\)$",
        ),
    ],
)
def test_cli_errors_name_flags(tmp_path, random_models, capsys, args, message):
    import re

    import torch

    from elmo_fast.cli import main

    if "cuda:0" in message and torch.cuda.is_available():
        pytest.skip("a GPU is present: this case needs a machine without one")
    options, weights = map(str, random_models("tiny"))
    inp = tmp_path / "in.txt"
    inp.write_text("one line\none line\n" if "DUPLICATES" in args else "one line\n", encoding="utf-8")
    model = ["--options", options, "--weights", weights]
    if args == ["SWAPPED"]:
        model = ["--options", weights, "--weights", options]
    elif args == ["BOTH HDF5"]:
        model = ["--options", weights, "--weights", weights]
    elif args == ["BOTH JSON"]:
        model = ["--options", options, "--weights", options]
    elif args == []:
        model = ["--options", options]
    args = [a for a in args if a not in ("DUPLICATES", "SWAPPED", "BOTH HDF5", "BOTH JSON")]
    code = main(["embed", str(inp), str(tmp_path / "o.h5"), "--top", "--quiet", *model, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and re.search(message, err.strip()), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.slow
def test_the_closing_lines_say_what_the_run_did(tmp_path, random_models):
    options, weights = random_models("tiny")
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(_sentences(50, 6)) + "\n", encoding="utf-8")
    r = run_cli(
        "embed", inp, tmp_path / "o.h5", "--average", "--options", options, "--weights", weights, "--batch-size", 8
    )
    assert r.returncode == 0, r.stderr
    first, second = r.stderr.strip().splitlines()[-2:]
    size = os.path.getsize(tmp_path / "o.h5")
    import re

    m = re.fullmatch(
        r"elmo-fast: 50 sentences, ([0-9,]+) tokens -> (.*) \(([0-9.]+) kB\) in ([0-9.]+) s \(([0-9.]+) s to "
        r"start, ([0-9.]+) s to embed and write\)",
        first,
    )
    assert m, first
    assert m[2] == str(tmp_path / "o.h5") and abs(float(m[3]) * 1000 - size) <= 50
    wall, start, embed = map(float, m.group(4, 5, 6))
    assert start > 0.2 and abs(wall - start - embed) <= 0.02  # start-up: the interpreter, torch, the model
    assert re.fullmatch(
        r"elmo-fast: [0-9,]+ tokens/s steady \(after the first batch, [0-9.]+ s with warm-up\); "
        r"backend (fast|reference), stateless, float32, cpu",
        second,
    ), second


@pytest.mark.slow
def test_random_model_refuses_to_replace_a_model(tmp_path):
    d = tmp_path / "m"
    r = run_cli("random-model", "tiny", d, "--seed", 1)
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    r = run_cli("random-model", "tiny", d, "--seed", 2)
    assert (
        r.returncode == 2
        and r.stderr == f"elmo-fast: error: {d / 'options.json'} already exists; pass --overwrite to replace it\n"
    ), r.stderr
    (d / "options.json").unlink()
    r = run_cli("random-model", "tiny", d, "--seed", 2)
    assert r.returncode == 2 and f"{d / 'weights.hdf5'} already exists" in r.stderr
    assert {p.name: p.read_bytes() for p in d.iterdir()} == {"weights.hdf5": before["weights.hdf5"]}
    r = run_cli("random-model", "tiny", d, "--seed", 2, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == ["options.json", "weights.hdf5"]  # no temporary names left
    assert (d / "weights.hdf5").read_bytes() != before["weights.hdf5"]
    r = run_cli("random-model", "tiny", d / "options.json")
    assert r.returncode == 2 and "is a file; give the directory" in r.stderr


def test_errors_name_parameters_as_the_api_or_the_cli_spells_them():
    import pickle

    from elmo_fast.errors import ElmoFastError, InputError, Param

    e = InputError(
        "line 3 is empty (",
        Param("skip_empty", True),
        " skips it); pass ",
        Param("encoding_errors", "replace"),
        " or a smaller ",
        Param("batch_size"),
    )
    assert (
        str(e) == "line 3 is empty (skip_empty=True skips it); pass encoding_errors='replace' or a smaller batch_size"
    )
    flags = {"skip_empty": "--skip-empty", "encoding_errors": "--encoding-errors", "batch_size": "--batch-size"}
    assert (
        e.render(flags) == "line 3 is empty (--skip-empty skips it); pass --encoding-errors replace or a smaller "
        "--batch-size"
    )
    assert isinstance(e, ValueError) and isinstance(e, ElmoFastError)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is InputError and str(again) == str(e)
    assert ElmoFastError("a {brace} from user text").render(flags) == "a {brace} from user text"
    from elmo_fast.cli import build_parser

    embed_flags = build_parser().parse_args(["embed", "i", "o", "--all"]).flags
    assert {
        k: embed_flags[k]
        for k in ("options_file", "weight_file", "batch_size", "use_sentence_keys", "overwrite", "resume")
    } == {
        "options_file": "--options",
        "weight_file": "--weights",
        "batch_size": "--batch-size",
        "use_sentence_keys": "--use-sentence-keys",
        "overwrite": "--overwrite",
        "resume": "--resume",
    }


@pytest.fixture(scope="module")
def plain_stdin_case(random_models, tmp_path_factory):
    """(text with a byte-order mark, embed's flags, the output of the same text from a plain file), made once
    for both kinds of compression."""
    options, weights = random_models("tiny")
    text = ("\ufeff" + "\n".join(_sentences(30, 7)) + "\n").encode("utf-8")
    d = tmp_path_factory.mktemp("plain_stdin")
    (d / "in.txt").write_bytes(text[3:])  # without the byte-order mark: the same output
    common = ["--average", "--options", str(options), "--weights", str(weights), "--quiet"]
    r = run_cli("embed", d / "in.txt", d / "want.h5", *common)
    assert r.returncode == 0, r.stderr
    return text, common, d / "want.h5"


@pytest.mark.parametrize("kind", ["gzip", "xz"])
@pytest.mark.slow
def test_compressed_stdin(tmp_path, plain_stdin_case, kind):
    """`zcat`-less pipes: compressed bytes on stdin are recognised by their first bytes."""
    import gzip
    import lzma

    text, common, want_h5 = plain_stdin_case
    packed = (gzip.compress if kind == "gzip" else lzma.compress)(text)
    r = cli_process.run(
        [sys.executable, "-m", "elmo_fast", "embed", "-", str(tmp_path / "o.h5"), *common],
        input=packed,
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr.decode()
    with h5py.File(tmp_path / "o.h5", "r") as got, h5py.File(want_h5, "r") as want:
        assert sorted(got) == sorted(want) and got["sentence_to_index"][0] == want["sentence_to_index"][0]
        for key in want:
            if key != "sentence_to_index":
                np.testing.assert_allclose(got[key][...], want[key][...], atol=1e-5, rtol=0)
    r = cli_process.run(
        [sys.executable, "-m", "elmo_fast", "embed", "-", str(tmp_path / "cut.h5"), *common],
        input=packed[: len(packed) // 2],
        capture_output=True,
        timeout=300,
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"<stdin>: the {kind} data is corrupt or truncated after line" in err and "replace" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.h5"]


def test_a_signal_that_lands_in_a_weakref_callback_is_delivered_again():
    # A handler's exception raised inside a weakref callback (or __del__, or the garbage collector)
    # cannot propagate: Python prints "Exception ignored" and goes on. Seen in CI: a SIGTERM landed
    # in WeakValueDictionary's callback and `embed` finished with exit 0. It must still stop the run.
    import signal
    import weakref

    from elmo_fast.cli.common import Terminated, signals_as_exceptions

    class Thing:
        pass

    hook = sys.unraisablehook
    with pytest.raises(Terminated) as caught:
        with signals_as_exceptions():
            thing = Thing()
            ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGTERM))
            del thing  # the callback runs now; the handler raises in it, where the exception is lost
            for step in range(10**7):  # noqa: B007  (read after the loop)  # the signal comes again, at once, in this loop
                pass
    assert caught.value.signum == signal.SIGTERM and ref() is None and step < 10**7 - 1
    assert sys.unraisablehook is hook
    # a block that ends before the signal comes back ends with it
    with pytest.raises(Terminated):
        with signals_as_exceptions():
            thing = Thing()
            ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGTERM))
            del thing
    assert sys.unraisablehook is hook and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_write_that_fails_exits_1_naming_the_file_and_leaves_nothing(tmp_path, random_models, monkeypatch, capsys):
    """A full disk is the environment's problem, not the input's: exit status 1, as for any OSError, with
    the one line of elmo_fast.durable's WriteError."""
    import errno

    from elmo_fast import durable
    from elmo_fast.cli import main

    options, weights = random_models("tiny")
    inp = tmp_path / "in.txt"
    inp.write_text("a b\nc d e\n", encoding="utf-8")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable.file_writers, "commit", full)  # the output's fsync and rename, at the end
    code = main(
        [
            "embed",
            str(inp),
            str(tmp_path / "o.h5"),
            "--top",
            "--options",
            str(options),
            "--weights",
            str(weights),
            "--quiet",
        ]
    )
    assert code == 1
    assert capsys.readouterr().err.strip() == (
        f"elmo-fast: error: cannot write {tmp_path / 'o.h5'}: No space left on device (ENOSPC)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


# --- exit codes: 2 for what is known before any work starts, 1 for a failure during the run ---------------

#: command -> its arguments, with OUT standing for where it writes (a file, or a folder for train/random-model)
WRITERS = {
    "embed": ["embed", "IN", "OUT", "--top", "--quiet", "MODEL"],
    "embed --fasta": ["embed", "--fasta", "FASTA", "OUT", "--sum", "--quiet", "MODEL"],
    "vocab": ["vocab", "IN", "--out", "OUT"],
    "train": ["train", "--train", "IN", "--vocab", "VOCAB", "--out", "OUT", "--preset", "tiny", "--max-steps", "1"],
    "random-model": ["random-model", "tiny", "OUT"],
    "convert": ["convert", "SRC", "OUT"],
}
#: what each command's output is: "file" (OUT names a file) or "folder" (OUT names a folder it fills)
OUTPUT_KIND = {"train": "folder", "random-model": "folder", "convert": "folder"}


def _writer_args(command, tmp_path, random_models, out):
    options, weights = random_models("tiny")
    (tmp_path / "in.txt").write_text("the cat sat .\na dog ran .\n", encoding="utf-8")
    (tmp_path / "p.fasta").write_text(">p1\nMKV\n>p2\nAGW\n", encoding="utf-8")
    (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\nsat\n.\na\ndog\nran\n", encoding="utf-8")
    values = {
        "IN": str(tmp_path / "in.txt"),
        "FASTA": str(tmp_path / "p.fasta"),
        "VOCAB": str(tmp_path / "vocab.txt"),
        "SRC": str(Path(__file__).resolve().parents[1] / "fixtures" / "tf_checkpoints" / "bilm_tf_run"),
        "OUT": str(out),
    }
    args = []
    for arg in WRITERS[command]:
        args += ["--options", str(options), "--weights", str(weights)] if arg == "MODEL" else [values.get(arg, arg)]
    return args


#: where the output cannot go, found before any work: (how, the message's end). A command that writes a folder
#: makes it and its missing parents, so that a missing folder, or a folder there, is no error for it.
UNWRITABLE = {
    "its folder missing": ("missing/OUT", r"does not exist$"),
    "under a file": ("a_file/OUT", r"a_file is not a folder$"),
    "a folder (for a file)": ("a_folder", r"is a folder$"),
    "a name too long": ("x" * 300, r"file name too long \(300 bytes; at most \d+ here\)$"),
}
UNWRITABLE_CASES = [
    (command, where)
    for command in WRITERS
    for where in UNWRITABLE
    if OUTPUT_KIND.get(command) != "folder" or where in ("under a file", "a name too long")
]


@pytest.mark.parametrize("command,where", UNWRITABLE_CASES)
def test_an_output_that_cannot_be_written_exits_2_before_any_work(command, where, tmp_path, random_models, capsys):
    """The output's place is an argument like any other: a missing folder, a file in the way, a folder where
    a file goes, a name the filesystem refuses are refused before the model loads or the corpus is read, with
    exit status 2 (docs/embedding.md, Exit codes), and nothing is written."""
    import re

    from elmo_fast.cli import main

    how, message = UNWRITABLE[where]
    work = tmp_path / "work"
    work.mkdir()
    (work / "a_file").write_text("not a folder")
    (work / "a_folder").mkdir()
    out = work / how.replace("OUT", "out.h5" if OUTPUT_KIND.get(command) != "folder" else "model")
    args = _writer_args(command, tmp_path, random_models, out)
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("elmo-fast: error: cannot write "), err
    assert re.search(message, err.strip()), err
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before


@pytest.mark.parametrize("command", ["embed", "vocab", "random-model"])
def test_a_write_that_fails_during_the_run_exits_1(command, tmp_path, random_models, monkeypatch, capsys):
    """The same commands, their arguments fine, and the disk full when the finished output is fsync'ed (a
    delayed write's ENOSPC): a failure during the run, exit status 1, one line naming the file, nothing left."""
    import errno

    from elmo_fast.cli import main

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "work" / ("model" if OUTPUT_KIND.get(command) == "folder" else "out.h5")
    out.parent.mkdir()
    args = _writer_args(command, tmp_path, random_models, out)
    monkeypatch.setattr(os, "fsync", full)
    code = main(args)
    err = capsys.readouterr().err
    assert code == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("elmo-fast: error: cannot write "), err
    assert err.strip().endswith("No space left on device (ENOSPC)"), err
    assert [p for p in out.parent.rglob("*") if p.is_file()] == []
