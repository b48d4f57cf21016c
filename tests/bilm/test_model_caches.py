"""What ElmoBiLm does for a GPU that can be checked on any machine: the host-planned forward (inputs
on the CPU, model on a GPU: distinct tokens, lengths and schedule worked out on the host, so that the
forward never waits for the device), and the stacked LSTM weights the CUDA op takes, cached per
device and dtype and remade whenever the weights change.

On a CPU-only machine both run on the CPU by switching on the device test they hang on
(``ElmoBiLm._plans_on_host``, ``derived_weights.STACKED_LSTM_DEVICES``); tests/bilm/test_bilm_cuda.py
runs them on a GPU for real.
"""

import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from tolerances import TOL, max_abs_error

from elmo_fast import ElmoBiLm, batch_to_ids
from elmo_fast.bilm import cuda_graphs, derived_weights, ops
from elmo_fast.bilm import distinct_rows as distinct_rows_module
from elmo_fast.bilm import model as model_module
from elmo_fast.bilm.distinct_rows import distinct_rows
from elmo_fast.bilm.reference import add_sentence_boundaries

FP32 = TOL[torch.float32]["atol"]
HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
needs_fast = pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")


def _batch(seed, n, lo=1, hi=14):
    sents = _sentences(np.random.default_rng(seed), n, lo, hi)
    if n > 3:
        sents[1] = ["one"]
        sents[2] = []
        sents[3] = sents[0][:3] + sents[0]  # repeated tokens
    return sents


# --- distinct_rows: torch.unique(dim=0) without the sort of whole rows ---------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_distinct_rows_is_a_unique_of_the_masked_rows(seed):
    ids, mask = add_sentence_boundaries(batch_to_ids(_batch(seed, 9)))
    distinct, index = distinct_rows(ids, mask)
    assert index.dtype == torch.long and index.shape == mask.shape
    assert torch.equal(distinct[index][mask], ids[mask])  # every position finds its own row
    assert torch.all(index[~mask] == 0)
    want = torch.unique(ids[mask], dim=0)
    assert distinct.shape == want.shape  # no row twice
    assert torch.equal(torch.unique(distinct, dim=0), want)


@pytest.mark.parametrize("masked", [False, True], ids=["every_position", "masked"])
def test_distinct_rows_is_torch_unique_row_for_row(masked):
    """The same rows in the same (lexicographic) order as torch.unique(dim=0), and the same index:
    every path hands the GEMMs the same rows in the same order (their rounding depends on it)."""
    ids, mask = add_sentence_boundaries(batch_to_ids(_batch(5, 11)))
    distinct, index = distinct_rows(ids, mask if masked else None)
    want, inverse = torch.unique(ids[mask] if masked else ids.reshape(-1, 50), dim=0, return_inverse=True)
    assert torch.equal(distinct, want)
    assert torch.equal(index[mask] if masked else index.reshape(-1), inverse)
    rows, words = distinct_rows(torch.tensor([[[3], [1], [3], [0]]]))  # rows of one id: vocab_to_cache's
    assert rows.tolist() == [[0], [1], [3]] and words.tolist() == [[2, 1, 2, 0]]


def test_distinct_rows_falls_back_on_a_hash_collision(monkeypatch):
    ids, mask = add_sentence_boundaries(batch_to_ids(_batch(1, 5)))
    monkeypatch.setattr(distinct_rows_module, "_row_hash_multipliers", lambda width: np.zeros(width, dtype=np.uint64))
    distinct, index = distinct_rows(ids, mask)  # every hash 0: the check catches it
    assert torch.equal(distinct, torch.unique(ids[mask], dim=0))
    assert torch.equal(distinct[index][mask], ids[mask])


def test_distinct_rows_of_nothing():
    distinct, index = distinct_rows(torch.zeros(2, 3, 50, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool))
    assert distinct.shape == (1, 50) and torch.all(index == 0)


# --- the host-planned forward --------------------------------------------------------------------------


@pytest.fixture
def planned_on_host(monkeypatch):
    """Every fast inference call of ElmoBiLm plans on the host, as on a GPU with CPU inputs; records the
    lengths each bilstm call got."""
    monkeypatch.setattr(model_module.ElmoBiLm, "_plans_on_host", lambda self, inputs: inputs.device.type == "cpu")
    seen = []
    real = ops.bilstm

    def spy(xg0, token_index, lengths, *args, **kwargs):
        seen.append(lengths)
        return real(xg0, token_index, lengths, *args, **kwargs)

    monkeypatch.setattr(ops, "bilstm", spy)
    return seen


