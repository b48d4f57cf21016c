"""Models on the Hugging Face Hub (--model hf:OWNER/REPO[@REVISION][/SUBFOLDER]) through the real
huggingface_hub, pointed with HF_ENDPOINT at a Hub endpoint on 127.0.0.1 (tests/support/hub_server.py),
or at nothing with HF_HUB_OFFLINE=1 and a Hub cache filled beforehand. huggingface_hub reads its
environment when imported, so each case runs as users run it: a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cli_process
import h5py
import numpy as np
import pytest

pytest.importorskip("huggingface_hub", reason="the Hub tests need the [hub] extra: pip install 'elmo-fast[hub]'")

from hub_server import HubServer  # noqa: E402
from manylangs_models import write_variant  # noqa: E402

from elmo_fast import ElmoEmbedder  # noqa: E402

SENTENCE = ["The", "cat", "sat", "."]
LONG = "elmo_2x4096_512_2048cnn_2xhighway"


def _run(env: dict, *args: str, stdin: str | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "elmo_fast"]
    return cli_process.run(
        [*command, *args], input=stdin, capture_output=True, text=True, env=env, timeout=300, cwd=env["HOME"]
    )


@pytest.fixture
def hub():
    with HubServer() as hub:
        yield hub


@pytest.fixture
def env(tmp_path, hub) -> dict:
    """A user's environment: the Hub at the test endpoint, a fresh Hub cache and elmo-fast cache."""
    home = tmp_path / "home"
    home.mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "ELMO_FAST_CACHE"))}
    return {
        **keep,
        "HOME": str(home),
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "ELMO_FAST_CACHE": str(tmp_path / "elmo_fast"),
    }


@pytest.fixture
def tiny(random_models) -> dict[str, bytes]:
    options, weights = random_models("tiny")
    return {"options.json": Path(options).read_bytes(), "weights.hdf5": Path(weights).read_bytes()}


def _vectors(options: bytes, weights: bytes, tmp_path: Path) -> np.ndarray:
    d = tmp_path / f"local-{len(list(tmp_path.glob('local-*')))}"
    d.mkdir()
    (d / "options.json").write_bytes(options)
    (d / "weights.hdf5").write_bytes(weights)
    return ElmoEmbedder(d / "options.json", d / "weights.hdf5").embed_sentence(SENTENCE)


def _embed(env: dict, tmp_path: Path, model: str, name: str) -> subprocess.CompletedProcess:
    return _run(env, "embed", "-", str(tmp_path / name), "--all", "--model", model, stdin=" ".join(SENTENCE) + "\n")


@pytest.mark.slow
def test_a_mirror_in_bilm_tf_layout_embeds_as_its_files_do_then_offline(hub, env, tiny, tmp_path):
    """lysandre/elmo-2x4096_512_2048cnn_2xhighway's layout: options.json + weights.hdf5 beside a README.
    Only the model's two files are downloaded; offline, the same command makes no request."""
    hub.add("lysandre/elmo-tiny", {**tiny, "README.md": b"# a mirror\n", "extra/big.bin": b"\0" * 1000})
    r = _embed(env, tmp_path, "hf:lysandre/elmo-tiny", "online.h5")
    assert r.returncode == 0, r.stderr
    assert sorted(p.rsplit("/", 1)[1] for p in hub.downloads()) == ["options.json", "weights.hdf5"]
    expected = _vectors(tiny["options.json"], tiny["weights.hdf5"], tmp_path)
    with h5py.File(tmp_path / "online.h5") as f:
        np.testing.assert_allclose(f["0"][()], expected, atol=1e-6)

    commit = hub.repos["lysandre/elmo-tiny"].refs["main"]
    record = json.loads(
        (Path(env["ELMO_FAST_CACHE"]) / "hub" / "lysandre--elmo-tiny" / commit / "record.json").read_text()
    )
    assert record["spec"] == "hf:lysandre/elmo-tiny"
    assert record["source"] == {
        "kind": "hub",
        "repo": "lysandre/elmo-tiny",
        "revision": "main",
        "commit": commit,
        "subfolder": "",
        "endpoint": hub.url,
    }
    assert [(f["role"], f["size"]) for f in record["files"]] == [
        ("options", len(tiny["options.json"])),
        ("weights", len(tiny["weights.hdf5"])),
    ]
    assert record["verified"] is not None

    before = len(hub.requests)
    r = _embed({**env, "HF_HUB_OFFLINE": "1"}, tmp_path, "hf:lysandre/elmo-tiny", "offline.h5")
    assert r.returncode == 0, r.stderr
    assert hub.requests[before:] == []
    with h5py.File(tmp_path / "offline.h5") as f:
        np.testing.assert_allclose(f["0"][()], expected, atol=1e-6)


