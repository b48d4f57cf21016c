"""The char CNN room on the CPU: the fused op (elmo_fast.bilm.ops.char_cnn) against its oracle,
elmo_fast.bilm.reference.char_cnn_ref, forward and backward; and the reference's own gradients. The CUDA
kernels' tests: test_char_cnn_cuda.py."""

import os
import sys

import cli_process
import pytest
import torch
from char_cnn_cases import ELMO_FILTERS, TINY_FILTERS, elmo_ids, near_ties, random_cnn
from grad_checks import grads, leaves, poisoned
from hypothesis import given, settings
from hypothesis import strategies as st
from layouts import every_other, transposed_storage, wider
from repo_paths import REPO
from tolerances import assert_close, assert_grad_close

from elmo_fast import batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import char_cnn_ref

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)

NS = [0, 1, 7, pytest.param(333, marks=pytest.mark.slow)]  # (333 tokens: seconds a case, measured)
DTYPES = [torch.float32, torch.float64]
ACTIVATIONS = ["relu", "tanh"]


def check(ids, emb, weights, biases, activation, what):
    """Run the op and compare with the oracle in float64 on the same (rounded) inputs."""
    n, cols = ids.shape[0], sum(w.shape[0] for w in weights)
    poison = torch.full((n, cols), float("nan"), dtype=emb.dtype)  # the op's output often reuses this memory
    del poison
    out = ops.char_cnn(ids, emb, weights, biases, activation)
    assert out.shape == (n, cols) and out.dtype == emb.dtype and out.is_contiguous(), what
    assert not out.isnan().any(), f"{what}: NaN in output"
    expected = char_cnn_ref(ids, emb.double(), [w.double() for w in weights], [b.double() for b in biases], activation)
    assert_close(out, expected, what=what)
    return out