@needs_fast
@pytest.mark.parametrize("stateful,cache", [(False, 0), (True, 0), (False, 1000)], ids=["plain", "stateful", "cache"])
@pytest.mark.slow
def test_host_planned_forward_matches_the_reference(random_models, planned_on_host, stateful, cache):
    files = random_models("tiny", exercise_clips=True)
    ref = ElmoBiLm(*files, backend="reference", stateful=stateful)
    fast = ElmoBiLm(*files, backend="fast", stateful=stateful, token_cache_size=cache)
    with torch.inference_mode():
        for seed in range(3):  # the cache and the states carry over
            ids = batch_to_ids(_batch(seed, 5 + 2 * seed))
            want, got = ref(ids), fast(ids)
            assert torch.equal(got["mask"], want["mask"])
            for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
                assert max_abs_error(g, w) <= FP32, f"layer {k}"
            lengths = planned_on_host[-1]
            assert lengths.device.type == "cpu" and torch.equal(lengths, want["mask"].sum(dim=1))
    if cache:
        assert fast.token_cache.hits > 0


@needs_fast
def test_host_planned_forward_with_vocab_to_cache(random_models, planned_on_host):
    files = random_models("tiny")
    vocab = ["@@PADDING@@", "the", "cat", "sat", "on", "mat", "."]
    sents = [["the", "cat"], ["sat", "on", "the", "mat", "."], []]
    word_ids = torch.tensor([[vocab.index(w) for w in s] + [0] * (5 - len(s)) for s in sents])
    fast = ElmoBiLm(*files, backend="fast", vocab_to_cache=vocab)
    ref = ElmoBiLm(*files, backend="reference")
    with torch.inference_mode():
        got = fast(None, word_ids)
        want = ref(batch_to_ids(sents))
    assert torch.equal(got["mask"], want["mask"])
    for g, w in zip(got["activations"], want["activations"]):
        assert max_abs_error(g, w) <= FP32
    assert planned_on_host[-1].device.type == "cpu"


# --- stacked LSTM weights: cached per device and dtype, remade when the weights change ----------------


@pytest.fixture
def stacked_on_cpu(monkeypatch, calibration_off):
    """CUDA's LSTM weights on the CPU: stacked per layer, one dtype for the op; and, as on CUDA, none of the
    CPU's measured schedules (packed weights take float32 biases, which a stacked list does not hold)."""
    monkeypatch.setattr(derived_weights, "STACKED_LSTM_DEVICES", ("cuda", "cpu"))


def _embed(bilm, ids):
    with torch.no_grad():
        return [a.clone() for a in bilm(ids)["activations"]]


def _assert_same(a, b, what):
    for k, (x, y) in enumerate(zip(a, b)):
        assert max_abs_error(x, y) <= FP32, f"{what}, layer {k}"


@needs_fast
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_stacked_lstm_weights_are_views_made_once(random_models, stacked_on_cpu, dtype):
    files = random_models("tiny")
    bilm = ElmoBiLm(*files, backend="fast", dtype=dtype)
    first = bilm._flat_lstm()
    assert bilm._flat_lstm() is first  # cached
    L = bilm.options.n_layers
    for layer in range(L):
        for k in (1, 3):  # w_hh, w_proj: the two directions are halves of one [2, ...] tensor
            f, b = first[8 * layer + k], first[8 * layer + 4 + k]
            assert f.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            assert b.storage_offset() - f.storage_offset() == f.numel()
            assert f.dtype == dtype
    assert all(w.dtype == dtype for w in first)  # on a stacking (CUDA) device, one dtype for the op
    plain = ElmoBiLm(*files, backend="fast", dtype=dtype)
    ids = batch_to_ids(_batch(0, 6))
    got = _embed(bilm, ids)
    stacked_values = [w.clone() for w in first]
    derived_weights.STACKED_LSTM_DEVICES = ("cuda",)
    try:
        unstacked = plain._flat_lstm()
        want = _embed(plain, ids)
    finally:
        derived_weights.STACKED_LSTM_DEVICES = ("cuda", "cpu")
    assert unstacked[1].untyped_storage().data_ptr() != unstacked[5].untyped_storage().data_ptr()
    for k, (s, u) in enumerate(zip(stacked_values, unstacked)):
        assert torch.equal(s, u.to(s.dtype)), k
    if dtype == torch.float32:
        for x, y in zip(got, want):
            assert torch.equal(x, y)  # the same values in the same kernels


