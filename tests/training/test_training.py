"""biLM training: vocabulary, batches, sampled softmax, the bilm-tf weight layout written back,
the training loop (perplexity falls, the written model loads everywhere), kill-safe resume."""

from __future__ import annotations

import gzip
import json
import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import cli_process
import h5py
import numpy as np
import pytest
import torch
from peers import allennlp_elmo
from tolerances import assert_close, max_abs_error

from elmo_fast import ElmoBiLm, batch_to_ids
from elmo_fast.errors import InputError, ModelFileError
from elmo_fast.formats.bilm_tf import load_model_files, load_softmax, save_model_files, to_datasets
from elmo_fast.formats.random_models import PRESETS, random_model
from elmo_fast.formats.vocab import Vocabulary
from elmo_fast.training.data import SentenceBatches, UnrolledWindows, expand_corpus, sentence_batch
from elmo_fast.training.model import initial_weights
from elmo_fast.training.softmax import LogUniformSampler, SoftmaxHead
from elmo_fast.training.trainer import TrainConfig, Trainer, _seed_of
from elmo_fast.training.vocab import build_vocabulary

TINY = PRESETS["tiny"]


# ---- a small language to learn: sentences from a grammar, so a tiny model can lower perplexity fast

NOUNS = "cat dog bird fish horse cow sheep goat mouse frog".split()
VERBS = "sees chases likes bites follows hears finds".split()
ADJS = "big small red green old young".split()


def grammar_sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = ["the"]
        if rng.random() < 0.5:
            words.append(rng.choice(ADJS))
        words += [rng.choice(NOUNS), rng.choice(VERBS), "the", rng.choice(NOUNS)]
        if rng.random() < 0.3:
            words += ["and", rng.choice(VERBS), "a", rng.choice(NOUNS)]
        out.append(" ".join(words + ["."]))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "train.txt").write_text("\n".join(grammar_sentences(600, 1)) + "\n")
    (d / "heldout.txt").write_text("\n".join(grammar_sentences(60, 2)) + "\n")
    vocab, _ = build_vocabulary([str(d / "train.txt")])
    vocab.save(d / "vocab.txt")
    return d