def trailing_run_ids(seed, vocab=262):
    """Every trailing-run start r in 0..49 with a random prefix (ids[r - 1] != the run's id), so
    the constant window exists for some widths and not for others; plus rows of a single id."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for r in range(50):
        c = int(torch.randint(0, vocab, (1,), generator=gen))
        row = torch.full((50,), c, dtype=torch.long)
        row[:r] = torch.randint(0, vocab, (r,), generator=gen)
        if r:
            row[r - 1] = (c + 1 + int(torch.randint(0, vocab - 1, (1,), generator=gen))) % vocab
        rows.append(row)
    for c in (0, 1, 7, 259, 260, 261):
        rows.append(torch.full((50,), c, dtype=torch.long))
    return torch.stack(rows)


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", NS)
def test_elmo_ids_match_reference(n, activation, dtype):
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, dtype, seed=n)
    check(elmo_ids(n, seed=n), emb, ws, bs, activation, f"char_cnn ELMo ids N={n} {activation} {dtype}")


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", NS)
def test_uniform_random_ids_match_reference(n, activation, dtype):
    # No layout at all: almost no trailing runs, every window computed term by term.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, dtype, seed=100 + n)
    ids = torch.randint(0, 262, (n, 50), generator=torch.Generator().manual_seed(n))
    check(ids, emb, ws, bs, activation, f"char_cnn random ids N={n} {activation} {dtype}")


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.slow
def test_every_trailing_run_start_matches_reference(activation, dtype):
    # Widths 1..7 against runs starting anywhere: windows inside the run, reaching into it, or none.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, dtype, seed=5)
    check(trailing_run_ids(seed=5), emb, ws, bs, activation, f"char_cnn trailing runs {activation} {dtype}")


@needs_extension
def test_single_id_rows_are_the_constant_window():
    # A row of one id c has one distinct window: act(b + sum_j T[j][c]) for every filter.
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=9)
    ids = torch.tensor([[c] * 50 for c in (0, 3, 261)])
    out = check(ids, emb, ws, bs, "relu", "char_cnn single-id rows")
    expected = torch.cat([torch.relu(b + torch.einsum("cd,ndj->cn", emb[[0, 3, 261]], w)) for w, b in zip(ws, bs)], 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@needs_extension
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiny_fixture_weights(tiny_files, fixture_sentences, dtype, activation):
    # The real bilm-tf tiny model's embedding and filters on the fixture's own sentences.
    w = load_weights(tiny_files[1], load_options(tiny_files[0]))
    emb, ws, bs = (
        w.char_embedding.to(dtype),
        [t.to(dtype) for t in w.conv_weights],
        [t.to(dtype) for t in w.conv_biases],
    )
    sentences = [s.split() for group in fixture_sentences for s in group]
    ids = batch_to_ids(sentences).view(-1, 50)
    check(ids, emb, ws, bs, activation, f"char_cnn tiny fixture {activation} {dtype}")


@needs_extension
@pytest.mark.parametrize("n", NS)
@pytest.mark.slow
def test_small_preset_weights_through_the_loader(random_models, n):
    # Random weights of the small model's shapes, written in the bilm-tf layout and read back.
    options_path, weights_path = random_models("small")
    w = load_weights(weights_path, load_options(options_path))
    assert [tuple(t.shape) for t in w.conv_weights] == [(num, 16, width) for width, num in ELMO_FILTERS]
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (n, 50), generator=torch.Generator().manual_seed(n))])
    check(
        ids, w.char_embedding, w.conv_weights, w.conv_biases, w.options.activation, f"char_cnn small preset N={2 * n}"
    )


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["sliced", "strided_rows", "transposed"])
@pytest.mark.parametrize("n", [1, 7, pytest.param(150, marks=pytest.mark.slow)])
def test_non_contiguous_inputs(n, layout, dtype):
    gen = torch.Generator().manual_seed(n)
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, dtype, seed=200 + n)
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (n, 50), generator=gen)])
    if layout == "sliced":  # ids out of [2N, 60], embedding columns, filters' widths and D, biases
        ids = wider(ids, 1, 6, 4, gen)
        emb = wider(emb, 1, 3, 2, gen)
        ws = [wider(wider(w, 2, 1, 2, gen), 1, 2, 1, gen) for w in ws]
        bs = [wider(b, 0, 3, 1, gen) for b in bs]
    elif layout == "strided_rows":
        ids, emb = every_other(ids, gen), every_other(emb, gen)
        ws, bs = [every_other(w, gen) for w in ws], [every_other(b, gen) for b in bs]
    else:
        ids, emb, ws = transposed_storage(ids), transposed_storage(emb), [transposed_storage(w) for w in ws]
    assert not ids.is_contiguous() and not emb.is_contiguous() and not any(w.is_contiguous() for w in ws)
    check(ids, emb, ws, bs, "relu", f"char_cnn {layout} N={n} {dtype}")


@needs_extension
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 24),
    dim=st.integers(1, 20),
    vocab=st.integers(1, 300),
    filters=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 70)), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
    activation=st.sampled_from(ACTIVATIONS),
    dtype=st.sampled_from(DTYPES),
    few_ids=st.booleans(),
)
@pytest.mark.slow
def test_random_shapes(n, dim, vocab, filters, seed, activation, dtype, few_ids):
    # Awkward widths (up to 50: a single window), filter counts that do not fill a slice, any V.
    emb, ws, bs = random_cnn(filters, dim, dtype, seed, vocab=vocab)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab, 3) if few_ids else vocab, (n, 50), generator=gen)  # few_ids: long runs
    check(ids, emb, ws, bs, activation, f"char_cnn N={n} D={dim} V={vocab} {filters} {activation} {dtype}")


@needs_extension
def test_unused_embedding_rows_are_never_read():
    # Only the ids present matter, as for the embedding lookup: NaN rows elsewhere change nothing.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, torch.float32, seed=3)
    ids = elmo_ids(40, seed=3)
    unused = torch.ones(262, dtype=torch.bool)
    unused[ids.unique()] = False
    poisoned = emb.clone()
    poisoned[unused] = float("nan")
    assert torch.equal(ops.char_cnn(ids, poisoned, ws, bs), ops.char_cnn(ids, emb, ws, bs))


@needs_extension
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_nan_and_huge_values_propagate_like_the_reference(activation):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=4)
    ids = elmo_ids(30, seed=4)
    nan_id = int(ids[ids > 0][0])  # a character some tokens have
    emb[nan_id, 1] = float("nan")
    bs[2][3] = float("nan")
    out = ops.char_cnn(ids, emb, ws, bs, activation)
    expected = char_cnn_ref(ids, emb, ws, bs, activation)
    assert expected.isnan().any() and not expected.isnan().all()
    assert torch.equal(out.isnan(), expected.isnan())
    finite = ~expected.isnan()
    torch.testing.assert_close(out[finite], expected[finite], rtol=0, atol=1e-5)
    # Weights too large for the fast max (a window could overflow): the careful path, same values.
    ws = [w * 1e30 for w in ws]
    out = ops.char_cnn(ids, emb, ws, bs, activation)
    expected = char_cnn_ref(ids, emb, ws, bs, activation)
    assert torch.equal(out.isnan(), expected.isnan())
    torch.testing.assert_close(out[finite], expected[finite], rtol=1e-5, atol=1e-5)


@needs_extension
@pytest.mark.slow
def test_many_chunks_and_threads_give_identical_results():
    # More tokens than one chunk (512) of staged ids; slices are split across threads, and each
    # output element is computed the same way whatever the split: bitwise equal to one thread.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, torch.float32, seed=6)
    ids = torch.cat(
        [elmo_ids(800, seed=6), torch.randint(0, 262, (300, 50), generator=torch.Generator().manual_seed(6))]
    )
    multi = check(ids, emb, ws, bs, "relu", "char_cnn N=1100")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = ops.char_cnn(ids, emb, ws, bs)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, multi)


ISA_SCRIPT = """
import sys, torch
from elmo_fast.bilm import ops
cases = torch.load(sys.argv[1])
torch.save([ops.char_cnn(*case) for case in cases], sys.argv[2])
"""


@needs_extension
@pytest.mark.parametrize("isa", ["avx2", "base"])
@pytest.mark.slow
def test_narrower_isa_variants_match_reference(isa, tmp_path):
    # The kernel picks its AVX-512, AVX2 or baseline (SSE2/NEON) variant once per process; a
    # subprocess capped by ELMO_FAST_CPU_ISA runs the narrower ones on this machine.
    cases = []
    for dtype in DTYPES:
        for activation in ACTIVATIONS:
            emb, ws, bs = random_cnn(ELMO_FILTERS + ((50, 70), (3, 17)), 16, dtype, seed=len(cases))
            ids = torch.cat([elmo_ids(150, seed=1), torch.randint(0, 262, (60, 50)), trailing_run_ids(seed=2)])
            cases.append((ids, emb, ws, bs, activation))
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=8)
    emb[int(ids[0, 3]), 0] = float("nan")  # the NaN-propagating path
    cases.append((ids, emb, ws, bs, "relu"))
    torch.save(cases, tmp_path / "cases.pt")
    root = str(REPO)
    env = {
        **os.environ,
        "ELMO_FAST_CPU_ISA": isa,
        "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    cli_process.run(
        [sys.executable, "-c", ISA_SCRIPT, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        env=env,
        check=True,
        timeout=300,
    )
    outs = torch.load(tmp_path / "out.pt")
    for (ids, emb, ws, bs, activation), out in zip(cases[:-1], outs):
        expected = char_cnn_ref(ids, emb.double(), [w.double() for w in ws], [b.double() for b in bs], activation)
        assert_close(out, expected, what=f"char_cnn {isa} {activation} {emb.dtype}")
    ids, emb, ws, bs, activation = cases[-1]
    expected = char_cnn_ref(ids, emb, ws, bs, activation)
    assert expected.isnan().any() and torch.equal(outs[-1].isnan(), expected.isnan())
    assert_close(outs[-1].nan_to_num(), expected.nan_to_num(), what=f"char_cnn {isa} NaN path")


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,activation", [(0, "relu"), (1, "tanh"), (7, "relu")])
def test_opcheck(n, activation, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=n)
    ids = elmo_ids(n, seed=n)
    torch.library.opcheck(torch.ops.elmo_fast.char_cnn.default, (ids, emb, ws, bs, activation))


@needs_extension
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch internals
@pytest.mark.slow
def test_torch_compile_fullgraph():
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=1)

    def f(ids, emb):
        return ops.char_cnn(ids, emb * 0.5, ws, bs).mean(dim=1)  # magnitude ~1, as TOL assumes

    compiled = torch.compile(f, fullgraph=True)
    for n in (3, 7):
        ids = elmo_ids(n, seed=n)
        expected = char_cnn_ref(ids, emb.double() * 0.5, [w.double() for w in ws], [b.double() for b in bs]).mean(1)
        assert_close(compiled(ids, emb), expected, what=f"compiled char_cnn N={n}")


@needs_extension
@pytest.mark.parametrize("length", [5, 7, 20, 49, 64])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.slow
def test_other_lengths_and_large_tables(length, dtype):
    """Rows of another length than allennlp's 50 (ELMoForManyLangs' max_characters_per_token) over a
    table of thousands of characters, as its models have: the same windows, L - w + 1 per width."""
    filters = [(w, n) for w, n in ELMO_FILTERS if w <= length]
    emb, ws, bs = random_cnn(filters, 6, dtype, seed=length, vocab=3001)
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(1, 3001, (333, length), generator=gen)
    cut = torch.randint(0, length, (333,), generator=gen)
    ids[torch.arange(length) >= cut.unsqueeze(1)] = 7  # a trailing run of one id, as padding makes
    ids[:5] = 0  # no token
    wide = torch.zeros(333, length + 3, dtype=torch.long)
    wide[:, 1 : length + 1] = ids  # a slice of a wider buffer, as a row's char part is
    check(wide[:, 1 : length + 1], emb, ws, bs, "relu", f"char_cnn L={length} {dtype}")


def backends():
    """Devices whose char_cnn kernels this build has and this machine can run."""
    return ["cpu"] + (["cuda"] if ops.HAS_CUDA_KERNELS and torch.cuda.is_available() else [])


@needs_extension
@pytest.mark.parametrize("length", [1, 2, 7, 49, 50, 64, 65, 200, 700])
@pytest.mark.slow
def test_token_lengths_pass_opcheck_on_every_backend(length):
    """One rule for the op on every backend and its fake: any L >= 1 ids per token, widths
    1 <= w_k <= L. opcheck runs the kernel against the fake (shapes, dtypes, strides, autograd)."""
    filters = [(w, n) for w, n in ELMO_FILTERS if w <= length][:4] + ([(length, 3)] if length > 7 else [])
    emb, ws, bs = random_cnn(filters, 5, torch.float32, seed=length)
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(0, 262, (9, length), generator=gen)
    ids[3, length // 2 :] = 261  # a trailing run
    ids[5] = 0
    for device in backends():
        args = (ids.to(device), emb.to(device), [w.to(device) for w in ws], [b.to(device) for b in bs], "tanh")
        torch.library.opcheck(torch.ops.elmo_fast.char_cnn.default, args)
        out = ops.char_cnn(*args)
        assert_close(
            out,
            char_cnn_ref(ids, emb.double(), [w.double() for w in ws], [b.double() for b in bs], "tanh"),
            what=f"char_cnn L={length} on {device}",
        )


@needs_extension
def test_token_lengths_refused_alike_on_every_backend():
    """The same one-line errors from every backend's kernel and from the fake (meta tensors)."""
    emb, ws, bs = random_cnn([(1, 3)], 4, torch.float32, seed=0)
    for device in backends() + ["meta"]:
        args = (
            torch.zeros(2, 0, dtype=torch.long, device=device),
            emb.to(device),
            [w.to(device) for w in ws],
            [b.to(device) for b in bs],
            "relu",
        )
        for op, grad in (("char_cnn", ()), ("char_cnn_backward", (torch.zeros(2, 3, device=device),))):
            with pytest.raises(
                RuntimeError,
                match=rf"{op}: char_ids must have at least one character id per token "
                r"\(shape \[N, L\]\), got shape \[2, 0\]",
            ):
                getattr(torch.ops.elmo_fast, op).default(*grad, *args)
        wide = [torch.zeros(3, 4, 8, device=device)]
        with pytest.raises(
            RuntimeError,
            match=r"char_cnn: conv_weights\[0\] must have a width in 1..7 "
            r"\(the characters per token of char_ids, \[2, 7\]\), got shape \[3, 4, 8\]",
        ):
            torch.ops.elmo_fast.char_cnn.default(
                torch.zeros(2, 7, dtype=torch.long, device=device), emb.to(device), wide, [bs[0].to(device)], "relu"
            )