def _change_load_state_dict(bilm, other):
    bilm.load_state_dict(other.state_dict())


def _change_in_place(bilm, other):
    with torch.no_grad():
        for p, q in zip(bilm.parameters(), other.parameters()):
            p.copy_(q)


@needs_fast
@pytest.mark.parametrize("change", [_change_load_state_dict, _change_in_place], ids=["load_state_dict", "in_place"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.slow
def test_stacked_lstm_weights_follow_changed_weights(random_models, stacked_on_cpu, change, dtype):
    files, other_files = random_models("tiny", seed=0), random_models("tiny", seed=1)
    bilm = ElmoBiLm(*files, backend="fast", dtype=dtype)
    other = ElmoBiLm(*other_files, backend="fast", dtype=dtype)
    ids = batch_to_ids(_batch(2, 5))
    before = _embed(bilm, ids)
    old = bilm._flat_lstm()
    change(bilm, other)
    after = _embed(bilm, ids)
    assert bilm._flat_lstm() is not old
    _assert_same(after, _embed(other, ids), f"after {change.__name__}")
    assert max_abs_error(after[2], before[2]) > 1e-2  # really other weights


@needs_fast
@pytest.mark.slow
def test_stacked_lstm_weights_follow_an_optimizer_step(random_models, stacked_on_cpu):
    files = random_models("tiny")
    bilm = ElmoBiLm(*files, backend="fast", requires_grad=True)
    ids = batch_to_ids(_batch(3, 4))
    bilm.eval()
    before = _embed(bilm, ids)
    old = bilm._flat_lstm()
    opt = torch.optim.SGD(bilm.parameters(), lr=0.5)
    bilm.train()
    loss = sum(a.square().mean() for a in bilm(ids)["activations"][1:])
    loss.backward()
    opt.step()
    bilm.eval()
    after = _embed(bilm, ids)
    assert bilm._flat_lstm() is not old
    fresh = ElmoBiLm.from_weights(bilm.weights(), backend="reference")
    _assert_same(after, _embed(fresh, ids), "after an optimizer step")
    assert max_abs_error(after[2], before[2]) > 1e-4


@needs_fast
def test_moving_the_model_drops_the_copies(random_models, stacked_on_cpu):
    bilm = ElmoBiLm(*random_models("tiny"), backend="fast", dtype=torch.bfloat16)
    bilm._flat_lstm()
    bilm._lowp_weights()
    assert bilm._derived.holds("lstm") and bilm._derived.holds("token_embedder")
    bilm.to(torch.float32)  # any _apply
    assert len(bilm._derived) == 0


# --- CUDA graphs per bucket: the plumbing, with a CPU stand-in for the capture -------------------------


class RerunRunner:
    """A CPU stand-in for cuda_graphs.CudaGraphRunner: replay() reruns the captured body (which must read
    only the bucket's static inputs, as a graph replays its kernels on them) and writes the results
    into the outputs the capture made, as a graph replay does."""

    captures = 0
    replays = 0

    def __init__(self, device):
        self.outputs = []

    def capture(self, body):
        type(self).captures += 1
        self.body = body
        self.outputs = [t.clone() for t in body()]

    def replay(self):
        type(self).replays += 1
        for out, new in zip(self.outputs, self.body()):
            out.copy_(new)
        return self.outputs


@pytest.fixture
def graphs_on_cpu(monkeypatch, planned_on_host):
    monkeypatch.setattr(cuda_graphs.CudaGraphCache, "runner", RerunRunner)
    monkeypatch.setattr(RerunRunner, "captures", 0)
    monkeypatch.setattr(RerunRunner, "replays", 0)
    return RerunRunner


@needs_fast
@pytest.mark.slow
def test_cuda_graph_buckets(random_models, graphs_on_cpu):
    files = random_models("tiny", exercise_clips=True)
    graphed = ElmoBiLm(*files, backend="fast", cuda_graphs=2)
    eager = ElmoBiLm(*files, backend="fast")
    a, a_other_words = [["the", "cat"], ["a"]], [["dog", "ran"], ["mat"]]  # one bucket: shapes and lengths
    b, c = [["x", "y", "z"]], [["on", "the", "mat", "."], [], ["über"]]
    steps = [  # batch, captures and replays so far
        (a, 0, 0),  # first seen: run as without graphs
        (a, 1, 1),  # seen again: captured, replayed
        (a_other_words, 1, 2),  # the same bucket, other tokens: the static inputs are refilled
        (b, 1, 2),
        (b, 2, 3),
        (a, 2, 4),
        (c, 2, 4),
        (c, 3, 5),  # a third bucket: the least recent one (b) goes
        (b, 4, 6),  # b was dropped from the graphs but remembered as seen: captured at once
    ]
    with torch.inference_mode():
        for i, (batch, captures, replays) in enumerate(steps):
            ids = batch_to_ids(batch)
            got, want = graphed(ids), eager(ids)
            assert torch.equal(got["mask"], want["mask"])
            for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
                assert max_abs_error(g, w) <= FP32, f"step {i}, layer {k}"
            assert (graphs_on_cpu.captures, graphs_on_cpu.replays) == (captures, replays), f"step {i}"
        assert len(graphed._graphs) == 2
        ids = batch_to_ids(b)
        first = graphed(ids)["activations"]
        assert graphs_on_cpu.captures == 4 and graphs_on_cpu.replays == 7
        again = graphed(ids)["activations"]
        assert all(x.data_ptr() != y.data_ptr() for x, y in zip(first, again))  # results are copies


@needs_fast
def test_cuda_graphs_follow_the_weights(random_models, graphs_on_cpu):
    files, other_files = random_models("tiny", seed=0), random_models("tiny", seed=1)
    graphed = ElmoBiLm(*files, backend="fast", cuda_graphs=4)
    other = ElmoBiLm(*other_files, backend="fast")
    ids = batch_to_ids([["the", "cat"], ["a"]])
    with torch.inference_mode():
        graphed(ids), graphed(ids)
    assert graphs_on_cpu.captures == 1 and len(graphed._graphs) == 1
    with torch.no_grad():
        for p, q in zip(graphed.parameters(), other.parameters()):
            p.copy_(q)
    with torch.inference_mode():
        got = graphed(ids)  # the graphs are gone with the old weights; the bucket counts as new
        assert graphs_on_cpu.captures == 1 and not graphed._graphs
        _assert_same(got["activations"], other(ids)["activations"], "after new weights")
        got = graphed(ids)
        assert graphs_on_cpu.captures == 2
        _assert_same(got["activations"], other(ids)["activations"], "captured with the new weights")


@needs_fast
def test_cuda_graphs_only_where_only_the_data_varies(random_models, graphs_on_cpu):
    files = random_models("tiny")
    ids = batch_to_ids([["the", "cat"]])
    for kwargs in (dict(stateful=True), dict(token_cache_size=100), dict()):
        bilm = ElmoBiLm(*files, backend="fast", cuda_graphs=2 if kwargs else 0, **kwargs)
        with torch.inference_mode():
            for _ in range(3):
                bilm(ids)
        assert not bilm._graphs
    assert graphs_on_cpu.captures == 0
    with pytest.raises(Exception, match="cuda_graphs must be >= 0"):
        ElmoBiLm(*files, backend="fast", cuda_graphs=-1)


@needs_fast
@pytest.mark.parametrize("variant", ["words+chars", "20 chars, tanh, 3 layers"])
@pytest.mark.slow
def test_host_planned_forward_and_graphs_of_a_manylangs_model(tmp_path, planned_on_host, graphs_on_cpu, variant):
    """An ELMoForManyLangs model (its own rows of ids: a word id and L characters) through the
    host-planned forward and its CUDA graph buckets, against the reference."""
    from manylangs_models import sentences as manylangs_sentences
    from manylangs_models import write_variant

    d = write_variant(variant, tmp_path / "model")
    ref = ElmoBiLm(model_dir=d, backend="reference")
    fast = ElmoBiLm(model_dir=d, backend="fast", cuda_graphs=2)
    batch = manylangs_sentences(["szó", "kutya", "ház", "的一", "один"])
    ids = fast.batch_to_ids(batch)
    with torch.inference_mode():
        want = ref(ids)
        for _ in range(3):  # eager (the bucket's first batch), captured, replayed
            got = fast(ids)
            assert torch.equal(got["mask"], want["mask"])
            _assert_same(got["activations"], want["activations"], f"{variant}, host-planned")
    assert graphs_on_cpu.captures == 1 and graphs_on_cpu.replays == 2
    assert planned_on_host and planned_on_host[-1].device.type == "cpu"
