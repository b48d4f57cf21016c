"""Every fetched file verified (elmo_fast.pretrained.records): sizes and SHA-256 recorded at download,
sizes checked on every load, digests on the first load after a download and by `models verify`; models
by pinned URL; one download when two processes fetch the same model. Served from 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cli_process
import pytest
from file_server import FileServer

from elmo_fast.cli import main
from elmo_fast.errors import DownloadError, ModelFileError
from elmo_fast.pretrained import MODELS, fetch, fetch_model
from elmo_fast.pretrained.records import read_record, write_record

OPTIONS_REL, WEIGHTS_REL = MODELS["small"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ELMO_FAST_CACHE", str(cache))
    return cache


@pytest.fixture
def remote(tmp_path, random_models) -> Path:
    """A web server's folder holding the official 'small' model (random tiny weights) and a folder
    'mine/' as a model by URL is laid out."""
    options, weights = random_models("tiny")
    root = tmp_path / "remote"
    for src, rel in ((options, OPTIONS_REL), (weights, WEIGHTS_REL), (options, "mine/options.json")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / rel)
    shutil.copy(weights, root / "mine" / "weights.hdf5")
    return root


@pytest.fixture
def server(remote, monkeypatch):
    with FileServer(remote) as server:
        monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)
        yield server


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_download_records_each_file_and_is_verified_at_once(server, remote, cache):
    options, weights = fetch_model("small", progress=False)
    record = json.loads((cache / "small" / "record.json").read_text())
    assert record["spec"] == "small" and record["source"] == {"kind": "s3", "name": "small", "base_url": server.url}
    assert [(f["role"], f["path"]) for f in record["files"]] == [
        ("options", "options.json"),
        ("weights", "weights.hdf5"),
    ]
    for f, rel in zip(record["files"], (OPTIONS_REL, WEIGHTS_REL)):
        assert f["size"] == (remote / rel).stat().st_size and f["sha256"] == _sha(remote / rel)
        assert f["origin"] == f"{server.url}/{rel}"
    assert record["verified"] is not None and record["verified"] >= record["recorded"]
    assert fetch_model("small", progress=False) == (options, weights)
    assert len(server.gets()) == 2  # the second load: no request, the record unchanged
    assert json.loads((cache / "small" / "record.json").read_text()) == record


def test_a_file_of_another_size_is_refused_on_load_naming_the_command_that_fetches_it(server, remote, cache):
    _, weights = fetch_model("small", progress=False)
    expected = weights.stat().st_size
    with open(weights, "ab") as f:
        f.write(b"x")
    with pytest.raises(ModelFileError) as info:
        fetch_model("small", progress=False)
    message = str(info.value)
    assert message == (
        f"{weights}: {expected + 1} bytes, but {expected} were recorded when it was fetched from "
        f"{server.url}/{WEIGHTS_REL}: the file changed or is damaged; fetch it again with "
        "`elmo-fast models fetch small --force`"
    )
    assert main(["models", "fetch", "small", "--force", "--quiet"]) == 0
    assert _sha(weights) == _sha(remote / WEIGHTS_REL) and len(server.gets()) == 4
    fetch_model("small", progress=False)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_models_verify_checks_the_digests(server, remote, cache, capsys):
    _, weights = fetch_model("small", progress=False)
    before = read_record(cache / "small").verified
    time.sleep(0.01)
    assert main(["models", "verify"]) == 0
    assert "ok  small: 2 files, sizes and SHA-256 as recorded" in capsys.readouterr().out
    assert read_record(cache / "small").verified > before

    _flip_a_byte(weights)  # the same size: a load still passes, the digest does not
    fetch_model("small", progress=False)
    assert main(["models", "verify", "small"]) == 1
    err = capsys.readouterr().err.strip()
    expected, found = _sha(remote / WEIGHTS_REL), _sha(weights)
    assert err == (
        f"elmo-fast: error: {weights}: SHA-256 {found} ({weights.stat().st_size} bytes) does not match {expected} "
        f"({weights.stat().st_size} bytes), recorded when it was fetched from {server.url}/{WEIGHTS_REL}; fetch it "
        "again with `elmo-fast models fetch small --force`"
    )
    assert main(["models", "verify", "medium"]) == 2
    assert "no model 'medium' in the cache" in capsys.readouterr().err


def test_the_first_load_after_a_download_checks_the_digests(server, cache):
    """A record written at download and not yet checked (the fetching process was stopped just after):
    the next load hashes the files."""
    _, weights = fetch_model("small", progress=False)
    record = read_record(cache / "small")
    write_record(record.__class__(**{**record.__dict__, "verified": None}))
    _flip_a_byte(weights)
    with pytest.raises(ModelFileError, match=r"weights.hdf5: SHA-256 [0-9a-f]{64} \(\d+ bytes\) does not match"):
        fetch_model("small", progress=False)


def test_files_put_in_the_cache_by_hand_are_recorded_as_found(remote, cache, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_BASE_URL", "http://127.0.0.1:9")  # nothing is fetched
    (cache / "small").mkdir(parents=True)
    shutil.copy(remote / OPTIONS_REL, cache / "small" / "options.json")
    shutil.copy(remote / WEIGHTS_REL, cache / "small" / "weights.hdf5")
    fetch_model("small", progress=False)
    record = read_record(cache / "small")
    assert {f.origin for f in record.files} == {"found in the cache"} and record.verified is not None


def test_a_model_by_url_is_pinned(server, remote, cache):
    pin = _sha(remote / "mine" / "weights.hdf5")
    local = fetch(f"{server.url}/mine/#sha256={pin}", progress=False)
    assert local.files["weights"].parent.parent == cache / "url"
    assert _sha(local.files["weights"]) == pin
    record = read_record(local.directory)
    assert record.source == {"kind": "url", "url": f"{server.url}/mine", "sha256": pin}

    wrong = "0" * 64
    with pytest.raises(DownloadError) as info:
        fetch(f"{server.url}/mine#sha256={wrong}", progress=False)
    assert str(info.value).startswith(f"{server.url}/mine/weights.hdf5: SHA-256 {pin} does not match the pin {wrong} (")
    assert "fetch it again with `elmo-fast models fetch" in str(info.value)
    folders = [p for p in (cache / "url").iterdir() if p != local.directory]
    assert [sorted(q.name for q in f.iterdir()) for f in folders] == [["options.json"]]  # the weights not kept


def test_models_list_shows_each_cached_model(server, remote, cache, capsys):
    fetch_model("small", progress=False)
    pin = _sha(remote / "mine" / "weights.hdf5")
    fetch(f"{server.url}/mine#sha256={pin}", progress=False)
    assert main(["models", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    by_name = {m["name"]: m for m in listing["models"]}
    assert list(by_name) == ["default", "small", f"{server.url}/mine#sha256={pin}"]
    assert by_name["default"]["source"] == {"kind": "bundled"}
    assert by_name["small"]["source"]["kind"] == "s3" and by_name["small"]["verified"] is not None
    assert [f["sha256"] for f in by_name["small"]["files"]] == [_sha(remote / OPTIONS_REL), _sha(remote / WEIGHTS_REL)]
    assert main(["models", "list"]) == 0
    text = capsys.readouterr().out
    assert f"small  S3 ({server.url})" in text and "URL " + server.url + "/mine (weights pinned by SHA-256)" in text
    assert "last verified 20" in text and _sha(remote / WEIGHTS_REL) in text


_FETCH_WHEN_TOLD = """
import sys, time
from pathlib import Path
from elmo_fast.pretrained import fetch_model
print("ready", flush=True)
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.005)
print(*fetch_model("small", progress=True))
"""


@pytest.mark.slow
def test_two_processes_fetching_one_model_download_it_once(remote, tmp_path):
    """Two processes (Ray actors, torchrun ranks) fetch the same model at the same moment from a slow
    server: one downloads, the other waits for it, then loads the same files."""
    go = tmp_path / "go"
    with FileServer(remote, delay=1.5) as server:
        env = {**os.environ, "ELMO_FAST_CACHE": str(tmp_path / "cache"), "ELMO_FAST_BASE_URL": server.url}
        procs = [
            cli_process.Popen(
                [sys.executable, "-c", _FETCH_WHEN_TOLD, str(go)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
        requests = server.gets()
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    assert sorted(requests) == sorted(["/" + OPTIONS_REL, "/" + WEIGHTS_REL])  # once each
    assert results[0][0] == results[1][0]
    # the holder named by its PID, or (caught between taking the lock and writing its PID) as such
    waited = [err for _, err in results if "ELMo model 'small' is being fetched by " in err]
    assert len(waited) == 1, [err for _, err in results]
    assert re.search(r"fetched by (PID \d+|a process that has not yet written its PID)", waited[0]), waited[0]
    assert "waiting for it" in waited[0]


def test_serve_and_finetune_take_a_model_by_url(server, remote, cache, tmp_path):
    """The same names everywhere a model is named: serve's model flags, finetune --model (a model with no
    softmax.hdf5 starts a new softmax, as from --model-dir)."""
    import argparse

    from elmo_fast.cli.serve import model_source

    spec = f"{server.url}/mine#sha256={_sha(remote / 'mine' / 'weights.hdf5')}"
    args = argparse.Namespace(model=spec, model_dir=None, model_format=None, options=None, weights=None)
    model, name = model_source(args)
    assert name == spec and _sha(model["weight_file"]) == _sha(remote / "mine" / "weights.hdf5")

    (tmp_path / "train.txt").write_text("the cat sat on the mat .\na dog sat .\n" * 8)
    (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\nsat\non\nmat\n.\na\ndog\n")
    flags = ["--train", tmp_path / "train.txt", "--out", tmp_path / "ft", "--vocab", tmp_path / "vocab.txt"]
    flags += ["--max-steps", 2, "--batch-size", 4, "--negative-samples", 4, "--softmax-warmup", 1, "--quiet"]
    assert main(["finetune", "--model", spec, *map(str, flags)]) == 0
    assert (tmp_path / "ft" / "weights.hdf5").is_file()
    assert main(["finetune", "--model", "https://example.org/m", *map(str, flags)]) == 2