_EMBED_EACH = """
import json, sys
from elmo_fast import ElmoEmbedder
out = {}
for model in sys.argv[1:]:
    out[model] = ElmoEmbedder(model=model).embed_sentence(["The", "cat", "sat", "."]).tolist()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_layout_and_revision_through_elmo_embedder(hub, env, tiny, random_models, tmp_path):
    """allennlp's long names, SeqVec's uniref50_v2/ folder, an ELMoForManyLangs directory in a subfolder,
    a tag and a commit, each through ElmoEmbedder(model=...)."""
    other_options, other_weights = (Path(p).read_bytes() for p in random_models("tiny", seed=1))
    repo = hub.add("allenai/elmo-long", {f"{LONG}_options.json": other_options, f"{LONG}_weights.hdf5": other_weights})
    old = repo.refs["main"]
    repo.refs["v1"] = old
    repo.commit({f"{LONG}_options.json": tiny["options.json"], f"{LONG}_weights.hdf5": tiny["weights.hdf5"]})
    hub.add(
        "rostlab/seqvec",
        {"uniref50_v2/options.json": tiny["options.json"], "uniref50_v2/weights.hdf5": tiny["weights.hdf5"]},
    )
    many = write_variant("words+chars", tmp_path / "many")
    hub.add("hit-scir/elmo", {f"zh/{p.name}": p.read_bytes() for p in many.iterdir()} | {"README.md": b"x"})

    models = ["hf:allenai/elmo-long", "hf:allenai/elmo-long@v1", f"hf:allenai/elmo-long@{old}", "hf:rostlab/seqvec"]
    models.append("hf:hit-scir/elmo/zh")
    r = _run(env, *models, code=_EMBED_EACH)
    assert r.returncode == 0, r.stderr
    got = {k: np.array(v) for k, v in json.loads(r.stdout).items()}
    new = _vectors(tiny["options.json"], tiny["weights.hdf5"], tmp_path)
    older = _vectors(other_options, other_weights, tmp_path)
    np.testing.assert_allclose(got["hf:allenai/elmo-long"], new, atol=1e-6)
    np.testing.assert_allclose(got["hf:allenai/elmo-long@v1"], older, atol=1e-6)
    np.testing.assert_allclose(got[f"hf:allenai/elmo-long@{old}"], older, atol=1e-6)
    np.testing.assert_allclose(got["hf:rostlab/seqvec"], new, atol=1e-6)
    np.testing.assert_allclose(got["hf:hit-scir/elmo/zh"], ElmoEmbedder(many).embed_sentence(SENTENCE), atol=1e-6)
    assert not any(p.endswith("README.md") for p in hub.downloads())


_PREFILL = """
import sys
from huggingface_hub import hf_hub_download
for name in sys.argv[2:]:
    hf_hub_download(sys.argv[1], name)
"""


@pytest.mark.slow
def test_offline_with_a_prefilled_hub_cache_and_without_one(env, hub, tiny, tmp_path):
    """HF_HUB_OFFLINE=1, or a Hub that cannot be reached: the files huggingface_hub itself put in its cache
    are used with no network (the endpoint is gone); a repository not there is a one-line error naming the
    command that fetches it."""
    hub.add("someone/elmo", tiny)
    r = _run(env, "someone/elmo", "options.json", "weights.hdf5", code=_PREFILL)
    assert r.returncode == 0, r.stderr
    offline = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = _embed(offline, tmp_path, "hf:someone/elmo", "o.h5")
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "o.h5") as f:
        np.testing.assert_allclose(
            f["0"][()], _vectors(tiny["options.json"], tiny["weights.hdf5"], tmp_path), atol=1e-6
        )

    unreachable = {k: v for k, v in offline.items() if k != "HF_HUB_OFFLINE"}  # no network, and not told so
    r = _run(unreachable, "models", "fetch", "hf:someone/elmo", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].startswith(f"weights\t{env['HF_HOME']}/hub/models--someone--elmo/snapshots/")

    r = _embed(offline, tmp_path, "hf:someone/elsewhere@v2/uniref50_v2", "x.h5")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(
        f"elmo-fast: error: hf:someone/elsewhere@v2/uniref50_v2: not in the Hugging Face cache "
        f"({env['HF_HOME']}/hub) and HF_HUB_OFFLINE is set; where there is a network, fetch it with "
        "`hf download someone/elsewhere uniref50_v2/options.json uniref50_v2/weights.hdf5 --revision v2`"
    )
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.slow
def test_a_private_repository_needs_its_token(env, hub, tiny):
    hub.add("me/private-elmo", tiny, token="hf_secret")
    r = _run(env, "models", "fetch", "hf:me/private-elmo")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(
        f"elmo-fast: error: hf:me/private-elmo: no such repository at {hub.url}, or it is private or gated and "
        "this token may not read it (set HF_TOKEN"
    )
    r = _run({**env, "HF_TOKEN": "hf_secret"}, "models", "fetch", "hf:me/private-elmo", "--quiet")
    assert r.returncode == 0, r.stderr
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == ["options", "weights"]


@pytest.mark.slow
def test_a_damaged_download_is_named_and_fetched_again(env, hub, tiny):
    """The Hub's digest of a file (its LFS SHA-256) against the bytes that arrived."""
    repo = hub.add("o/r", tiny)
    hub.corrupt.add("weights.hdf5")
    r = _run(env, "models", "fetch", "hf:o/r", "--quiet")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    import hashlib

    expected = hashlib.sha256(tiny["weights.hdf5"]).hexdigest()
    commit = repo.refs["main"]
    assert "weights.hdf5: SHA-256 " in r.stderr
    assert (
        f"does not match {expected}, the Hub's digest of o/r/weights.hdf5 at {commit}; fetch it again with " in r.stderr
    )
    assert r.stderr.rstrip().endswith("`elmo-fast models fetch hf:o/r --force`")
    hub.corrupt.clear()
    r = _run(env, "models", "fetch", "hf:o/r", "--force", "--quiet")
    assert r.returncode == 0, r.stderr
    r = _run(env, "models", "verify", "hf:o/r")
    assert r.returncode == 0 and r.stdout.startswith("ok  hf:o/r: 2 files"), r.stderr


@pytest.mark.slow
def test_without_the_extra_the_error_names_it(env):
    code = "import sys; sys.modules['huggingface_hub'] = None\nfrom elmo_fast.cli import main\nsys.exit(main())"
    r = _run(env, "embed", "-", "o.h5", "--top", "--model", "hf:o/r", code=code, stdin="a\n")
    assert r.returncode == 2
    assert r.stderr == (
        "elmo-fast: error: a model on the Hugging Face Hub needs huggingface_hub: pip install 'elmo-fast[hub]'\n"
    )