def run_cli(*args, timeout=600, **kw):
    return cli_process.run(
        [sys.executable, "-m", "elmo_fast", *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw
    )


# ---- vocabulary ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vocab_is_bilm_tf_s_format(tmp_path):
    text = "b a a c\na a b\n\n d\n"
    (tmp_path / "x.txt").write_text(text)
    with gzip.open(tmp_path / "y.txt.gz", "wt") as f:  # compressed corpora read as they are
        f.write("c c c a\n")
    r = run_cli("vocab", tmp_path / "x.txt", tmp_path / "y*.gz", "--out", tmp_path / "vocab.txt")
    assert r.returncode == 0, r.stderr
    tokens = (tmp_path / "vocab.txt").read_text().split("\n")
    assert tokens == ["</S>", "<S>", "<UNK>", "a", "c", "b", "d", ""]  # a:5, c:4, b:2, d:1
    vocab = Vocabulary.load(tmp_path / "vocab.txt")
    assert vocab.ids(["a", "zzz", "<S>"]) == [3, vocab.unk, vocab.bos]
    v2, stats = build_vocabulary([str(tmp_path / "x.txt")], min_count=2, max_size=5)
    assert v2.tokens == ["</S>", "<S>", "<UNK>", "a", "b"] and stats["sentences"] == 3


@pytest.mark.slow
def test_vocab_errors(tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n")
    r = run_cli("vocab", tmp_path / "empty.txt", "--out", tmp_path / "v.txt")
    assert r.returncode == 2 and "no sentences" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("vocab", tmp_path / "nothing*.txt", "--out", tmp_path / "v.txt")
    assert r.returncode == 2 and "no file matches" in r.stderr
    (tmp_path / "bad_vocab.txt").write_text("the\ncat\n<S>\n")
    with pytest.raises(ModelFileError, match=r"lacks </S>, <UNK>"):
        Vocabulary.load(tmp_path / "bad_vocab.txt")
    (tmp_path / "dup.txt").write_text("</S>\n<S>\n<UNK>\na\na\n")
    with pytest.raises(ModelFileError, match="appears twice"):
        Vocabulary.load(tmp_path / "dup.txt")


def test_corpus_and_vocabulary_lines_end_at_newline_only(tmp_path):
    """A lone carriage return (or a vertical tab, U+2028, U+0085) does not end a line: the corpus reader,
    the vocabulary counter and a vocabulary file see the lines `wc -l` counts."""
    from elmo_fast.training.data import read_sentences

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"first\rstill first\nsecond\r\nthird\x0bthe\xe2\x80\xa8end\xc2\x85x\n")
    assert read_sentences(str(corpus)) == ["first still first", "second", "third the end x"]
    vocab, stats = build_vocabulary([str(corpus)])
    assert stats["sentences"] == 3 and stats["tokens"] == 8
    (tmp_path / "v.txt").write_bytes(b"</S>\r\n<S>\n<UNK>\ne\r\nf\n")
    assert Vocabulary.load(tmp_path / "v.txt").tokens == ["</S>", "<S>", "<UNK>", "e", "f"]
    for inside in ("\r", "\u2028", "\x0b"):  # once split into two tokens, shifting every later id
        (tmp_path / "v.txt").write_text(f"</S>\n<S>\n<UNK>\na{inside}b\nc\n", encoding="utf-8", newline="")
        with pytest.raises(ModelFileError, match=r"v.txt: line 4 is not one token"):
            Vocabulary.load(tmp_path / "v.txt")


@pytest.mark.slow
def test_a_corpus_line_longer_than_the_limit_is_a_one_line_error(tmp_path):
    from elmo_fast.training.data import read_sentences

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"a b c\r\n" + "\u00e9".encode() * 12 + b"\n" + b"x" * 100_000 + b"\n")
    with pytest.raises(
        InputError,
        match=rf"^{corpus}: line 3 is longer than 12 characters \(one line holds one "
        r"sentence; is this the right file\?\); pass a larger max_line_length",
    ):
        read_sentences(str(corpus), max_line_length=12)
    with pytest.raises(InputError, match="line 2 is longer than 11 characters"):  # characters, not bytes
        read_sentences(str(corpus), max_line_length=11)
    assert len(read_sentences(str(corpus), max_line_length=None)) == 3
    for command in (
        ["vocab", corpus, "--out", tmp_path / "v.txt"],
        [
            "train",
            "--train",
            corpus,
            "--vocab",
            tmp_path / "v.txt",
            "--out",
            tmp_path / "run",
            "--preset",
            "tiny",
            "--quiet",
        ],
    ):
        if command[0] == "train":
            Vocabulary(["</S>", "<S>", "<UNK>", "a"]).save(tmp_path / "v.txt")
            (tmp_path / "run").mkdir()
        r = run_cli(*command, "--max-line-length", "12")
        assert r.returncode == 2, r.stderr
        assert r.stderr == (
            f"elmo-fast: error: {corpus}: line 3 is longer than 12 characters (one line holds one "
            f"sentence; is this the right file?); pass a larger --max-line-length if it is meant\n"
        )


# ---- the bilm-tf layout written back ---------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.slow
def test_weights_written_back_are_the_file_read(tmp_path, preset):
    """load -> to_datasets gives every dataset of the file (gate order, highway signs, char_embed's
    padding row undone exactly; the forget bias's +1 and -1 in float32 within one rounding)."""
    options_file, weights_file = random_model(preset, tmp_path, seed=3, exercise_clips=True)
    datasets = to_datasets(load_model_files(options_file, weights_file))
    with h5py.File(weights_file, "r") as f:
        names = set()
        f.visit(lambda n: names.add(n) if isinstance(f[n], h5py.Dataset) else None)
        assert names == set(datasets)
        for name in names:
            if name.endswith("/B"):  # (b + 1) - 1 rounds once in float32, as in allennlp's loader
                np.testing.assert_allclose(datasets[name], f[name][...], rtol=0, atol=2.0**-22, err_msg=name)
            else:
                np.testing.assert_array_equal(datasets[name], f[name][...], err_msg=name)
    save_model_files(tmp_path / "o2.json", tmp_path / "w2.hdf5", load_model_files(options_file, weights_file))
    again = load_model_files(tmp_path / "o2.json", tmp_path / "w2.hdf5")
    for a, b in zip(again.tensors(), load_model_files(options_file, weights_file).tensors()):
        assert torch.equal(a, b)


def test_initial_weights_follow_bilm_tf(tmp_path):
    w = initial_weights(PRESETS["small"], torch.Generator().manual_seed(0))
    F = PRESETS["small"].n_filters
    assert torch.equal(w.char_embedding[0], torch.zeros(16)) and w.char_embedding[1:].abs().max() <= 1
    assert w.conv_weights[0].abs().max() <= 0.05 and all(b.abs().sum() == 0 for b in w.conv_biases)
    assert torch.equal(w.highway_biases[0][F:], torch.full((F,), 2.0))  # -b_carry, b_carry = -2
    C = PRESETS["small"].cell_dim
    assert torch.equal(w.lstm[0][0].bias[C : 2 * C], torch.ones(C))  # forget_bias 1, i,f,g,o
    # written out, TensorFlow's B is all zeros and the carry bias -2, as bilm-tf starts
    d = to_datasets(w)
    assert not d["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"].any()
    assert (d["CNN_high_0/b_carry"] == -2).all()