def call(ids=None, emb=None, ws=None, bs=None, activation="relu"):
    """The op on a valid tiny model with one argument replaced."""
    e, w, b = random_cnn(TINY_FILTERS, 4, torch.float32, seed=0)
    return ops.char_cnn(
        elmo_ids(3, seed=0) if ids is None else ids,
        e if emb is None else emb,
        w if ws is None else ws,
        b if bs is None else bs,
        activation,
    )


@needs_extension
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(ids=torch.zeros(3, 50, 1, dtype=torch.long)), r"char_cnn: char_ids must have 2 dims, got 3"),
        (
            dict(ids=torch.zeros(3, 0, dtype=torch.long)),
            r"char_cnn: char_ids must have at least one character id per token",
        ),
        (
            dict(ids=torch.zeros(3, 4, dtype=torch.long)),
            r"char_cnn: conv_weights\[4\] must have a width in 1..4 \(the characters",
        ),
        (dict(ids=torch.zeros(3, 50)), r"char_cnn: char_ids must have dtype int64, got float32"),
        (dict(ids=torch.zeros(3, 50, dtype=torch.int32)), r"char_cnn: char_ids must have dtype int64, got int32"),
        (
            dict(ids=torch.full((3, 50), 262)),
            r"char_cnn: char_ids must hold ids in \[0, 262\) .*got values in \[262, 262\]",
        ),
        (dict(ids=torch.full((3, 50), -1)), r"char_cnn: char_ids must hold ids in \[0, 262\)"),
        (dict(emb=torch.zeros(262 * 4)), r"char_cnn: char_embedding must have 2 dims, got 1"),
        (
            dict(emb=torch.zeros(262, 4, dtype=torch.bfloat16)),
            r"char_cnn: char_embedding has dtype bfloat16; supported",
        ),
        (dict(emb=torch.zeros(262, 5)), r"char_cnn: conv_weights\[0\] must have D = 5 input channels"),
        (
            dict(ws=[torch.zeros(4, 4)] + [torch.zeros(n, 4, w) for w, n in TINY_FILTERS[1:]]),
            r"char_cnn: conv_weights\[0\] must have 3 dims",
        ),
        (
            dict(ws=[torch.zeros(4, 4, 51)] + [torch.zeros(n, 4, w) for w, n in TINY_FILTERS[1:]]),
            r"char_cnn: conv_weights\[0\] must have a width in 1..50",
        ),
        (
            dict(ws=[torch.zeros(n, 4, w, dtype=torch.float64) for w, n in TINY_FILTERS]),
            r"char_cnn: conv_weights\[0\] must have the dtype of char_embedding \(float32\), got float64",
        ),
        (
            dict(
                bs=[torch.zeros(n) for _, n in TINY_FILTERS[:2]]
                + [torch.zeros(15)]
                + [torch.zeros(n) for _, n in TINY_FILTERS[3:]]
            ),
            r"char_cnn: conv_biases\[2\] must have shape \[16\]",
        ),
        (dict(bs=[torch.zeros(n, 1) for _, n in TINY_FILTERS]), r"char_cnn: conv_biases\[0\] must have shape \[4\]"),
        (
            dict(bs=[torch.zeros(n) for _, n in TINY_FILTERS[:-1]]),
            r"char_cnn: conv_weights and conv_biases must have the same length .*got 5 and 4",
        ),
        (dict(ws=[], bs=[]), r"char_cnn: conv_weights must hold at least one convolution"),
        (dict(activation="gelu"), r"char_cnn: activation must be \"relu\" or \"tanh\", got \"gelu\""),
    ],
)
def test_errors_name_the_argument(kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        call(**kwargs)


def test_char_cnn_without_extension_says_how_to_build(monkeypatch):
    from elmo_fast.errors import ExtensionNotBuiltError

    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    with pytest.raises(ExtensionNotBuiltError, match=r"pip install --no-build-isolation -e \."):
        ops.char_cnn(
            torch.zeros(1, 50, dtype=torch.long), torch.zeros(262, 4), [torch.zeros(1, 4, 1)], [torch.zeros(1)]
        )


# --- backward pass, against the reference's autograd (tests/support/grad_checks.py) ---------------


def check_char_cnn_grads(ids, emb, ws, bs, activation, what, seed=0):
    K = len(ws)
    dtype = emb.dtype
    gen = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(ids.shape[0], sum(w.shape[0] for w in ws), generator=gen, dtype=torch.float64)
    if dtype != torch.float64:
        tied = near_ties(ids, emb, ws, bs, activation, margin=1e-4)
        assert tied.double().mean() < 0.05, f"{what}: too many near-ties ({tied.double().mean():.1%}) to test"
        grad_out[tied] = 0
    inputs = [emb, *ws, *bs]

    def fast(e, *c):
        return ops.char_cnn(ids, e, list(c[:K]), list(c[K:]), activation)

    def ref(e, *c):
        return char_cnn_ref(ids, e, list(c[:K]), list(c[K:]), activation)

    got, _ = grads(fast, leaves(inputs), weights=[grad_out.to(dtype)])
    want, _ = grads(ref, leaves(inputs, torch.float64), weights=[grad_out])
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.dtype == dtype and g.shape == inputs[i].shape, what
        assert_grad_close(g, e, dtype=dtype, what=f"{what} input {i}")
    return got


@needs_extension
@poisoned
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.slow
def test_char_cnn_gradcheck(activation):
    # Small filters in float64, ELMo-like ids (trailing padding runs, a "no token" row) and random ones.
    emb, ws, bs = random_cnn([(1, 3), (2, 5), (3, 4), (7, 2)], 3, torch.float64, seed=1, vocab=40)
    ids = torch.cat(
        [elmo_ids(7, seed=3) % 40, torch.randint(0, 40, (2, 50), generator=torch.Generator().manual_seed(4))]
    )
    K = len(ws)
    inputs = leaves([emb, *ws, *bs])
    assert torch.autograd.gradcheck(lambda e, *c: ops.char_cnn(ids, e, list(c[:K]), list(c[K:]), activation), inputs)


@needs_extension
@poisoned
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("n", [1, 2, 37, 300])
@pytest.mark.slow
def test_char_cnn_grads_match_reference(n, activation, dtype):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, dtype, seed=n)
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (1, 50), generator=torch.Generator().manual_seed(n))])
    check_char_cnn_grads(ids, emb, ws, bs, activation, f"char_cnn grads N={n} {activation} {dtype}", seed=n)


