"""Every failure point of a small run of each command that writes files, injected below Python
(tests/support/faults/fault_shim.c: the Nth write, fsync, ftruncate or close under the output's folder fails
with ENOSPC for the rest of the run, as a full disk, or EIO once), and a size-limited filesystem
(RLIMIT_FSIZE). After every fault: the correct complete output or none; a failed run says so in one
line naming the file and the OS error, and exits non-zero; no crash; no temporary file left (a
resumable run's saved windows excepted: --resume then ends with the clean run's output).

Each test runs one child process that tries every point in turn (a process per point would cost a
Python and torch start-up each)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import cli_process
import pytest
from repo_paths import FIXTURES

FIX = FIXTURES / "tf_checkpoints"

# The child's side: run a command in-process with the shim armed at each point; judge each outcome.
_DRIVER = r'''
import contextlib, hashlib, io, json, os, shutil, sys
import h5py, numpy as np
from elmo_fast import durable
from elmo_fast.cli import main

folder = sys.argv[1]
ARGS = json.loads(sys.argv[2])

# No token cache: a resumed run then computes each window's tokens in the batches a clean run does, and
# the outputs are equal bit for bit (a cached token's vector may round differently, by ~1e-7).
import elmo_fast.embedding.embedder as _embedder_module


class _NoCacheEmbedder(_embedder_module.ElmoEmbedder):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("token_cache_mb", 0)
        super().__init__(*args, **kwargs)


_embedder_module.ElmoEmbedder = _NoCacheEmbedder


def cli(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def content(path):
    """What a file holds, to compare outputs: HDF5 datasets and attributes, other files' bytes."""
    if path.endswith((".h5", ".hdf5")):
        with h5py.File(path, "r") as f:
            out = {"attrs": sorted((k, str(v)) for k, v in f.attrs.items())}
            f.visititems(lambda n, o: out.__setitem__(n, repr(o[...].tolist()) if o.dtype.kind == "O" else
                                                      (o.dtype.str, o.shape, o[...].tobytes()))
                         if isinstance(o, h5py.Dataset) else None)
        return hashlib.sha256(repr(sorted(out.items())).encode()).hexdigest()
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def snapshot(directory):
    """name -> content of every file under directory (folders recursed), unreadable ones as None."""
    out = {}
    for root, _, names in os.walk(directory):
        for n in names:
            p = os.path.join(root, n)
            try:
                out[os.path.relpath(p, directory)] = content(p)
            except Exception:
                out[os.path.relpath(p, directory)] = None
    return out


def empty(directory):
    for n in os.listdir(directory):
        p = os.path.join(directory, n)
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)


def every_point(argv, after=None, judge_final=True):
    """Run argv once clean (counting its failure points), then once per point and errno; judge each.
    after(case, code, message, files, bad): more checks (a --resume that must finish the work).
    judge_final: a failed run leaves under a final name only what the clean run writes there (off
    where after() judges it: a run over an earlier output must leave that)."""
    empty(folder)
    Shim.arm(folder, 0, 0)
    code, err = cli(argv)
    total = Shim.count()
    Shim.disarm()
    assert code == 0, err
    want = snapshot(folder)
    bad, tried, failed = [], 0, 0
    for err_no, sticky in ((errno.ENOSPC, True), (errno.EIO, False)):
        if errno.errorcode[err_no] not in ARGS.get("errnos", ("ENOSPC", "EIO")):
            continue
        for nth in range(1, total + 1):
            empty(folder)
            Shim.arm(folder, nth, err_no, sticky)
            code, message = cli(argv)
            fired = Shim.fired()
            Shim.disarm()
            tried += 1
            case = (errno.errorcode[err_no], nth)
            files = snapshot(folder)
            if not fired:
                bad.append((case, "the fault never fired"))
            if code < 0 or code > 128:
                bad.append((case, f"exit code {code}"))
            if "Traceback" in message or "Exception ignored" in message:
                bad.append((case, "traceback: " + message[-800:]))
            temps = [n for n in files if n.endswith(durable.TEMP_SUFFIX) or n.endswith(".elmo-lock")]
            if temps:
                bad.append((case, f"left behind: {temps}"))
            if code == 0:
                if files != want:
                    differ = sorted(n for n in set(files) | set(want) if files.get(n) != want.get(n))
                    bad.append((case, f"exit 0 but not the clean run's files: {differ} differ"))
            else:
                failed += 1
                lines = message.strip().splitlines()
                if not (len(lines) == 1 and lines[0].startswith("elmo-fast: error: cannot write ")
                        and folder in lines[0] and errno.errorcode[err_no] in lines[0]):
                    bad.append((case, "message: " + message[-800:]))
                for name, digest in files.items() if judge_final else ():  # a final name: the clean run's
                    if not name.endswith(".partial") and ".partial/" not in name and want.get(name) != digest:
                        bad.append((case, f"{name} under its final name differs from the clean run's "
                                          f"({'unreadable' if digest is None else 'another content'})"))
            if after is not None:
                after(case, code, message, files, bad)
    print(json.dumps({"total": total, "tried": tried, "failed": failed, "bad": bad[:20], "n_bad": len(bad)}))
    return want
