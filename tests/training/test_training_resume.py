"""Resuming a training run only when it is the same run, and never from nothing by accident: the
vocabulary, corpus and settings compared with the checkpoint's record; unreadable checkpoints;
a damaged metrics log; killed runs' leftovers swept; the output directory's lock."""

from __future__ import annotations

import json
import os
import shutil
import sys

import cli_process
import pytest
import torch
from training_runs import final_tensors, mini_config, mini_inputs, same_tensors

from elmo_fast.durable import host_tag
from elmo_fast.errors import InputError
from elmo_fast.run_lock import RunLock, RunLocked
from elmo_fast.training.trainer import Trainer


def _flags() -> dict[str, str]:
    from elmo_fast.cli import build_parser

    return build_parser().parse_args(["train", "--train", "t", "--vocab", "v", "--out", "o"]).flags


@pytest.fixture
def inputs(tmp_path):
    return mini_inputs(tmp_path / "inputs")


def _train(inputs, out, resume=False, **kw):
    """Run the mini run; returns what it logged."""
    notes: list[str] = []
    options = {k: kw.pop(k) for k in ("overwrite", "allow_changed") if k in kw}
    Trainer(mini_config(inputs, out, **kw), log=notes.append).run(resume=resume, **options)
    return notes


def _dead_pid() -> int:
    return int(
        cli_process.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )


# ---- the same run, or a refusal naming what changed --------------------------------------------


def test_a_changed_vocabulary_is_refused_naming_it_and_the_override(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    words = open(inputs["vocab"]).read().split("\n")
    words[3], words[4] = words[4], words[3]  # the same size, other ids
    open(inputs["vocab"], "w").write("\n".join(words))
    with pytest.raises(InputError) as info:
        _train(inputs, out, resume=True)
    api, cli = str(info.value), info.value.render(_flags())
    assert "\n" not in api and f"cannot resume: the vocabulary changed ({inputs['vocab']}: " in api
    assert api.endswith(
        "another out, or allow_changed=True to continue with these (the model then comes from two different runs)"
    )
    assert cli.endswith(
        "another --out, or --resume-anyway to continue with these (the model then comes from two different runs)"
    )
    notes = _train(inputs, out, allow_changed=True)  # implies resume
    assert any(n.startswith("elmo-fast: resuming although the vocabulary changed") for n in notes), notes
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.slow
def test_a_changed_corpus_is_refused_and_a_moved_one_is_not(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    moved = tmp_path / "moved.txt"
    shutil.copy(inputs["train"], moved)
    _train(inputs, out, resume=True, train=[str(moved)])  # the same bytes under another name: the same run
    size = moved.stat().st_size
    with open(moved, "a") as f:
        f.write("the cat sees a dog\n")
    with pytest.raises(
        InputError,
        match=rf"the training corpus changed \({moved}: {size:,} bytes then, "
        rf"{size + 19:,} now\); use the same",
    ):
        _train(inputs, out, resume=True, train=[str(moved)], max_steps=3)
    extra = tmp_path / "extra.txt"
    extra.write_text("a big bird\n")
    with pytest.raises(InputError, match=rf"the training corpus changed \({extra} is new\)"):
        _train(inputs, out, resume=True, train=[inputs["train"], str(extra)], max_steps=3)


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"seed": 2}, "seed: 1 then, 2 now"),
        ({"precision": "tf32"}, "precision: 'fp32' then, 'tf32' now"),  # by name: tf32 is not fp32, even on a CPU
        ({"learning_rate": 0.1}, "learning_rate: 0.2 then, 0.1 now"),
    ],
)
def test_changed_settings_are_refused_by_name(inputs, tmp_path, changes, named):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    with pytest.raises(InputError, match=rf"cannot resume: the run in it used other settings \({named}\)"):
        _train(inputs, out, resume=True, **changes)