@needs_extension
@poisoned
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.slow
def test_char_cnn_grads_elmo_filters(dtype):
    # The small/original models' 2048 filters (32 fp32 slices of up to width 7), D = 16.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, dtype, seed=5)
    check_char_cnn_grads(elmo_ids(200, seed=5), emb, ws, bs, "relu", f"char_cnn ELMo filters {dtype}")


@needs_extension
@poisoned
@pytest.mark.parametrize("layout", ["sliced", "transposed"])
@pytest.mark.slow
def test_char_cnn_grads_non_contiguous(layout):
    gen = torch.Generator().manual_seed(9)
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=9)
    ids = elmo_ids(40, seed=9)
    if layout == "sliced":
        ids, emb = wider(ids, 1, 3, 2, gen), wider(emb, 1, 2, 1, gen)
        ws = [wider(wider(w, 2, 1, 2, gen), 1, 2, 1, gen) for w in ws]
        bs = [wider(b, 0, 3, 1, gen) for b in bs]
    else:
        ids, emb, ws = transposed_storage(ids), transposed_storage(emb), [transposed_storage(w) for w in ws]
    got = check_char_cnn_grads(ids, emb, ws, bs, "tanh", f"char_cnn grads {layout}")
    assert all(g.is_contiguous() for g in got)


