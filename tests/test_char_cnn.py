"""The fused char CNN (elmo_fast.bilm.ops.char_cnn) against its oracle, elmo_fast.bilm.reference.char_cnn_ref."""
import os
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elmo_fast import batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops
from elmo_fast.bilm.char_ids import BOS_TOKEN, EOS_TOKEN
from elmo_fast.bilm.reference import char_cnn_ref
from elmo_fast.formats.random_models import PRESETS
from tolerances import assert_close
from repo_paths import REPO

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")

ELMO_FILTERS = PRESETS["small"].filters  # the small and original models' char CNN (D = 16)
TINY_FILTERS = PRESETS["tiny"].filters
NS = [0, 1, 7, 333]
DTYPES = [torch.float32, torch.float64]
ACTIVATIONS = ["relu", "tanh"]


def random_cnn(filters, dim, dtype, seed, vocab=262):
    """Embedding [V, D] (row 0 zero, as ELMo's), K weights [n, D, w] and biases [n], outputs ~1."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(vocab, dim, generator=gen, dtype=torch.float64)
    emb[0] = 0
    weights = [torch.randn(n, dim, w, generator=gen, dtype=torch.float64) / (w * dim) ** 0.5 for w, n in filters]
    biases = [0.3 * torch.randn(n, generator=gen, dtype=torch.float64) for _, n in filters]
    return emb.to(dtype), [w.to(dtype) for w in weights], [b.to(dtype) for b in biases]


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


def random_word(n_bytes, rng):
    """A string of exactly n_bytes UTF-8 bytes mixing 1-, 2-, 3- and 4-byte characters."""
    chars = []
    left = n_bytes
    while left:
        size = rng.choice([s for s in (1, 1, 1, 2, 3, 4) if s <= left])
        chars.append({1: rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;'-"),
                      2: rng.choice("éüñçßøΩжא"), 3: rng.choice("日本語€中文ह"), 4: rng.choice("😀🙂𝄞🚀")}[size])
        left -= size
    word = "".join(chars)
    assert len(word.encode("utf-8")) == n_bytes
    return word


def elmo_ids(n, seed):
    """[n, 50] ids as batch_to_ids makes them: every byte length 0..60 (cut to 48 by the mapper), the
    sentence marks, multibyte text, and all-zero "no token" rows (padding of shorter sentences)."""
    rng = random.Random(seed)
    words = [random_word(length, rng) for length in range(61)]
    words += [BOS_TOKEN, EOS_TOKEN, "naïve", "Ça", "日本語", "🙂", "a", ".", "the", "Prevention", "U.S."]
    sentences = [rng.sample(words, 12), ["x"]]  # the second pads with 11 no-token rows
    while sum(len(s) for s in sentences) < n:
        sentences.append(rng.sample(words, rng.randint(1, 12)))
    ids = batch_to_ids(sentences).view(-1, 50)  # rows of shorter sentences are zero
    ids = ids[torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(seed))[:n]]
    if n >= 7:
        ids[-1] = 0  # at least one no-token row
    return ids


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
    emb, ws, bs = w.char_embedding.to(dtype), [t.to(dtype) for t in w.conv_weights], [t.to(dtype) for t in w.conv_biases]
    sentences = [s.split() for group in fixture_sentences for s in group]
    ids = batch_to_ids(sentences).view(-1, 50)
    check(ids, emb, ws, bs, activation, f"char_cnn tiny fixture {activation} {dtype}")


@needs_extension
@pytest.mark.parametrize("n", NS)
def test_small_preset_weights_through_the_loader(random_models, n):
    # Random weights of the small model's shapes, written in the bilm-tf layout and read back.
    options_path, weights_path = random_models("small")
    w = load_weights(weights_path, load_options(options_path))
    assert [tuple(t.shape) for t in w.conv_weights] == [(num, 16, width) for width, num in ELMO_FILTERS]
    ids = torch.cat([elmo_ids(n, seed=n), torch.randint(0, 262, (n, 50), generator=torch.Generator().manual_seed(n))])
    check(ids, w.char_embedding, w.conv_weights, w.conv_biases, w.options.activation,
          f"char_cnn small preset N={2 * n}")


def wider(t, dim, left, right, gen):
    """t as a slice along `dim` of a buffer with other (random) data around it."""
    shape = list(t.shape)
    shape[dim] += left + right
    buf = (torch.randint(0, 262, shape, generator=gen) if t.dtype == torch.long
           else torch.randn(shape, generator=gen, dtype=t.dtype))
    index = [slice(None)] * t.dim()
    index[dim] = slice(left, left + t.shape[dim])
    buf[tuple(index)] = t
    return buf[tuple(index)]


def every_other(t, gen):
    """t as every other row of a buffer twice as long."""
    buf = (torch.randint(0, 262, (2 * t.shape[0], *t.shape[1:]), generator=gen) if t.dtype == torch.long
           else torch.randn(2 * t.shape[0], *t.shape[1:], generator=gen, dtype=t.dtype))
    buf[::2] = t
    return buf[::2]


def transposed_storage(t):
    """Same values, reversed dim order in memory (no dim has unit stride unless size 1)."""
    return t.permute(*reversed(range(t.dim()))).contiguous().permute(*reversed(range(t.dim())))


@needs_extension
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["sliced", "strided_rows", "transposed"])
@pytest.mark.parametrize("n", [1, 7, 150])
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
@given(n=st.integers(0, 24), dim=st.integers(1, 20), vocab=st.integers(1, 300),
       filters=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 70)), min_size=1, max_size=4),
       seed=st.integers(0, 2**31 - 1), activation=st.sampled_from(ACTIVATIONS), dtype=st.sampled_from(DTYPES),
       few_ids=st.booleans())
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
def test_many_chunks_and_threads_give_identical_results():
    # More tokens than one chunk (512) of staged ids; slices are split across threads, and each
    # output element is computed the same way whatever the split: bitwise equal to one thread.
    emb, ws, bs = random_cnn(ELMO_FILTERS, 16, torch.float32, seed=6)
    ids = torch.cat([elmo_ids(800, seed=6), torch.randint(0, 262, (300, 50), generator=torch.Generator().manual_seed(6))])
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
    env = {**os.environ, "ELMO_FAST_CPU_ISA": isa,
           "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    subprocess.run([sys.executable, "-c", ISA_SCRIPT, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
                   env=env, check=True, timeout=300)
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
    wide[:, 1:length + 1] = ids  # a slice of a wider buffer, as a row's char part is
    check(wide[:, 1:length + 1], emb, ws, bs, "relu", f"char_cnn L={length} {dtype}")


def backends():
    """Devices whose char_cnn kernels this build has and this machine can run."""
    return ["cpu"] + (["cuda"] if ops.HAS_CUDA_KERNELS and torch.cuda.is_available() else [])


@needs_extension
@pytest.mark.parametrize("length", [1, 2, 7, 49, 50, 64, 65, 200, 700])
def test_token_lengths_pass_opcheck_on_every_backend(length):
    """One rule for the op on every backend and its fake: any L >= 1 ids per token, widths
    1 <= w_k <= L. opcheck runs the kernel against the fake (shapes, dtypes, strides, autograd)."""
    filters = [(w, n) for w, n in ELMO_FILTERS if w <= length][:4] + ([(length, 3)] if length > 7 else [])
    emb, ws, bs = random_cnn(filters, 5, torch.float32, seed=length)
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(0, 262, (9, length), generator=gen)
    ids[3, length // 2:] = 261  # a trailing run
    ids[5] = 0
    for device in backends():
        args = (ids.to(device), emb.to(device), [w.to(device) for w in ws], [b.to(device) for b in bs], "tanh")
        torch.library.opcheck(torch.ops.elmo_fast.char_cnn.default, args)
        out = ops.char_cnn(*args)
        assert_close(out, char_cnn_ref(ids, emb.double(), [w.double() for w in ws], [b.double() for b in bs], "tanh"),
                     what=f"char_cnn L={length} on {device}")


@needs_extension
def test_token_lengths_refused_alike_on_every_backend():
    """The same one-line errors from every backend's kernel and from the fake (meta tensors)."""
    emb, ws, bs = random_cnn([(1, 3)], 4, torch.float32, seed=0)
    for device in backends() + ["meta"]:
        args = (torch.zeros(2, 0, dtype=torch.long, device=device), emb.to(device), [w.to(device) for w in ws],
                [b.to(device) for b in bs], "relu")
        for op, grad in (("char_cnn", ()), ("char_cnn_backward", (torch.zeros(2, 3, device=device),))):
            with pytest.raises(RuntimeError, match=rf"{op}: char_ids must have at least one character id per token "
                                                   r"\(shape \[N, L\]\), got shape \[2, 0\]"):
                getattr(torch.ops.elmo_fast, op).default(*grad, *args)
        wide = [torch.zeros(3, 4, 8, device=device)]
        with pytest.raises(RuntimeError, match=r"char_cnn: conv_weights\[0\] must have a width in 1..7 "
                                               r"\(the characters per token of char_ids, \[2, 7\]\), got shape \[3, 4, 8\]"):
            torch.ops.elmo_fast.char_cnn.default(torch.zeros(2, 7, dtype=torch.long, device=device), emb.to(device),
                                                 wide, [bs[0].to(device)], "relu")