'''


@pytest.fixture
def out(tmp_path):
    """The folder the faults are injected under: in memory where there is a tmpfs (its fsync costs
    nothing, and a run has ~20 of them), else on disk."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="elmo-fast-faults-", dir="/dev/shm"))
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
    else:
        folder = tmp_path / "out"
        folder.mkdir()
        yield folder


def _run_child(body: str, folder: Path, args: dict, timeout: float = 600):
    from fault_injection import CHILD_PRELUDE, run_python

    r = run_python(CHILD_PRELUDE + _DRIVER + textwrap.dedent(body), str(folder), json.dumps(args), timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["n_bad"] == 0, report["bad"]
    assert report["tried"] == len(args.get("errnos", "xx")) * report["total"]
    # nearly every point fails the run (a lock's own record aside, which only words the next run's message)
    assert report["failed"] >= report["tried"] - 4, report
    return report


def _sentences(n: int) -> list[str]:
    import random

    rng = random.Random(n)
    words = ["the", "cat", "sat", "on", "a", "mat", ".", "Über", "東京", "x" * 60]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(n)]


@pytest.fixture(scope="module")
def job(random_models, tmp_path_factory):
    d = tmp_path_factory.mktemp("fault_job")
    (d / "in5.txt").write_text("\n".join(_sentences(5)) + "\n", encoding="utf-8")
    (d / "in3.txt").write_text("\n".join(_sentences(3)) + "\n", encoding="utf-8")
    options, weights = random_models("tiny")
    return {"in5": str(d / "in5.txt"), "in3": str(d / "in3.txt"), "model": str(Path(options).parent)}


@pytest.mark.slow
def test_embed_plain_output_at_every_failure_point(job, out):
    report = _run_child(
        """
        every_point(["embed", ARGS["in5"], os.path.join(folder, "o.h5"), "--all", "--model-dir", ARGS["model"],
                     "--batch-size", "2", "--window", "2", "--quiet"])
    """,
        out,
        job,
    )
    assert report["total"] >= 30, report


@pytest.mark.parametrize("error", ["ENOSPC", "EIO"])  # one child each: ~250 runs in all
@pytest.mark.slow
def test_embed_resumable_at_every_failure_point_then_resume(job, out, error):
    report = _run_child(
        '''
        # two windows (two shards, their records, the manifest, the assembled output)
        argv = ["embed", ARGS["in3"], os.path.join(folder, "o.h5"), "--all", "--model-dir", ARGS["model"],
                "--batch-size", "2", "--window", "2", "--quiet", "--resume"]
        clean = {}

        def resume_ends_it(case, code, message, files, bad):
            """After the fault, the same command on a healthy disk finishes the work: the clean output."""
            code, message = cli(argv)
            if code != 0:
                bad.append((case, "the resume failed: " + message[-800:]))
            elif snapshot(folder) != clean["files"]:
                bad.append((case, "the resume did not give the clean run's files: " + str(sorted(snapshot(folder)))))

        empty(folder)
        assert cli(argv)[0] == 0
        clean["files"] = snapshot(folder)
        every_point(argv, after=resume_ends_it)
    ''',
        out,
        {**job, "errnos": [error]},
    )
    assert report["total"] >= 100, report


@pytest.mark.slow
def test_random_model_at_every_failure_point(out):
    _run_child(
        """
        every_point(["random-model", "tiny", os.path.join(folder, "model"), "--seed", "3"])
    """,
        out,
        {},
    )


@pytest.mark.slow
def test_random_model_overwrite_keeps_the_old_model_or_writes_the_new_one_whole(out):
    """Over an earlier model: never the new weights beside the old options (or the other way round)."""
    _run_child(
        """
        model = os.path.join(folder, "model")
        argv = ["random-model", "tiny", model, "--seed", "3", "--overwrite"]
        old = {}
        real_empty = empty

        def old_or_new(case, code, message, files, bad):
            # the new model whole is possible after a failure too: when the folder's fsync fails after
            # the renames (the error says the renames may not last); never a mix
            if code != 0 and files not in (old["files"], old["new"]):
                bad.append((case, f"the failed run mixed the models: {sorted(files)}"))

        real_empty(folder)
        assert cli(["random-model", "tiny", model, "--seed", "1"])[0] == 0
        saved = {n: open(os.path.join(model, n), "rb").read() for n in os.listdir(model)}

        def write_old():  # the earlier model's files, as they were (quicker than writing it again)
            real_empty(folder)
            os.mkdir(model)
            for n, data in saved.items():
                with open(os.path.join(model, n), "wb") as f:
                    f.write(data)

        write_old()
        old["files"] = snapshot(folder)
        assert cli(argv)[0] == 0
        old["new"] = snapshot(folder)
        assert old["new"]["model/weights.hdf5"] != old["files"]["model/weights.hdf5"]
        real_empty = empty
        empty = lambda d: write_old()  # every try starts from the earlier model
        every_point(argv, after=old_or_new, judge_final=False)
    """,
        out,
        {},
    )


@pytest.mark.slow
def test_convert_at_every_failure_point(out):
    """A bilm-tf run with its softmax and vocabulary: every file convert writes but a TF-Hub module's
    scalar mix (JSON, as options.json)."""
    _run_child(
        """
        every_point(["convert", ARGS["src"], os.path.join(folder, "model"), "--vocab", ARGS["vocab"]])
    """,
        out,
        {"src": str(FIX / "bilm_tf_run"), "vocab": str(FIX / "vocab.txt")},
    )


# --- a filesystem that fills up: RLIMIT_FSIZE ------------------------------------------------------------

_FSIZE = r"""
import contextlib, io, json, os, resource, signal, sys
from elmo_fast.cli import main

folder, inp, model, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
results = []
for extra in ([], ["--resume"]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["embed", inp, os.path.join(folder, "o.h5"), "--all", "--model-dir", model, "--quiet",
                     "--window", "8", *extra])
    results.append({"code": code, "err": err.getvalue(), "files": sorted(os.listdir(folder))})
print(json.dumps(results))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as Linux has them")
@pytest.mark.slow
def test_a_size_limited_filesystem_is_a_one_line_error_and_no_output(job, tmp_path):
    """Files may not grow past 24 KiB (as on a full quota); the output would be ~200 KiB."""
    import resource

    if (
        resource.getrlimit(resource.RLIMIT_FSIZE)[1] not in (resource.RLIM_INFINITY,)
        and resource.getrlimit(resource.RLIMIT_FSIZE)[1] < 24 << 10
    ):
        pytest.skip("the hard RLIMIT_FSIZE is already below the test's limit")
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(_sentences(60)) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    r = cli_process.run(
        [sys.executable, "-c", _FSIZE, str(out), str(inp), job["model"], str(24 << 10)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    plain, resumable = json.loads(r.stdout.strip().splitlines()[-1])
    for result in (plain, resumable):
        lines = result["err"].strip().splitlines()
        assert result["code"] == 1 and len(lines) == 1, result
        assert lines[0].startswith(f"elmo-fast: error: cannot write {out}") and "File too large (EFBIG)" in lines[0]
    assert plain["files"] == [], plain
    # the resumable run keeps the windows it completed (small enough), and nothing else
    assert resumable["files"] in ([], ["o.h5.partial"]), resumable
    assert "o.h5" not in resumable["files"]