@needs_extension
@poisoned
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(
    "length", [1, 7, 20, pytest.param(49, marks=pytest.mark.slow), pytest.param(70, marks=pytest.mark.slow)]
)
def test_char_cnn_grads_other_lengths(length, dtype):
    """Rows of another length than 50 (ELMoForManyLangs' max_characters_per_token) over a table of
    thousands of characters: the backward recomputes each filter's max window over L - w + 1 of them.
    At L = 70 a filter of width 65 (a window of more table entries than the 64 the fast max's overflow
    bound once assumed) takes part."""
    filters = [(w, n) for w, n in [(1, 4), (2, 5), (3, 3), (7, 6), (length, 2), (65, 3)] if w <= length]
    emb, ws, bs = random_cnn(filters, 5, dtype, seed=length, vocab=3001)
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(1, 3001, (60, length), generator=gen)
    cut = torch.randint(1, length + 1, (60,), generator=gen)
    ids[torch.arange(length) >= cut.unsqueeze(1)] = 7  # a trailing run of one id, as padding makes
    ids[:2] = 0  # no token
    check_char_cnn_grads(
        ids, emb, ws, bs, "relu" if length % 2 else "tanh", f"char_cnn grads L={length} {dtype}", seed=length
    )


@needs_extension
@poisoned
def test_char_cnn_grads_of_unused_rows_and_no_tokens():
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=2)
    ids = elmo_ids(20, seed=2)
    emb_leaf = emb.clone().requires_grad_()
    ops.char_cnn(ids, emb_leaf, ws, bs).square().sum().backward()
    unused = torch.ones(262, dtype=torch.bool)
    unused[ids.unique()] = False
    assert torch.all(emb_leaf.grad[unused] == 0) and emb_leaf.grad[~unused].abs().sum() > 0
    empty = leaves([emb, *ws, *bs])
    out = ops.char_cnn(ids[:0], empty[0], empty[1:6], empty[6:])
    got = torch.autograd.grad(out.sum(), empty)
    assert all(torch.all(g == 0) for g in got)


