"""Beyond one process: `elmo-fast embed` under torchrun (ranks sharing the windows, c10d "nodes",
a rank killed and the group restarted), and `Elmo` inside DistributedDataParallel. CPU, gloo."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import cli_process
import h5py
import pytest
import torch
from embed_runs import assert_same_output, random_sentences, write_lines
from repo_paths import SUPPORT
from sigkill_at import HOOK as KILL_HOOK
from torchrun import ENV, TORCHRUN, run

from elmo_fast import ElmoEmbedder, ElmoFastError
from elmo_fast.cli import main
from elmo_fast.embedding.ranks import Ranks
from elmo_fast.embedding.work_area import list_shards

#: `elmo-fast` that SIGKILLs itself at the moment KILL_HOOK names (tests/support/sigkill_at.py)
KILLABLE = [str(SUPPORT / "sigkill_at.py")]


@pytest.fixture(scope="module")
def job(random_models, tmp_path_factory):
    """An input (an empty line skipped: line numbers and sentence positions differ), the flags of a
    run with small windows, and the file one process writes."""
    d = tmp_path_factory.mktemp("job")
    sentences = random_sentences(random.Random(13), 120)
    sentences[5] = ""
    inp = write_lines(d / "in.txt", sentences)
    options, weights = random_models("tiny")
    flags = [
        str(inp),
        "--all",
        "--options",
        str(options),
        "--weights",
        str(weights),
        "--window",
        "8",
        "--batch-size",
        "4",
        "--skip-empty",
        "--file-friendly-logging",
    ]
    r = run(sys.executable, "-m", "elmo_fast", "embed", flags[0], d / "one.h5", *flags[1:])
    assert r.returncode == 0, r.stderr
    return {"flags": flags, "one": d / "one.h5", "lines": len(sentences) - 1}


def embed_under_torchrun(job, out: Path, *launcher, env=ENV, extra=(), program=("-m", "elmo_fast")):
    return run(*TORCHRUN, *launcher, *program, "embed", job["flags"][0], out, *job["flags"][1:], *extra, env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_only_the_output(out: Path) -> None:
    assert not Path(str(out) + ".partial").exists()
    with h5py.File(out) as f:  # the run record of a resumable run; datasets as one process writes them
        assert "elmo_fast_run" in f.attrs


@pytest.mark.slow
def test_two_ranks_write_the_file_one_process_writes(job, tmp_path):
    out = tmp_path / "two.h5"
    r = embed_under_torchrun(job, out, "--standalone", "--nproc-per-node", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_output(out, job["one"], "2 ranks")
    assert_only_the_output(out)
    summary = [line for line in r.stderr.splitlines() if line.startswith("elmo-fast: ")]
    assert len(summary) == 2, r.stderr  # rank 0 alone reports, for the group
    assert summary[0].startswith(f"elmo-fast: {job['lines']} sentences, "), summary
    assert summary[1].endswith("cpu x 2 ranks") and "the sum over 2 ranks" in summary[1], summary


@pytest.mark.slow
def test_two_nodes_of_one_rank_through_c10d_rendezvous(job, tmp_path):
    out = tmp_path / "nodes.h5"
    launcher = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "elmo-fast-test",
    ]
    command = [*TORCHRUN, *launcher, "-m", "elmo_fast", "embed", job["flags"][0], str(out), *job["flags"][1:]]
    nodes = [
        cli_process.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(2)
    ]
    results = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, results):
        assert node.returncode == 0, err[-3000:]
    assert_same_output(out, job["one"], "2 nodes")
    assert_only_the_output(out)


@pytest.mark.parametrize("moment", ["1:batch:5", "0:assemble:40"])
@pytest.mark.slow
def test_a_rank_killed_is_restarted_by_torchrun_and_the_group_continues(job, tmp_path, moment):
    """SIGKILL (tests/support/sigkill_at.py: once, at a set moment): rank 1 with a window half-written, or rank 0
    while it assembles the output. torchrun restarts the group, which continues from what is done."""
    out = tmp_path / "killed.h5"
    marker = tmp_path / "killed-once"
    env = {**ENV, KILL_HOOK: f"{moment}:{marker}"}
    r = embed_under_torchrun(
        job, out, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", env=env, program=KILLABLE
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert marker.exists(), "the hook did not kill"
    assert f"(exitcode: -{int(signal.SIGKILL)}) local_rank: {moment[0]}" in r.stderr, r.stderr[-3000:]
    assert "done before) -> " in r.stderr, r.stderr[-3000:]  # the restarted group took up the complete shards
    assert_same_output(out, job["one"], f"killed at {moment}, restarted")
    assert_only_the_output(out)


@pytest.mark.slow
def test_a_failed_group_is_finished_by_a_plain_rerun_with_resume(job, tmp_path, capsys):
    """No restarts left: the group fails, its shards stay; one process with --resume finishes them
    (windows are dealt by position, not by rank: any number of processes can continue a run)."""
    out = tmp_path / "failed.h5"
    env = {**ENV, KILL_HOOK: f"1:window:2:{tmp_path / 'killed-once'}"}
    r = embed_under_torchrun(
        job, out, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", env=env, program=KILLABLE
    )
    assert r.returncode != 0 and not out.exists()
    work = Path(str(out) + ".partial")
    shards = list_shards(str(work))
    assert shards and sum(s["n"] for s in shards) < job["lines"]
    assert main(["embed", job["flags"][0], str(out), *job["flags"][1:]]) == 2  # without --resume: refused
    assert "holds an interrupted run" in capsys.readouterr().err
    r = run(sys.executable, "-m", "elmo_fast", "embed", job["flags"][0], out, *job["flags"][1:], "--resume")
    assert r.returncode == 0, r.stderr
    assert f"(after {sum(s['n'] for s in shards)} done before)" in r.stderr, r.stderr
    assert_same_output(out, job["one"], "a failed group, then one process with --resume")
    assert_only_the_output(out)


@pytest.mark.slow
def test_stateful_is_refused_under_torchrun(job, tmp_path, monkeypatch, capsys, random_models):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code = main(["embed", job["flags"][0], str(tmp_path / "o.h5"), *job["flags"][1:], "--stateful"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        "elmo-fast: error: --stateful cannot run under torchrun (2 rank(s)): the LSTM states flow "
        "from each batch to the next in input order, which needs one process; run `elmo-fast embed "
        "--stateful` without torchrun"
    )
    monkeypatch.setenv("WORLD_SIZE", "1")  # the library, alone: refused as well, before any output
    stateful = ElmoEmbedder(*random_models("tiny"), stateful=True)
    with pytest.raises(
        ElmoFastError,
        match=r"^a stateful run \(stateful=True\) cannot be split among the ranks of a "
        r"group \(torchrun\): the LSTM states flow",
    ):
        stateful.embed_file(job["flags"][0], tmp_path / "o.h5", distributed=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_windows_are_dealt_round_robin_and_a_group_of_one_is_alone(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    alone = Ranks.join(str(tmp_path))
    assert (alone.rank, alone.world) == (0, 1) and all(alone.owns(k) for k in range(5))
    assert [Ranks(1, 3, str(tmp_path)).owns(k) for k in range(7)] == [False, True, False, False, True, False, False]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ElmoFastError, match="rank 1 of 2 .* no torch.distributed process group is initialised"):
        Ranks.join(str(tmp_path))


# --- Elmo inside DistributedDataParallel ---------------------------------------------------------------

DDP_SENTENCES = [
    ["the", "cat", "sat", "on", "the", "mat"],
    ["a", "dog"],
    ["ELMo", "gives", "vectors"],
    ["x"],
    ["one", "more", "sentence", "of", "five"],
    ["short", "one"],
]

DDP_WORKER = r"""
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from elmo_fast import Elmo, batch_to_ids