# ---- sampled softmax --------------------------------------------------------------------------------


@pytest.mark.slow
def test_log_uniform_sampler_is_tensorflow_s():
    """P(k) = log((k + 2) / (k + 1)) / log(V + 1); distinct ids drawn until n are found, as a
    one-by-one rejection loop would; expected counts by TensorFlow's ExpectedCountHelper."""
    V, n = 50, 10
    sampler = LogUniformSampler(V)
    ks = torch.arange(V)
    p = sampler.probability(ks)
    assert abs(p.sum().item() - 1) < 1e-12
    assert torch.allclose(p, torch.log((ks + 2.0) / (ks + 1.0)).double() / math.log(V + 1))
    g = torch.Generator().manual_seed(0)
    rng = random.Random(1)
    mine, naive = torch.zeros(V), torch.zeros(V)
    rounds = 3000
    for _ in range(rounds):
        ids, tries = sampler.sample(n, g)
        assert ids.numel() == n and ids.unique().numel() == n and tries >= n
        mine[ids] += 1
        seen = set()
        while len(seen) < n:  # the rejection loop, written out
            seen.add(min(int(math.exp(rng.random() * math.log(V + 1))) - 1, V - 1))
        naive[list(seen)] += 1
    assert ((mine - naive) / rounds).abs().max() < 0.04
    assert mine[0] > mine[V - 1] * 3  # Zipfian: frequent ids drawn far more often
    q = sampler.expected_count(ks, 37, n).double()
    assert torch.allclose(q, -torch.expm1(37 * torch.log1p(-p)), rtol=1e-6)
    assert torch.allclose(sampler.expected_count(ks, n, n).double(), p * n, rtol=1e-6)  # no rejection


def test_sampler_does_not_depend_on_its_block_size(monkeypatch):
    """Draws are taken in blocks; the ids kept are those a one-by-one loop would keep."""
    sampler = LogUniformSampler(1000)
    a = sampler.sample(300, torch.Generator().manual_seed(5))
    # one-by-one: the same stream of uniforms, consumed singly
    g = torch.Generator().manual_seed(5)
    u = torch.rand(100_000, generator=g, dtype=torch.float64)
    draws = (torch.exp(u * sampler.log_range).floor().long() - 1).tolist()
    kept, seen = [], set()
    for t, k in enumerate(draws):  # noqa: B007  (t is read after the loop)
        if k not in seen:
            seen.add(k)
            kept.append(k)
            if len(kept) == 300:
                break
    # the block sampler consumed the same uniforms only if its first block covered them all
    if a[1] <= max(2 * 300, 1024):
        assert a[0].tolist() == kept and a[1] == t + 1


def test_sampled_softmax_loss_equals_the_formula():
    torch.manual_seed(0)
    V, P, N = 40, 6, 9
    head = SoftmaxHead(torch.randn(V, P), torch.randn(V))
    h, targets = torch.randn(N, P), torch.randint(0, V, (N,))
    sampled = torch.tensor([3, 17, int(targets[0]), 25])  # one accidental hit for row 0 at least
    qs, qt = torch.rand(4) + 0.1, torch.rand(N) + 0.1
    got = head.sampled_loss(h, targets, sampled, qs, qt)
    for i in range(N):
        true = h[i] @ head.weight[targets[i]] + head.bias[targets[i]] - math.log(qt[i])
        others = [
            h[i] @ head.weight[s] + head.bias[s] - math.log(qs[j]) for j, s in enumerate(sampled) if s != targets[i]
        ]
        logits = torch.stack([true, *others])
        want = torch.logsumexp(logits, 0) - true
        assert abs(got[i].item() - want.item()) < 1e-5
    full = head.full_loss(h, targets, chunk=4)
    want_full = torch.nn.functional.cross_entropy(h @ head.weight.T + head.bias, targets, reduction="none")
    assert_close(full, want_full, torch.float32)


# ---- batches ---------------------------------------------------------------------------------------


def test_sentence_batch_targets():
    vocab = Vocabulary(["</S>", "<S>", "<UNK>", "a", "b"])
    batch = sentence_batch([["a", "b", "zz"], ["b"]], vocab)
    assert batch.lengths.tolist() == [5, 3]
    assert batch.fwd_targets.tolist() == [[3, 4, 2, 0, -1], [4, 0, -1, -1, -1]]  # w1..wT, </S>
    assert batch.bwd_targets.tolist() == [[-1, 1, 3, 4, 2], [-1, 1, 4, -1, -1]]  # <S>, w1..wT
    assert torch.equal(batch.char_ids[1, :3], batch_to_ids([["<S>", "b", "</S>"]])[0])
    assert not batch.char_ids[1, 3:].any()