@needs_extension
@poisoned
@pytest.mark.slow
def test_char_cnn_expanded_gradient():
    # out.sum()'s gradient is an expanded tensor (stride 0): the backward reads it as rows.
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float64, seed=3)
    ids = elmo_ids(30, seed=3)
    a = leaves([emb])
    b = leaves([emb])
    g_sum = torch.autograd.grad(ops.char_cnn(ids, a[0], ws, bs).sum(), a)[0]
    g_ref = torch.autograd.grad(char_cnn_ref(ids, b[0], ws, bs).sum(), b)[0]
    assert_grad_close(g_sum, g_ref, what="char_cnn expanded grad")


# --- the reference's own gradients, under gradcheck in float64 ------------------------------------


@pytest.mark.slow
def test_gradcheck_char_cnn(mini):
    ids = batch_to_ids([["ab", "über", "x", "a" * 60]])[0]
    ids = torch.cat([ids, torch.zeros(1, 50, dtype=torch.long)])  # and a "no token" row
    inputs = leaves([mini.char_embedding, *mini.conv_weights, *mini.conv_biases])
    K = len(mini.conv_weights)

    def f(emb, *convs):
        return char_cnn_ref(ids, emb, list(convs[:K]), list(convs[K:]), "relu")

    assert torch.autograd.gradcheck(f, inputs)