def test_a_changed_architecture_cannot_be_forced(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    with open(inputs["vocab"], "a") as f:
        f.write("newword\n")  # one more row in the softmax
    with pytest.raises(
        InputError,
        match=r"step-000000001.pt: its tensors do not fit this run's model \(.*\): the "
        r"architecture or the vocabulary's size changed; use another out$",
    ):
        _train(inputs, out, allow_changed=True)


def test_a_checkpoint_from_before_the_digests_resumes_with_a_note(inputs, tmp_path):
    """Runs checkpointed before the digests were recorded still resume; their settings still count."""
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    path = out / "checkpoints" / "step-000000001.pt"
    payload = torch.load(path, weights_only=False)
    del payload["fingerprint"]
    payload["format"] = 1
    payload["identity"]["dtype"] = payload["identity"].pop("precision")  # as runs before --precision kept it
    torch.save(payload, path)
    with pytest.raises(InputError, match="seed: 1 then, 2 now"):
        _train(inputs, out, resume=True, seed=2)
    notes = _train(inputs, out, resume=True)
    assert any("predates the digests of the vocabulary and corpus" in n for n in notes), notes
    whole = tmp_path / "whole"
    _train(inputs, whole)
    assert same_tensors(final_tensors(out), final_tensors(whole))


# ---- unreadable checkpoints -----------------------------------------------------------------------


@pytest.mark.slow
def test_when_no_checkpoint_reads_resume_refuses_naming_each(inputs, tmp_path):
    """Today's alternative was a silent start from step 0, throwing the run away."""
    out = tmp_path / "out"
    _train(inputs, out)
    ckpts = sorted((out / "checkpoints").iterdir())
    ckpts[0].write_bytes(ckpts[0].read_bytes()[:1000])  # torn
    torch.save({"something": "else"}, ckpts[1])  # not a checkpoint
    with pytest.raises(InputError) as info:
        _train(inputs, out, resume=True)
    message = info.value.render(_flags())
    assert "\n" not in message and message.startswith(
        f"{out / 'checkpoints'}: cannot resume: no checkpoint can be "
        "read (step-000000002.pt: not an elmo-fast checkpoint (no "
        "model, optimizer, state, identity); step-000000001.pt: "
    )
    assert message.endswith(
        "start over with --overwrite instead of --resume (it removes them), or put back a readable checkpoint"
    )
    _train(inputs, out, overwrite=True)  # as it says
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000000001.pt", "step-000000002.pt"]


def test_a_torn_newest_checkpoint_falls_back_to_the_one_before(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=2)
    newest = out / "checkpoints" / "step-000000002.pt"
    newest.write_bytes(newest.read_bytes()[:-100])
    notes = _train(inputs, out, resume=True)
    assert any(
        n.startswith(f"elmo-fast: skipping unreadable checkpoint {newest} (")
        and n.endswith("); resuming from step-000000001.pt")
        for n in notes
    ), notes
    whole = tmp_path / "whole"
    _train(inputs, whole)
    assert same_tensors(final_tensors(out), final_tensors(whole))


# ---- metrics.jsonl ---------------------------------------------------------------------------------


def test_a_torn_last_metrics_line_is_left_out_and_garbage_elsewhere_named(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    metrics = out / "metrics.jsonl"
    good = metrics.read_text()
    metrics.write_bytes(good.encode() + b"\x00" * 40)  # a crash of the machine: the page never reached the disk
    _train(inputs, out, resume=True)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]
    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0] + "\nnot json\n" + lines[1] + "\n")
    with pytest.raises(
        InputError,
        match=rf"^{metrics} line 2: not a JSON object \('not json'\); only the last line "
        r"can be cut short by a crash",
    ):
        _train(inputs, out, resume=True, max_steps=3)
    assert metrics.read_text() == lines[0] + "\nnot json\n" + lines[1] + "\n"  # left as it was, for the user


# ---- the output directory: leftovers and the lock -----------------------------------------------------


def test_killed_runs_temporary_files_are_swept_and_live_ones_kept(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    dead, live = _dead_pid(), os.getppid()
    left = [
        out / f".weights.hdf5.{host_tag()}-{dead}.0123abcd.elmo-tmp",
        out / "checkpoints" / f".step-000000002.pt.{host_tag()}-{dead}.89abcdef.elmo-tmp",
    ]
    kept = [
        out / f".weights.hdf5.{host_tag()}-{live}.0123abcd.elmo-tmp",
        out / f".weights.hdf5.otherhost-{dead}.0123abcd.elmo-tmp",
    ]
    for p in left + kept:
        p.write_bytes(b"half")
    notes = _train(inputs, out, resume=True)
    assert not any(p.exists() for p in left) and all(p.exists() for p in kept)
    assert f"elmo-fast: removed 1 temporary file(s) left by killed runs in {out}" in notes, notes


def test_a_stale_lock_file_is_no_run_and_blocks_nothing(inputs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    dead = _dead_pid()
    (out / ".elmo-fast.lock").write_text(json.dumps({"pid": dead, "host": "x", "since": 0}))
    inode = (out / ".elmo-fast.lock").stat().st_ino
    seen = []
    real_acquire = RunLock.acquire

    def acquire(lock):  # the run takes the killed run's file as it is (the same inode: never swept first)
        seen.append((lock.path.stat().st_ino, json.loads(lock.path.read_text())["pid"]))
        return real_acquire(lock)

    monkeypatch.setattr(RunLock, "acquire", acquire)
    _train(inputs, out)  # neither "holds a run already" nor "in use"
    assert (out / "weights.hdf5").exists() and seen == [(inode, dead)]
    assert not (out / ".elmo-fast.lock").exists()  # removed at the end, as any run removes its lock


def test_a_finished_run_leaves_no_lock_file_and_a_held_lock_still_stops_a_second_run(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)
    assert not (out / ".elmo-fast.lock").exists()
    with RunLock(out / ".elmo-fast.lock", "held", remove=True):
        with pytest.raises(RunLocked, match="is in use by another elmo-fast run"):
            _train(inputs, out, resume=True)
        assert (out / ".elmo-fast.lock").exists()  # a refused run removes nothing of the holder's
    assert not (out / ".elmo-fast.lock").exists()


def test_a_held_lock_stops_the_run_before_it_touches_anything(inputs, tmp_path):
    out = tmp_path / "out"
    _train(inputs, out, max_steps=1)

    def files():
        return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".elmo-fast.lock"}

    before = files()
    with RunLock(out / ".elmo-fast.lock", "held"):  # (it writes its holder's PID in the file)
        with pytest.raises(
            RunLocked,
            match=rf"^output directory {out} is in use by another elmo-fast run \(PID "
            rf"{os.getpid()} on ",
        ):
            _train(inputs, out, resume=True)
    assert files() == before


# ---- elmo-fast vocab -----------------------------------------------------------------------------------


def test_vocab_checks_its_output_path_before_counting(inputs, tmp_path, capsys):
    from elmo_fast.cli import main

    target = tmp_path / "missing" / "vocab.txt"
    assert main(["vocab", inputs["train"], "--out", str(target)]) == 2  # bad input, known before any work
    err = capsys.readouterr().err
    assert err == f"elmo-fast: error: cannot write {target}: its folder {target.parent} does not exist\n"