def call(ids=None, emb=None, ws=None, bs=None, activation="relu"):
    """The op on a valid tiny model with one argument replaced."""
    e, w, b = random_cnn(TINY_FILTERS, 4, torch.float32, seed=0)
    return ops.char_cnn(elmo_ids(3, seed=0) if ids is None else ids, e if emb is None else emb,
                        w if ws is None else ws, b if bs is None else bs, activation)


@needs_extension
@pytest.mark.parametrize("kwargs,match", [
    (dict(ids=torch.zeros(3, 50, 1, dtype=torch.long)), r"char_cnn: char_ids must have 2 dims, got 3"),
    (dict(ids=torch.zeros(3, 0, dtype=torch.long)), r"char_cnn: char_ids must have at least one character id per token"),
    (dict(ids=torch.zeros(3, 4, dtype=torch.long)), r"char_cnn: conv_weights\[4\] must have a width in 1..4 \(the characters"),
    (dict(ids=torch.zeros(3, 50)), r"char_cnn: char_ids must have dtype int64, got float32"),
    (dict(ids=torch.zeros(3, 50, dtype=torch.int32)), r"char_cnn: char_ids must have dtype int64, got int32"),
    (dict(ids=torch.full((3, 50), 262)), r"char_cnn: char_ids must hold ids in \[0, 262\) .*got values in \[262, 262\]"),
    (dict(ids=torch.full((3, 50), -1)), r"char_cnn: char_ids must hold ids in \[0, 262\)"),
    (dict(emb=torch.zeros(262 * 4)), r"char_cnn: char_embedding must have 2 dims, got 1"),
    (dict(emb=torch.zeros(262, 4, dtype=torch.bfloat16)), r"char_cnn: char_embedding has dtype bfloat16; supported"),
    (dict(emb=torch.zeros(262, 5)), r"char_cnn: conv_weights\[0\] must have D = 5 input channels"),
    (dict(ws=[torch.zeros(4, 4)] + [torch.zeros(n, 4, w) for w, n in TINY_FILTERS[1:]]),
     r"char_cnn: conv_weights\[0\] must have 3 dims"),
    (dict(ws=[torch.zeros(4, 4, 51)] + [torch.zeros(n, 4, w) for w, n in TINY_FILTERS[1:]]),
     r"char_cnn: conv_weights\[0\] must have a width in 1..50"),
    (dict(ws=[torch.zeros(n, 4, w, dtype=torch.float64) for w, n in TINY_FILTERS]),
     r"char_cnn: conv_weights\[0\] must have the dtype of char_embedding \(float32\), got float64"),
    (dict(bs=[torch.zeros(n) for _, n in TINY_FILTERS[:2]] + [torch.zeros(15)] + [torch.zeros(n) for _, n in TINY_FILTERS[3:]]),
     r"char_cnn: conv_biases\[2\] must have shape \[16\]"),
    (dict(bs=[torch.zeros(n, 1) for _, n in TINY_FILTERS]), r"char_cnn: conv_biases\[0\] must have shape \[4\]"),
    (dict(bs=[torch.zeros(n) for _, n in TINY_FILTERS[:-1]]),
     r"char_cnn: conv_weights and conv_biases must have the same length .*got 5 and 4"),
    (dict(ws=[], bs=[]), r"char_cnn: conv_weights must hold at least one convolution"),
    (dict(activation="gelu"), r"char_cnn: activation must be \"relu\" or \"tanh\", got \"gelu\""),
])
def test_errors_name_the_argument(kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        call(**kwargs)


def test_char_cnn_without_extension_says_how_to_build(monkeypatch):
    from elmo_fast.errors import ExtensionNotBuiltError

    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    with pytest.raises(ExtensionNotBuiltError, match=r"pip install --no-build-isolation -e \."):
        ops.char_cnn(torch.zeros(1, 50, dtype=torch.long), torch.zeros(262, 4), [torch.zeros(1, 4, 1)], [torch.zeros(1)])