options, weights, out, sentences = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for requires_grad in (False, True):
    elmo = Elmo(options, weights, 2, requires_grad=requires_grad, dropout=0.0)
    model = DistributedDataParallel(elmo)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mine = sentences[rank::world]
    grads = []
    for step in range(2):
        opt.zero_grad()
        result = model(batch_to_ids(mine))
        mask = result["mask"].unsqueeze(-1).float()
        # each rank's share of the combined batch's mean: DistributedDataParallel averages over ranks
        loss = sum(((r * mask) ** 2).sum() for r in result["elmo_representations"]) * world / len(sentences)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in elmo.named_parameters() if p.grad is not None})
        opt.step()
    torch.save({"grads": grads, "params": {n: p.detach().clone() for n, p in elmo.named_parameters()}},
               os.path.join(out, f"rank{rank}-{int(requires_grad)}.pt"))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_elmo_under_distributed_data_parallel_equals_one_process(random_models, tmp_path):
    """Gradients of the scalar mixes (and of the whole biLM when fine-tuned, requires_grad=True) from
    2 gloo ranks equal those of one process on the combined batch, and so do the parameters after 2
    SGD steps (allennlp issues 2055 and 5097: ScalarMix's ParameterList under DataParallel)."""
    import json

    from tolerances import assert_grad_close

    from elmo_fast import Elmo, batch_to_ids

    options, weights = random_models("tiny")
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER)
    r = run(
        *TORCHRUN,
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        options,
        weights,
        tmp_path,
        json.dumps(DDP_SENTENCES),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # no "Grad strides do not match bucket view strides": every gradient goes straight into its bucket
    assert "Grad strides" not in r.stderr, r.stderr[-2000:]
    for requires_grad in (False, True):
        elmo = Elmo(options, weights, 2, requires_grad=requires_grad, dropout=0.0)
        opt = torch.optim.SGD(elmo.parameters(), lr=0.1)
        want = []
        for _ in range(2):
            opt.zero_grad()
            result = elmo(batch_to_ids(DDP_SENTENCES))
            mask = result["mask"].unsqueeze(-1).float()
            loss = sum(((r * mask) ** 2).sum() for r in result["elmo_representations"]) / len(DDP_SENTENCES)
            loss.backward()
            want.append({n: p.grad.clone() for n, p in elmo.named_parameters() if p.grad is not None})
            opt.step()
        trainable = {n for n, p in elmo.named_parameters() if p.requires_grad}
        assert set(want[0]) == trainable
        assert len(trainable) == (len(list(elmo.parameters())) if requires_grad else 8)  # 2 mixes: 3 weights, gamma
        for rank in range(2):
            got = torch.load(tmp_path / f"rank{rank}-{int(requires_grad)}.pt")
            what = f"requires_grad={requires_grad}, rank {rank}"
            for step in range(2):
                assert set(got["grads"][step]) == set(want[step]), f"{what}, step {step}"
                for name, grad in want[step].items():
                    assert_grad_close(
                        got["grads"][step][name], grad, torch.float32, f"{what}, step {step}: grad of {name}"
                    )
            for name, p in elmo.named_parameters():
                assert_grad_close(got["params"][name], p.detach(), torch.float32, f"{what}: {name} after 2 steps")