def test_sentence_batches_are_deterministic_and_resumable(tmp_path):
    lines = [" ".join(["w"] * random.Random(i).randint(1, 30)) for i in range(500)]
    for k in range(3):
        (tmp_path / f"part{k}.txt").write_text("\n".join(lines[k::3]) + "\n")
    files = expand_corpus([str(tmp_path / "part*.txt")])
    data = SentenceBatches(files, batch_size=16, max_tokens=200, seed=4)
    first = list(data.epoch(0))
    again = list(SentenceBatches(files, batch_size=16, max_tokens=200, seed=4).epoch(0))
    assert first == again
    assert sorted(len(s) for _, rows in first for s in rows) == sorted(len(l.split()) for l in lines)
    assert all(len(rows) <= 16 and max(len(s) + 2 for s in rows) * len(rows) <= 200 for _, rows in first)
    assert [i for i, _ in first] == list(range(len(first)))
    assert list(data.epoch(0, start=7)) == first[7:]  # a resumed run sees the same batches
    assert list(data.epoch(1)) != first  # another epoch, another order
    # two ranks: each global batch split in two; together they are the batches of one process
    # with twice the batch size
    one = list(SentenceBatches(files, batch_size=32, max_tokens=400, seed=4).epoch(0))
    ranks = [list(SentenceBatches(files, 16, 200, seed=4, world_size=2, rank=r).epoch(0)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(one)
    for (_, rows), (_, r0), (_, r1) in zip(one, *ranks):
        assert sorted(map(tuple, rows)) == sorted(map(tuple, r0 + r1)) and r0 and r1


def test_unrolled_windows_are_bilm_tf_s(tmp_path):
    """Rows of consecutive sentences: each sentence's tokens but its last are inputs, but its first
    are targets; the backward stream holds reversed sentences, laid out right to left."""
    (tmp_path / "c.txt").write_text("a b\nc\nd e f\n")
    vocab = Vocabulary(["</S>", "<S>", "<UNK>", *"abcdef"])
    data = UnrolledWindows([str(tmp_path / "c.txt")], vocab, rows=1, steps=4, seed=0)
    batches = [b for _, b in data.epoch(0)]
    fwd_inputs, fwd_targets = [], []
    ids = {tuple(batch_to_ids([[t]])[0, 0].tolist()): t for t in ["<S>", "</S>", *"abcdef"]}
    for b in batches:
        fwd_inputs += [ids[tuple(x.tolist())] for x in b.char_ids[0]]
        fwd_targets += [vocab.tokens[i] for i in b.fwd_targets[0].tolist()]
        assert b.lengths.tolist() == [4]
    bwd_inputs, bwd_targets = [], []
    for b in batches:  # the backward LSTM reads each row from its end
        bwd_inputs += [ids[tuple(x.tolist())] for x in b.bwd_char_ids[0].flip(0)]
        bwd_targets += [vocab.tokens[i] for i in b.bwd_targets[0].flip(0).tolist()]
    for inputs, targets, end, begin in (
        (fwd_inputs, fwd_targets, "</S>", "<S>"),
        (bwd_inputs, bwd_targets, "<S>", "</S>"),
    ):
        # one continuous stream: each target is the next input, except after a sentence's end,
        # where the next sentence begins; a sentence's last token is never an input
        for i in range(len(inputs) - 1):
            assert inputs[i + 1] == (begin if targets[i] == end else targets[i]), (i, inputs, targets)
        assert end not in inputs and inputs[0] == begin
    # the backward stream holds the sentences reversed
    first = bwd_inputs[: bwd_targets.index("<S>") + 1]
    assert first in (["</S>", "b", "a"], ["</S>", "c"], ["</S>", "f", "e", "d"]), first
    assert len(batches) == 2  # 3 sentences = 12 tokens, 9 inputs: 2 full windows, the rest dropped


# ---- training ----------------------------------------------------------------------------------------


def _config(corpus, out, **kw):
    base = dict(
        train=[str(corpus / "train.txt")],
        heldout=[str(corpus / "heldout.txt")],
        vocab=str(corpus / "vocab.txt"),
        out=str(out),
        options=TINY.to_dict(),
        epochs=1,
        max_steps=60,
        batch_size=16,
        negative_samples=16,
        eval_every=30,
        checkpoint_every=30,
        log_every=10,
        progress=False,
        seed=3,
    )
    base.update(kw)
    return TrainConfig(**base)


def _heldout(out):
    return [json.loads(l)["heldout"] for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if "heldout" in l]


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    Trainer(_config(corpus, out, max_steps=90, epochs=3)).run()
    return out


@pytest.mark.slow
def test_training_lowers_perplexity_far_below_the_vocabulary(trained, corpus):
    """A few dozen steps on a small language: held-out perplexity falls from about the vocabulary
    size to a small multiple of the language's branching."""
    vocab_size = len(Vocabulary.load(corpus / "vocab.txt"))
    evals = _heldout(trained)
    assert len(evals) >= 2
    assert evals[-1]["mean"] < evals[0]["mean"] and evals[-1]["mean"] < vocab_size / 3, (evals, vocab_size)
    records = [json.loads(l) for l in (trained / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train[-1]["loss"] < train[0]["loss"] and all(r["tokens_per_s"] > 0 for r in train)
    # (no lock file: a run removes its own when it ends)
    assert sorted(p.name for p in trained.iterdir()) == [
        "checkpoints",
        "metrics.jsonl",
        "options.json",
        "softmax.hdf5",
        "vocab.txt",
        "weights.hdf5",
    ]


@pytest.mark.peers
@pytest.mark.slow
def test_the_written_model_is_the_trained_one_everywhere(trained):
    """options.json + weights.hdf5 load in elmo-fast (both backends) and in allennlp's _ElmoBiLm,
    and give the activations of the trained biLM."""
    ckpt = sorted((trained / "checkpoints").glob("step-*.pt"))[-1]
    state = torch.load(ckpt, weights_only=False)["model"]
    trained_bilm = ElmoBiLm(trained / "options.json", trained / "weights.hdf5", backend="reference")
    trained_bilm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("bilm.")})
    ids = batch_to_ids([["the", "big", "cat", "sees", "a", "frog", "."], ["unseen", "words"]])
    with torch.no_grad():
        want = trained_bilm(ids)["activations"]
        for backend in ("reference", "fast"):
            got = ElmoBiLm(trained / "options.json", trained / "weights.hdf5", backend=backend)(ids)["activations"]
            for a, b in zip(got, want):
                assert_close(a, b, torch.float32, what=f"elmo-fast {backend}")
        allennlp = allennlp_elmo()
        theirs = allennlp._ElmoBiLm(str(trained / "options.json"), str(trained / "weights.hdf5"))(ids)["activations"]
        for a, b in zip(theirs, want):
            assert_close(a, b, torch.float32, what="allennlp")


@pytest.mark.slow
def test_perplexity_command_equals_a_recomputation(trained, corpus):
    """`elmo-fast perplexity --json` against numpy: the biLM's top layer (allennlp-style activations
    from ElmoBiLm) times softmax.hdf5 read with h5py, log-softmax, per direction."""
    r = run_cli("perplexity", corpus / "heldout.txt", "--model-dir", trained, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    with h5py.File(trained / "softmax.hdf5") as f:
        W, b = f["softmax/W"][...].astype(np.float64), f["softmax/b"][...].astype(np.float64)
    vocab = [t.strip() for t in (trained / "vocab.txt").read_text().splitlines()]
    index = {t: i for i, t in enumerate(vocab)}
    bilm = ElmoBiLm(trained / "options.json", trained / "weights.hdf5", backend="reference")
    P = bilm.options.projection_dim
    sums, count = [0.0, 0.0], 0
    sentences = [l.split() for l in (corpus / "heldout.txt").read_text().splitlines() if l.strip()]
    with torch.no_grad():
        for s in sentences:
            top = bilm(batch_to_ids([s]))["activations"][-1][0].double().numpy()  # [T + 2, 2P], <S> .. </S>
            ids = [index["<S>"]] + [index.get(w, index["<UNK>"]) for w in s] + [index["</S>"]]
            for d, (rows, targets) in enumerate(((top[:-1, :P], ids[1:]), (top[1:, P:], ids[:-1]))):
                logits = rows @ W.T + b
                logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
                sums[d] += float((logz - logits[np.arange(len(targets)), targets]).sum())
            count += len(s) + 1
    want = {
        "forward": math.exp(sums[0] / count),
        "backward": math.exp(sums[1] / count),
        "mean": math.exp(0.5 * (sums[0] + sums[1]) / count),
    }
    assert got["targets"] == count
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-4 * want[k], (k, got[k], want[k])


@pytest.mark.slow
def test_finetune_starts_from_the_model_and_keeps_the_best(trained, corpus, tmp_path):
    out = tmp_path / "ft"
    r = run_cli(
        "finetune",
        "--model-dir",
        trained,
        "--train",
        corpus / "heldout.txt",
        "--heldout",
        corpus / "heldout.txt",
        "--out",
        out,
        "--max-steps",
        8,
        "--batch-size",
        8,
        "--negative-samples",
        16,
        "--eval-every",
        4,
        "--checkpoint-every",
        4,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    evals = _heldout(out)
    best = min(e["mean"] for e in evals)
    ppl = json.loads(run_cli("perplexity", corpus / "heldout.txt", "--model-dir", out, "--json").stdout)["mean"]
    assert abs(ppl - best) <= 1e-3 * best  # the exported model is the best one seen
    before = json.loads(run_cli("perplexity", corpus / "heldout.txt", "--model-dir", trained, "--json").stdout)["mean"]
    assert evals[0]["mean"] < 2 * before  # it started from the trained model, not from scratch


@pytest.mark.slow
def test_finetune_without_a_softmax_warms_a_new_one_up(trained, corpus, tmp_path):
    src = tmp_path / "published"
    src.mkdir()
    for name in ("options.json", "weights.hdf5", "vocab.txt"):
        (src / name).write_bytes((trained / name).read_bytes())
    out = tmp_path / "ft"
    r = run_cli(
        "finetune",
        "--model-dir",
        src,
        "--train",
        corpus / "train.txt",
        "--out",
        out,
        "--max-steps",
        3,
        "--batch-size",
        8,
        "--negative-samples",
        16,
        "--softmax-warmup",
        2,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert "softmax" in r.stderr and "2 steps" in r.stderr
    # during the warm-up the biLM did not move; afterwards it did
    w0 = load_model_files(src / "options.json", src / "weights.hdf5")
    w1 = load_model_files(out / "options.json", out / "weights.hdf5")
    assert max_abs_error(w0.proj_weight, w1.proj_weight) > 0


@pytest.mark.slow
def test_training_refuses_bad_settings(corpus, tmp_path):
    args = [
        "train",
        "--train",
        corpus / "train.txt",
        "--vocab",
        corpus / "vocab.txt",
        "--preset",
        "tiny",
        "--out",
        tmp_path / "o",
        "--max-steps",
        1,
        "--quiet",
    ]
    (tmp_path / "novocab.txt").write_text("a\nb\n")
    for extra, message in (
        (["--vocab", tmp_path / "novocab.txt"], "lacks </S>, <S>, <UNK>"),
        (["--train", tmp_path / "none*.txt"], "no file matches"),
        (["--batch-size", 0], "--batch-size must be >= 1"),
        (["--options", tmp_path / "missing.json", "--preset", "tiny"], "not both"),
    ):
        r = run_cli(*args, *extra)
        assert r.returncode == 2 and message in r.stderr, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    (tmp_path / "empty.txt").write_text("")
    r = run_cli(*args[:1], "--train", tmp_path / "empty.txt", *args[3:])
    assert r.returncode == 2, r.stderr


def _train_flags() -> dict[str, str]:
    """How `elmo-fast train` names the trainer's parameters in its messages."""
    from elmo_fast.cli import build_parser

    return build_parser().parse_args(["train", "--train", "t.txt", "--vocab", "v.txt", "--out", "o"]).flags


def test_resume_refuses_other_settings(corpus, tmp_path):
    """The Python API names the trainer's parameters, the command line its flags, from one error."""
    Trainer(_config(corpus, tmp_path, max_steps=2, checkpoint_every=1, heldout=[])).run()
    with pytest.raises(
        InputError,
        match=r"^out .* holds a run already; resume=True continues it, overwrite=True "
        r"starts over$",
    ) as info:
        Trainer(_config(corpus, tmp_path, max_steps=4, heldout=[])).run()
    assert info.value.render(_train_flags()) == (
        f"--out {tmp_path}: holds a run already; --resume continues it, --overwrite starts over"
    )
    with pytest.raises(
        InputError,
        match=r"cannot resume: .*seed: 3 then, 4 now.*another out, or allow_changed=True "
        r"to continue",
    ) as info:
        Trainer(_config(corpus, tmp_path, max_steps=4, seed=4, heldout=[])).run(resume=True)
    assert info.value.render(_train_flags()).endswith(
        "; use the same inputs and settings, another --out, or "
        "--resume-anyway to continue with these (the model then comes "
        "from two different runs)"
    )


@pytest.mark.parametrize(
    "settings,api,cli",
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0", "--batch-size must be >= 1, got 0"),
        ({"max_steps": 0}, "max_steps must be >= 1, got 0", "--max-steps must be >= 1, got 0"),
        ({"dropout": 1.0}, "dropout must be in [0, 1), got 1.0", "--dropout must be in [0, 1), got 1.0"),
        (
            {"unroll_steps": 4, "max_tokens_per_batch": 99},
            "max_tokens_per_batch applies to the sentence scheme, not to unroll_steps (whose batches are batch_size rows "
            "of unroll_steps tokens)",
            "--max-tokens-per-batch applies to the sentence scheme, not to --unroll-steps (whose batches are --batch-size "
            "rows of --unroll-steps tokens)",
        ),
        ({"train": ["nothing*.txt"]}, "train nothing*.txt: no file matches", "--train nothing*.txt: no file matches"),
    ],
)
def test_trainer_errors_name_parameters_or_flags(corpus, tmp_path, settings, api, cli):
    with pytest.raises(InputError) as info:
        Trainer(_config(corpus, tmp_path, **settings)).run()
    assert str(info.value) == api and info.value.render(_train_flags()) == cli


def test_resume_after_a_kill_that_tore_the_last_metrics_line(corpus, tmp_path):
    """metrics.jsonl grows by appends, which a kill -9 can cut in the middle of a line: a resumed run
    leaves that line out and logs its step again."""
    Trainer(_config(corpus, tmp_path, max_steps=2, checkpoint_every=2, log_every=1, heldout=[])).run()
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "a", encoding="utf-8") as f:
        f.write('{"step": 3, "epoch": 1, "tok')
    Trainer(_config(corpus, tmp_path, max_steps=3, checkpoint_every=1, log_every=1, heldout=[])).run(resume=True)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]


def _last_step(out) -> int:
    steps = (
        [int(p.stem.split("-")[1]) for p in (Path(out) / "checkpoints").glob("step-*.pt")]
        if (Path(out) / "checkpoints").exists()
        else []
    )
    return max(steps, default=0)


def _weights(out):
    return load_model_files(Path(out) / "options.json", Path(out) / "weights.hdf5").tensors()


@pytest.mark.slow
def test_resume_of_a_finished_run_trains_no_further(corpus, tmp_path):
    """A run killed after its last checkpoint (while exporting the model files) resumes with nothing
    left to do: the weights are those of the finished run, not one step further."""
    Trainer(_config(corpus, tmp_path / "a", max_steps=3, checkpoint_every=1, heldout=[])).run()
    before = _weights(tmp_path / "a")
    (tmp_path / "a" / "weights.hdf5").unlink()  # as a kill during the export can leave it
    result = Trainer(_config(corpus, tmp_path / "a", max_steps=3, checkpoint_every=1, heldout=[])).run(resume=True)
    assert result["step"] == 3
    assert all(torch.equal(x, y) for x, y in zip(_weights(tmp_path / "a"), before))


@pytest.mark.parametrize("scheme", ["sentences", "unrolled"])
@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_gives_the_same_weights(corpus, tmp_path, scheme):
    """`elmo-fast train --resume` SIGKILLed at random moments, then resumed: the final weights and
    softmax are those of an uninterrupted run, bit for bit."""
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    common = [
        "train",
        "--train",
        corpus / "train.txt",
        "--vocab",
        corpus / "vocab.txt",
        "--preset",
        "tiny",
        "--max-steps",
        12,
        "--batch-size",
        8,
        "--negative-samples",
        16,
        "--checkpoint-every",
        1,
        "--quiet",
        "--seed",
        5,
    ]
    if scheme == "unrolled":
        common += ["--unroll-steps", 6]
    r = run_cli(*common, "--out", tmp_path / "whole")
    assert r.returncode == 0, r.stderr
    args = [sys.executable, "-m", "elmo_fast", *map(str, common), "--out", str(tmp_path / "killed"), "--resume"]
    kills = 0
    # kill once the run has passed a random step (checkpoints are written every step), a random
    # moment later: inside a step, a checkpoint's write or an export, whatever the machine's load
    for target in sorted(rng.sample(range(1, 11), 3)):
        proc = cli_process.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and _last_step(tmp_path / "killed") < target:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    r = cli_process.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"seed {seed}: {r.stderr}"
    assert kills >= 1, f"seed {seed}: finished before any kill"
    for a, b in zip(_weights(tmp_path / "killed"), _weights(tmp_path / "whole")):
        assert torch.equal(a, b), f"seed {seed}, {kills} kills: weights differ"
    sa = load_softmax(tmp_path / "killed" / "softmax.hdf5", len(Vocabulary.load(corpus / "vocab.txt")), 16)
    sb = load_softmax(tmp_path / "whole" / "softmax.hdf5", len(Vocabulary.load(corpus / "vocab.txt")), 16)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    # (no log at all when every run that reached an interval's end was killed before logging it: with
    # --log-every 50 over 12 steps only a run's last interval is logged, and a last kill after the
    # final checkpoint leaves the resume nothing to train, hence nothing to log)
    log = tmp_path / "killed" / "metrics.jsonl"
    steps = [json.loads(l)["step"] for l in log.read_text().splitlines()] if log.exists() else []
    assert steps == sorted(steps)  # the log holds no step twice after the resumes


@pytest.mark.slow
def test_sigterm_checkpoints_and_says_how_to_resume(corpus, tmp_path):
    common = [
        "train",
        "--train",
        corpus / "train.txt",
        "--vocab",
        corpus / "vocab.txt",
        "--preset",
        "tiny",
        "--max-steps",
        10**7,
        "--batch-size",
        8,
        "--negative-samples",
        16,
        "--checkpoint-every",
        10**7,
        "--quiet",
        "--out",
        tmp_path / "o",
    ]
    # (max steps far more than the run can reach before the signal: on a fast machine 400 tiny steps
    # once ended within the 3 s below, and the run exited 0 before it was sent)
    proc = cli_process.Popen(
        [sys.executable, "-m", "elmo_fast", *map(str, common)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (tmp_path / "o" / "vocab.txt").exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "--resume" in err
    assert list((tmp_path / "o" / "checkpoints").glob("step-*.pt"))


@pytest.mark.slow
def test_two_processes_under_torchrun_equal_one_on_the_combined_batches(corpus, tmp_path):
    """DistributedDataParallel on 2 gloo processes, each reading its rows of every global batch:
    N steps give the weights of one process whose batches are the two ranks' together (dropout off,
    since each rank draws its own masks; the sampled negatives are shared: one draw per step)."""
    common = [
        "train",
        "--train",
        corpus / "train.txt",
        "--vocab",
        corpus / "vocab.txt",
        "--preset",
        "tiny",
        "--max-steps",
        5,
        "--negative-samples",
        16,
        "--dropout",
        0,
        "--quiet",
        "--checkpoint-every",
        100,
        "--max-tokens-per-batch",
        60,
    ]
    r = cli_process.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "elmo_fast",
            *map(str, common),
            "--batch-size",
            "4",
            "--out",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(*common[:-2], "--max-tokens-per-batch", 120, "--batch-size", 8, "--out", tmp_path / "one")
    assert r.returncode == 0, r.stderr
    one, two = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    worst = max(max_abs_error(a, b) for a, b in zip(one, two))
    assert worst <= 1e-5, worst  # fp32 rounding: the gradients are summed in another order
    start = initial_weights(TINY, torch.Generator().manual_seed(_seed_of(0, -1)))  # the runs' seed 0
    moved = max(max_abs_error(a, b) for a, b in zip(one, start.tensors()))
    assert moved > 1e-3  # the steps did train


@pytest.mark.slow
def test_a_biLM_fine_tuned_inside_a_model_is_saved_for_elmo_fast_embed(tmp_path, random_models):
    """Elmo(requires_grad=True) trained a few steps, saved with save_bilm: `elmo-fast embed` on the
    saved files gives the fine-tuned biLM's vectors, not the original's."""
    from elmo_fast import Elmo, ElmoEmbedder

    files = random_models("tiny")
    elmo = Elmo(*files, 1, requires_grad=True, dropout=0.0, backend="reference")
    opt = torch.optim.SGD(elmo.parameters(), lr=0.5)
    ids = batch_to_ids([["the", "cat"], ["a", "dog", "barks"]])
    for _ in range(3):
        opt.zero_grad()
        elmo(ids)["elmo_representations"][0].pow(2).mean().backward()
        opt.step()
    elmo.save_bilm(tmp_path / "tuned")
    (tmp_path / "in.txt").write_text("the cat\na dog barks\n")
    r = run_cli(
        "embed",
        tmp_path / "in.txt",
        tmp_path / "out.h5",
        "--all",
        "--options",
        tmp_path / "tuned" / "options.json",
        "--weights",
        tmp_path / "tuned" / "weights.hdf5",
    )
    assert r.returncode == 0, r.stderr
    elmo.eval()
    with torch.no_grad(), h5py.File(tmp_path / "out.h5") as f:
        want = elmo._elmo_lstm.embed(ids)[0]
        for i, n in enumerate([2, 3]):
            assert_close(torch.from_numpy(f[str(i)][...]), want[i, :, :n], torch.float32)
        original = ElmoEmbedder(*files).embed_sentence(["the", "cat"])
        assert np.abs(original - f["0"][...]).max() > 1e-3
