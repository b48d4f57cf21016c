"""The CUDA kernels against their references, and the CPU-only build's error for device cuda.

Two targets run the same tests:
  * "cuda": torch.ops.elmo_fast on a GPU (skips, saying why, without a GPU or CUDA kernels);
  * "emulated": the same kernels and bindings compiled for the CPU emulator
    (tests/cuda_emulation, op library elmo_fast_emu, CPU tensors), for machines without a GPU. A
    representative subset runs by default (tests marked @emulated_by_default: every kernel forward and
    backward, odd shapes, bf16); ELMO_FAST_CUDA_EMULATION=1 runs every case. The emulator's build is
    cached across runs (torch's extension cache) and made once per session.
GPU tests run with TF32 off (the fp32 bar is 1e-5) and compare with the reference on the CPU in
float64 (the op's own error) and, where they say so, with the reference on the same device.
Outputs come from a poisoned allocator: the caching allocator's free blocks are filled with NaN
first, so an element a kernel fails to write shows up as NaN. The build tests run everywhere.
"""
import dataclasses
import math
import os
import random

import numpy as np
import pytest
import torch

from elmo_fast import ElmoBiLm, ElmoEmbedder, batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops, reference
from elmo_fast.bilm import model as model_module
from elmo_fast.errors import ElmoFastError, ExtensionNotBuiltError, InputError
from elmo_fast.bilm.reference import (add_sentence_boundaries, bilm_ref, bilstm_ref, char_cnn_ref, flat_lstm_weights,
                                 highway_gate_ref, highway_ref, layer0_gates_ref)
from elmo_fast.formats.random_models import PRESETS
from rounding_model import modeled_error
from tolerances import MODEL_BF16, MODEL_BOUNDS, TOL, assert_close, fp32_model_bound, max_abs_error

HAS_GPU = torch.cuda.is_available()
CUDA_SKIP_REASON = ("no CUDA GPU visible to torch" if not HAS_GPU else
                    f"elmo_fast._C has no CUDA kernels: {ops.cuda_kernels_missing_reason()}")
#: every emulated case, not only the default subset (the emulator is slow: kernels run thread by thread)
EMULATION_FULL = os.environ.get("ELMO_FAST_CUDA_EMULATION") == "1"
LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


# --- the build: runs on every machine ------------------------------------------------------------


@pytest.mark.skipif(ops.HAS_CUDA_KERNELS, reason="this build has its CUDA kernels")
def test_cpu_only_build_says_how_to_get_cuda():
    with pytest.raises(ExtensionNotBuiltError) as info:
        ops.require_cuda_kernels()
    message = str(info.value)
    assert "pip install --no-build-isolation -e ." in message
    assert "nvcc" in message
    if torch.version.cuda is None:
        assert "CUDA build of torch" in message


def test_require_cuda_kernels_names_each_cause(monkeypatch):
    monkeypatch.setattr(ops, "HAS_EXTENSION", True)
    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", True)
    ops.require_cuda_kernels()  # nothing missing: no error
    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ExtensionNotBuiltError, match="CPU-only build.*CUDA build of torch.*nvcc.*"
                                                     r"pip install --no-build-isolation -e \."):
        ops.require_cuda_kernels()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ExtensionNotBuiltError, match="no nvcc, or ELMO_FAST_SKIP_CUDA_BUILD=1.*"
                                                     r"pip install --no-build-isolation -e \."):
        ops.require_cuda_kernels()
    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    with pytest.raises(ExtensionNotBuiltError, match=r"elmo_fast._C is not available.*pip install"):
        ops.require_cuda_kernels()
    assert issubclass(ExtensionNotBuiltError, ValueError)


@pytest.mark.skipif(HAS_GPU, reason="torch sees a GPU here")
def test_embedder_on_cuda_without_gpu_says_how(tiny_files):
    with pytest.raises(ElmoFastError, match="torch sees no CUDA GPU") as info:
        ElmoEmbedder(*tiny_files, device="cuda")
    if torch.version.cuda is None:
        assert "pip install --no-build-isolation -e ." in str(info.value)


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built")
def test_ops_on_cuda_tensors_without_kernels_say_how(monkeypatch):
    class FakeCudaTensor:  # a CPU-only torch cannot make a CUDA tensor; the wrappers only ask .is_cuda
        is_cuda = True

    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", False)
    with pytest.raises(ExtensionNotBuiltError, match=r"CUDA kernels are not available.*pip install"):
        ops.highway_gate(FakeCudaTensor(), FakeCudaTensor())
    with pytest.raises(ExtensionNotBuiltError, match=r"CUDA kernels are not available"):
        ops.highway(FakeCudaTensor(), [], [], FakeCudaTensor(), FakeCudaTensor())


# --- targets, allocator poisoning, layouts -------------------------------------------------------


@dataclasses.dataclass
class Target:
    name: str
    device: torch.device
    lib: object  # torch.ops.elmo_fast or torch.ops.elmo_fast_emu

    def op(self, name):
        return getattr(self.lib, name).default

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def emulated_by_default(when=None):
    """Runs the decorated test's "emulated" cases in the default test run: all of them, or those whose
    parameters ``when(**params)`` accepts. Its other emulated cases, and every emulated case of an
    undecorated test, run with ELMO_FAST_CUDA_EMULATION=1."""
    def mark(test):
        test.emulated_by_default = when or (lambda **params: True)
        return test

    return mark


def in_default_emulated_subset(request) -> bool:
    when = getattr(request.function, "emulated_by_default", None)
    if when is None:
        return False
    callspec = getattr(request.node, "callspec", None)
    params = {k: v for k, v in callspec.params.items() if k != "target"} if callspec is not None else {}
    return bool(when(**params))


@pytest.fixture(scope="session")
def emulated_target():
    from cuda_emulation.build import cuda_include_dir, load_emulation

    if cuda_include_dir() is None:
        pytest.skip("the CPU emulation of the CUDA kernels needs the CUDA headers (cuda_runtime_api.h); set CUDA_HOME")
    load_emulation()
    return Target("emulated", torch.device("cpu"), torch.ops.elmo_fast_emu)


@pytest.fixture(params=["cuda", "emulated"])
def target(request):
    if request.param == "cuda":
        if not (HAS_GPU and ops.HAS_CUDA_KERNELS):
            pytest.skip(CUDA_SKIP_REASON)
        return Target("cuda", torch.device("cuda"), torch.ops.elmo_fast)
    if not (EMULATION_FULL or in_default_emulated_subset(request)):
        pytest.skip("emulated case outside the default subset: ELMO_FAST_CUDA_EMULATION=1 runs every case")
    return request.getfixturevalue("emulated_target")


@pytest.fixture
def cuda_target():
    if not (HAS_GPU and ops.HAS_CUDA_KERNELS):
        pytest.skip(CUDA_SKIP_REASON)
    return Target("cuda", torch.device("cuda"), torch.ops.elmo_fast)


@pytest.fixture(autouse=True)
def exact_fp32():
    """TF32 off for every test here: fp32 GEMMs and convolutions in full fp32, as the bar needs."""
    if not HAS_GPU:
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def poison(target: Target) -> None:
    """Fill the CUDA caching allocator's free memory with NaN, so that the outputs and buffers an
    op allocates next start as NaN instead of as whatever was there (often zeros)."""
    if not target.is_cuda:
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    keep = []
    for size, count in ((1 << 18, 16), (1 << 24, 8)):  # 1 MiB blocks (small pool), 64 MiB (large pool)
        keep += [torch.full((size,), float("nan"), device=target.device) for _ in range(count)]
    del keep  # back to the cache, still NaN


def same_layout_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """t on `device` with t's sizes, strides and storage offset (Tensor.to makes a slice dense)."""
    if t.device == device:
        return t
    storage = t.new_empty(0).set_(t.untyped_storage())  # the whole storage as a 1-d tensor
    return storage.to(device).as_strided(t.size(), t.stride(), t.storage_offset())


def no_nan(t: torch.Tensor, what: str) -> None:
    assert not t.isnan().any(), f"{what}: NaN in the output (an unwritten element of a poisoned buffer?)"


# --- highway_gate and highway ---------------------------------------------------------------------


@emulated_by_default(lambda n, h, layout, dtype: (n, h) in ((7, 16), (129, 257)) and layout == "sliced"
                     and dtype in (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "strided_rows", "transposed"])
@pytest.mark.parametrize("n,h", [(0, 3), (1, 1), (2, 3), (7, 16), (129, 257), (33, 2048)])
def test_highway_gate(target, n, h, layout, dtype):
    from test_ops import highway_inputs

    projected, x = highway_inputs(n, h, dtype, seed=31 * n + h, layout=layout)
    what = f"{target.name} highway_gate {layout} N={n} H={h} {dtype}"
    poison(target)
    out = target.op("highway_gate")(same_layout_on(projected, target.device), same_layout_on(x, target.device))
    assert out.shape == (n, h) and out.dtype == dtype and out.is_contiguous() and out.device == target.device, what
    assert_close(out, highway_gate_ref(projected.double(), x.double()), what=what)


@emulated_by_default()
def test_highway_gate_propagates_nan_and_inf(target):
    projected = torch.tensor([[float("nan"), 1.0, 0.0, 0.0], [1.0, float("inf"), 0.0, float("-inf")]])
    x = torch.tensor([[1.0, 1.0], [2.0, 3.0]])
    out = target.op("highway_gate")(projected.to(target.device), x.to(target.device)).cpu()
    expected = highway_gate_ref(projected, x)
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out[~expected.isnan()], expected[~expected.isnan()])


def test_highway_gate_many_rows_use_the_grid_stride_loop(cuda_target):
    # More rows than the 65535 blocks grid.y allows: rows past it come from the kernel's row loop.
    from test_ops import highway_inputs

    projected, x = highway_inputs(70001, 3, torch.float32, seed=5)
    poison(cuda_target)
    out = ops.highway_gate(projected.cuda(), x.cuda())
    assert_close(out, highway_gate_ref(projected.double(), x.double()), what="highway_gate N=70001")


@emulated_by_default(lambda n, f, p, layers, dtype, sliced: (n, f) == (7, 33) and sliced
                     and dtype in (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("n,f,p,layers", [(0, 5, 3, 1), (1, 1, 1, 1), (7, 33, 5, 2), (129, 124, 16, 2), (3, 8, 4, 0)])
@pytest.mark.parametrize("sliced", [False, True])
def test_highway(target, n, f, p, layers, dtype, sliced):
    from test_highway import make

    x, ws, bs, pw, pb = make(n, f, p, layers, dtype, seed=n + f, sliced=sliced)
    what = f"{target.name} highway n={n} f={f} p={p} layers={layers} {dtype}"
    dev = target.device
    poison(target)
    got = target.op("highway")(same_layout_on(x, dev), [same_layout_on(w, dev) for w in ws], [b.to(dev) for b in bs],
                               pw.to(dev), pb.to(dev))
    assert got.shape == (n, p) and got.dtype == dtype and got.device == dev, what
    expected = highway_ref(x.double(), [w.double() for w in ws], [b.double() for b in bs], pw.double(), pb.double())
    if dtype in LOW_PRECISION:
        # GEMMs in bf16/fp16 (fp32 accumulation): bound the error by PyTorch's own in that dtype.
        torch_lowp = highway_ref(x.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], pw.to(dev), pb.to(dev))
        assert max_abs_error(got, expected) <= 2 * max_abs_error(torch_lowp, expected) + 1e-2, what
        no_nan(got, what)
    else:
        assert_close(got, expected, dtype=dtype, what=what)
        if target.is_cuda and dtype == torch.float32:  # and the reference on the same device
            same = highway_ref(x.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], pw.to(dev), pb.to(dev))
            assert max_abs_error(got, same) <= TOL[torch.float32]["atol"], what


def test_highway_ops_opcheck(cuda_target):
    from test_highway import make
    from test_ops import highway_inputs

    projected, x = highway_inputs(7, 16, torch.float32, seed=1, layout="sliced")
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (projected.cuda(), x.cuda()))
    args = [t.cuda() if isinstance(t, torch.Tensor) else [u.cuda() for u in t] for t in make(6, 10, 4, 2)]
    torch.library.opcheck(torch.ops.elmo_fast.highway.default, tuple(args))


def test_highway_errors_name_the_argument_on_cuda(cuda_target):
    dev = cuda_target.device
    with pytest.raises(RuntimeError, match="highway_gate: projected and x must be on the same device"):
        torch.ops.elmo_fast.highway_gate.default(torch.randn(4, 8), torch.randn(4, 4, device=dev))
    with pytest.raises(RuntimeError, match="highway_gate: x must be a CUDA tensor, got cpu"):
        torch.ops.elmo_fast.highway_gate.default(torch.randn(4, 8, device=dev), torch.randn(4, 4))
    with pytest.raises(RuntimeError, match="highway_gate: x has dtype int64; supported on CUDA"):
        torch.ops.elmo_fast.highway_gate.default(torch.zeros(4, 8, dtype=torch.long, device=dev),
                                                 torch.zeros(4, 4, dtype=torch.long, device=dev))
    with pytest.raises(RuntimeError, match=r"highway: highway_weights\[0\] and highway_biases\[0\] must be on x's"):
        torch.ops.elmo_fast.highway.default(torch.randn(2, 3, device=dev), [torch.randn(6, 3)], [torch.randn(6)],
                                            torch.randn(2, 3, device=dev), torch.randn(2, device=dev))


# --- char_cnn ---------------------------------------------------------------------------------------


AWKWARD_WORDS = ["a", "I", "the", ",", "über", "東京", "aaaaaaaaaaaa", "x" * 60, "supercalifragilistic",
                 "<S>", "</S>", "mississippi", "ab" * 30, "zz"]


def char_cnn_inputs(filters, dim, dtype, seed, n_random=5, chars=50, vocab=262):
    """ids [N, chars] of real words (ELMo's padding runs), full-length words (no run), an empty row
    (all zeros: one run), rows of random ids (no run) and rows ending in a run of a real character;
    weights of the given (width, count) filters."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    if chars == 50:
        rows.append(batch_to_ids([AWKWARD_WORDS])[0])
    rows.append(torch.zeros(1, chars, dtype=torch.long))
    rows.append(torch.randint(1, vocab, (n_random, chars), generator=g))
    tail = torch.randint(1, vocab, (3, chars), generator=g)
    for r, start in enumerate((min(1, chars - 1), chars // 2, chars - 1)):
        tail[r, start:] = tail[r, start]
    rows.append(tail)
    ids = torch.cat(rows)
    emb = torch.randn(vocab, dim, generator=g, dtype=torch.float64)
    emb[0] = 0
    ws = [torch.randn(num, dim, width, generator=g, dtype=torch.float64) / math.sqrt(width * dim)
          for width, num in filters]
    bs = [torch.randn(num, generator=g, dtype=torch.float64) * 0.1 for _, num in filters]
    return ids, emb.to(dtype), [w.to(dtype) for w in ws], [b.to(dtype) for b in bs]


TINY_FILTERS = PRESETS["tiny"].filters
FULL_FILTERS = PRESETS["original"].filters


def run_char_cnn(target, ids, emb, ws, bs, activation):
    dev = target.device
    poison(target)
    return target.op("char_cnn")(same_layout_on(ids, dev), same_layout_on(emb, dev),
                                 [same_layout_on(w, dev) for w in ws], [same_layout_on(b, dev) for b in bs], activation)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("filters,dim", [(TINY_FILTERS, 4), (FULL_FILTERS, 16), (((1, 3), (50, 2), (7, 0), (2, 33)), 5)],
                         ids=["tiny", "full", "odd"])
@emulated_by_default(lambda filters, dim, activation, dtype: (filters is TINY_FILTERS and activation == "relu"
                                                            and dtype == torch.float32)
                     or (dim == 5 and activation == "tanh" and dtype == torch.bfloat16))
def test_char_cnn(target, filters, dim, activation, dtype):
    if target.name == "emulated" and filters is FULL_FILTERS and (dtype, activation) not in (
            (torch.float32, "relu"), (torch.bfloat16, "tanh")):
        pytest.skip("the emulator is slow: full filters run in float32/relu and bfloat16/tanh")
    ids, emb, ws, bs = char_cnn_inputs(filters, dim, dtype, seed=len(filters) + dim)
    what = f"{target.name} char_cnn {len(filters)} widths D={dim} {activation} {dtype}"
    got = run_char_cnn(target, ids, emb, ws, bs, activation)
    assert got.shape == (ids.shape[0], sum(n for _, n in filters)) and got.dtype == dtype, what
    # A convolution of 0 filters (the "odd" case) adds no columns; conv1d refuses it.
    kept = [k for k, (_, num) in enumerate(filters) if num > 0]
    expected = char_cnn_ref(ids, emb.double(), [ws[k].double() for k in kept], [bs[k].double() for k in kept],
                            activation)
    assert_close(got, expected, dtype=dtype, what=what)


@emulated_by_default(lambda chars: chars in (1, 65, 513))
@pytest.mark.parametrize("chars", [1, 2, 7, 64, 65, 100, 511, 512, 513, 1100])
def test_char_cnn_other_token_lengths(target, chars):
    # Any L >= 1, as on the CPU: rows staged 8 at a time up to 64 ids, fewer per group up to 512,
    # one at a time from global memory beyond; a filter as wide as the row (one window).
    filters = ((1, 5), (2, 3)) if chars > 1 else ((1, 5),)
    if chars > 2:
        filters += ((chars, 2), (chars // 2, 3))
    ids, emb, ws, bs = char_cnn_inputs(filters, 3, torch.float32, seed=chars, chars=chars, n_random=9)
    ids = torch.cat([ids, ids[:3]])  # more tokens than one group holds, repeated rows
    ids[-1, chars // 3] = 262  # and a bad id: a NaN row
    got = run_char_cnn(target, ids, emb, ws, bs, "relu").cpu()
    assert got[-1].isnan().all()
    assert_close(got[:-1], char_cnn_ref(ids[:-1], emb.double(), [w.double() for w in ws],
                                        [b.double() for b in bs]), what=f"{target.name} char_cnn W={chars}")


@emulated_by_default()
def test_char_cnn_token_length_rule(target):
    # Every backend's rule and message (the CPU op's, csrc/char_cnn_args.h): L >= 1, w_k <= L.
    _, emb, ws, bs = char_cnn_inputs(((1, 5),), 3, torch.float32, seed=1)
    with pytest.raises(RuntimeError, match=r"char_cnn: char_ids must have at least one character id per token "
                                           r"\(shape \[N, L\]\), got shape \[4, 0\]"):
        run_char_cnn(target, torch.zeros(4, 0, dtype=torch.long), emb, ws, bs, "relu")
    with pytest.raises(RuntimeError, match=r"char_cnn: conv_weights\[0\] must have a width in 1..3 \(the characters "
                                           r"per token of char_ids, \[4, 3\]\), got shape \[2, 3, 4\]"):
        run_char_cnn(target, torch.zeros(4, 3, dtype=torch.long), emb, [torch.zeros(2, 3, 4)], [torch.zeros(2)],
                     "relu")


@emulated_by_default()
def test_char_cnn_empty_and_single(target):
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=3)
    got = run_char_cnn(target, ids[:0], emb, ws, bs, "relu")
    assert got.shape == (0, 124)
    got = run_char_cnn(target, ids[:1], emb, ws, bs, "relu")
    assert_close(got, char_cnn_ref(ids[:1], emb, ws, bs), what=f"{target.name} char_cnn N=1")


@emulated_by_default()
def test_char_cnn_non_contiguous(target):
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=4)
    wide_ids = torch.cat([torch.full((ids.shape[0], 3), 7), ids, torch.full((ids.shape[0], 2), 9)], 1)[:, 3:53]
    wide_emb = torch.cat([torch.randn(emb.shape[0], 2), emb], 1)[:, 2:]
    t_ws = [w.transpose(1, 2).contiguous().transpose(1, 2) for w in ws]  # strides (D w, 1, D)
    s_bs = [torch.stack([b, b + 100], 1)[:, 0] for b in bs]  # stride 2
    assert not (wide_ids.is_contiguous() or wide_emb.is_contiguous() or t_ws[1].is_contiguous())
    got = run_char_cnn(target, wide_ids, wide_emb, t_ws, s_bs, "tanh")
    assert_close(got, char_cnn_ref(ids, emb, ws, bs, "tanh"), what=f"{target.name} char_cnn non-contiguous")


@emulated_by_default()
def test_char_cnn_out_of_range_id_gives_nan_row(target):
    # Checking ids on the host would cost a device sync per call: a bad token gets a NaN row instead.
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=5)
    ids[2, 5] = 262
    ids[4, 0] = -1
    got = run_char_cnn(target, ids, emb, ws, bs, "relu").cpu()
    assert got[2].isnan().all() and got[4].isnan().all()
    good = [i for i in range(ids.shape[0]) if i not in (2, 4)]
    assert_close(got[good], char_cnn_ref(ids[good], emb, ws, bs), what="char_cnn other rows")


def test_char_cnn_many_tokens_use_the_grid_stride_loop(cuda_target):
    # 8 tokens per block and at most 65535 blocks along y: 600000 tokens need the token loop.
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=6)
    index = torch.randint(0, ids.shape[0], (600_000,), generator=torch.Generator().manual_seed(0))
    dev = cuda_target.device
    args = (emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "relu")
    poison(cuda_target)
    whole = torch.ops.elmo_fast.char_cnn.default(ids[index].to(dev), *args)
    each = torch.ops.elmo_fast.char_cnn.default(ids.to(dev), *args)
    assert_close(each, char_cnn_ref(ids, emb.double(), [w.double() for w in ws], [b.double() for b in bs]),
                 dtype=torch.float32, what="char_cnn distinct rows")
    assert torch.equal(whole, each[index.to(dev)])  # per-token math: bitwise the same wherever it runs


def test_char_cnn_errors_name_the_argument_on_cuda(cuda_target):
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=7)
    dev = cuda_target.device
    op = torch.ops.elmo_fast.char_cnn.default
    with pytest.raises(RuntimeError, match="char_cnn: char_embedding and char_ids must be on the same device"):
        op(ids.to(dev), emb, [w.to(dev) for w in ws], [b.to(dev) for b in bs], "relu")
    with pytest.raises(RuntimeError, match=r"char_cnn: conv_weights\[1\] must be on char_ids' device"):
        op(ids.to(dev), emb.to(dev), [w.to(dev) if i != 1 else w for i, w in enumerate(ws)],
           [b.to(dev) for b in bs], "relu")
    with pytest.raises(RuntimeError, match=r"char_cnn: conv_weights\[0\] must have a width in 1..50 \(the characters"):
        op(ids.to(dev), emb.to(dev), [torch.randn(3, 4, 51, device=dev)], [torch.randn(3, device=dev)], "relu")
    with pytest.raises(RuntimeError, match='char_cnn: activation must be "relu" or "tanh", got "gelu"'):
        op(ids.to(dev), emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "gelu")


def host_device(target: Target) -> torch.device:
    """A device that is not the target's GPU: the CPU for a GPU; `meta` for the emulator, whose GPU is
    the CPU (its device guard rejects meta as CUDA's rejects the CPU)."""
    return torch.device("cpu") if target.is_cuda else torch.device("meta")


@emulated_by_default()
def test_device_errors_name_the_argument(target):
    """An input that is not on the GPU gets the binding's message naming it, not the device guard's
    (the guard is made after the device checks: a CUDAGuard made from a CPU tensor says "Expected a
    CUDA device")."""
    dev, host = target.device, host_device(target)
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=8)
    conv = ([w.to(dev) for w in ws], [b.to(dev) for b in bs], "relu")
    with pytest.raises(RuntimeError, match="char_cnn: char_ids must be a CUDA tensor"):
        target.op("char_cnn")(ids.to(host), emb.to(dev), *conv)
    out = target.op("char_cnn")(ids.to(dev), emb.to(dev), *conv)
    with pytest.raises(RuntimeError, match="char_cnn_backward: char_ids must be a CUDA tensor"):
        target.op("char_cnn_backward")(out, ids.to(host), emb.to(dev), *conv)
    with pytest.raises(RuntimeError, match="highway_gate: x must be a CUDA tensor"):
        target.op("highway_gate")(torch.randn(4, 8, device=host), torch.randn(4, 4, device=host))
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, _, _ = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 5)
    with pytest.raises(RuntimeError, match="bilstm: xg0 must be a CUDA tensor"):
        target.op("bilstm")(xg0.to(host), token_index.to(dev), lengths, [w.to(dev) for w in weights], None, None,
                            None, None)
    xg = torch.randn(2, B, T, 4 * C)
    with pytest.raises(RuntimeError, match="lstm_layer_forward: xg must be a CUDA tensor"):
        target.op("lstm_layer_forward")(xg.to(host), lengths, torch.randn(2, 4 * C, P, device=dev),
                                        torch.randn(2, P, C, device=dev), None, None, None, None)


@emulated_by_default()
def test_element_offsets_past_2_31(target):
    """Rows more than 2^31 elements apart (views of one bf16 buffer of 2^31 + a few rows, of which only
    those rows are ever written: virtual memory on the CPU): the kernels' and bindings' offsets are 64-bit.
    highway_gate and its backward read rows by their stride; the char CNN's table kernel reads the
    embedding's rows by theirs."""
    far = 2 ** 31 + 64  # elements between two rows
    try:
        buf = torch.empty(far + 256, dtype=torch.bfloat16, device=target.device)
    except (RuntimeError, MemoryError) as exc:  # a small machine refuses 4 GB of address space
        pytest.skip(f"cannot reserve a 4.3 GB buffer here: {exc}")
    g = torch.Generator().manual_seed(0)

    def rows(offset, cols):  # [2, cols]: at `offset` and `far` elements after it, random values
        view = buf.as_strided((2, cols), (far, 1), offset)
        view.copy_(torch.randn(2, cols, generator=g).to(torch.bfloat16))
        return view

    projected, x, grad = rows(0, 32), rows(32, 16), rows(48, 16)
    dense = [t.contiguous() for t in (projected, x, grad)]
    got = target.op("highway_gate")(projected, x)
    assert torch.equal(got, target.op("highway_gate")(*dense[:2]))
    strided = target.op("highway_gate_backward")(grad, projected, x)
    for a, b in zip(strided, target.op("highway_gate_backward")(dense[2], dense[0], dense[1])):
        assert torch.equal(a, b)
    emb = rows(64, 4)  # a vocabulary of 2 characters, rows 2^31 + 64 elements apart
    ids = torch.tensor([[0, 1, 1, 0, 1]], device=target.device)
    w = [torch.randn(3, 4, 2, generator=g).to(target.device, torch.bfloat16)]
    b = [torch.randn(3, generator=g).to(target.device, torch.bfloat16)]
    assert torch.equal(target.op("char_cnn")(ids, emb, w, b, "relu"), target.op("char_cnn")(ids, emb.contiguous(), w, b,
                                                                                           "relu"))
    del buf


# --- bilstm ---------------------------------------------------------------------------------------


def lstm_inputs(L, B, T, P, C, lengths, dtype, seed, U=None, states=False, garbage_index=True):
    """xg0, token_index, lengths, weights (contractive: fp32 rounding differences must not grow
    over the steps), h0, c0; everything on the CPU in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    U = U if U is not None else max(1, B * T // 2)
    lengths = torch.tensor(lengths, dtype=torch.long)
    assert lengths.shape == (B,)
    xg0 = torch.randn(U, 2, 4 * C, generator=g, dtype=torch.float64)
    xg0[:, :, C:2 * C] += 1.0  # forget gates lean open: cells integrate up to the clip
    token_index = torch.randint(0, max(U, 1), (B, T), generator=g)
    if garbage_index and B * T:  # past each row's length the index is ignored, even out of range
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        token_index[pad] = torch.randint(-7, U + 7, (int(pad.sum()),), generator=g)
    weights = []
    for _ in range(L):
        for _ in range(2):
            weights += [torch.randn(4 * C, P, generator=g, dtype=torch.float64) / math.sqrt(P),
                        0.35 * torch.randn(4 * C, P, generator=g, dtype=torch.float64) / math.sqrt(P),
                        0.1 * torch.randn(4 * C, generator=g, dtype=torch.float64),
                        3.0 * torch.randn(P, C, generator=g, dtype=torch.float64) / math.sqrt(C)]
    h0 = c0 = None
    if states:
        h0 = torch.randn(L, B, 2 * P, generator=g, dtype=torch.float64)
        c0 = 2 * torch.randn(L, B, 2 * C, generator=g, dtype=torch.float64)
    cast = (lambda t: None if t is None else t.to(dtype))
    return cast(xg0), token_index, lengths, [cast(w) for w in weights], cast(h0), cast(c0)


LSTM_CASES = {
    # name: (L, B, T, P, C, lengths)
    "one_token": (2, 1, 1, 4, 8, [1]),
    "sorted": (2, 5, 9, 16, 64, [9, 6, 6, 3, 1]),
    "unsorted_with_empty_rows": (2, 7, 9, 5, 7, [0, 4, 9, 1, 0, 9, 2]),
    "heavy_padding": (2, 6, 40, 8, 16, [1, 2, 40, 3, 1, 1]),
    "one_layer": (1, 3, 5, 8, 12, [5, 2, 4]),
    "three_layers": (3, 4, 6, 8, 16, [6, 6, 1, 3]),
    "all_empty": (2, 3, 4, 4, 8, [0, 0, 0]),
    "no_time": (2, 2, 0, 4, 8, [0, 0]),
    "empty_batch": (2, 0, 5, 4, 8, []),
}


def run_bilstm(target, xg0, token_index, lengths, weights, cell_clip, proj_clip, h0, c0, lengths_on_cpu=False):
    dev = target.device
    mv = (lambda t: None if t is None else same_layout_on(t, dev))
    poison(target)
    return target.op("bilstm")(mv(xg0), mv(token_index), lengths if lengths_on_cpu else mv(lengths),
                               [mv(w) for w in weights], cell_clip, proj_clip, mv(h0), mv(c0))


def check_bilstm(target, case, dtype, clips, states, seed=0, **run_kwargs):
    L, B, T, P, C, lengths = LSTM_CASES[case]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, dtype, seed, states=states)
    what = f"{target.name} bilstm {case} {dtype} clips={clips} states={states}"
    got = run_bilstm(target, xg0, token_index, lengths, weights, *clips, h0, c0, **run_kwargs)
    d64 = (lambda t: None if t is None else t.double())
    expected = bilstm_ref(xg0.double(), token_index, lengths, [w.double() for w in weights], *clips, d64(h0), d64(c0))
    for name, g, e in zip(("outputs", "h", "c"), got, expected):
        assert g.shape == e.shape and g.dtype == dtype and g.device == target.device, f"{what} {name}"
        if dtype in LOW_PRECISION:  # bounded by PyTorch's own error in that dtype
            no_nan(g, f"{what} {name}")
        else:
            assert_close(g, e, dtype=dtype, what=f"{what} {name}")
    if dtype in LOW_PRECISION:
        mv = (lambda t: None if t is None else t.to(target.device))
        lowp = bilstm_ref(mv(xg0), mv(token_index), lengths, [mv(w) for w in weights], *clips, mv(h0), mv(c0))
        for name, g, lp, e in zip(("outputs", "h", "c"), got, lowp, expected):
            assert max_abs_error(g, e) <= 2 * max_abs_error(lp, e) + 2e-2, f"{what} {name}"
    if B and T and any(lengths):  # padding stays exactly zero
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        assert (got[0].cpu()[:, pad] == 0).all(), f"{what}: padding not zero"
    return got, expected


@emulated_by_default(lambda case, clips, states: case in ("one_token", "unsorted_with_empty_rows", "empty_batch")
                     and clips == (3.0, 3.0) and states)
@pytest.mark.parametrize("case", list(LSTM_CASES))
@pytest.mark.parametrize("clips", [(3.0, 3.0), (None, None), (0.0, 0.5)], ids=["clips", "no_clips", "proj_clip"])
@pytest.mark.parametrize("states", [False, True], ids=["zero_states", "states"])
def test_bilstm_float32(target, case, clips, states):
    check_bilstm(target, case, torch.float32, clips, states)


@emulated_by_default(lambda case, dtype: case == "unsorted_with_empty_rows" and dtype == torch.bfloat16)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["sorted", "unsorted_with_empty_rows", "three_layers"])
def test_bilstm_other_dtypes(target, case, dtype):
    check_bilstm(target, case, dtype, (3.0, 3.0), True)


def test_bilstm_exercises_the_clips(target):
    _, expected = check_bilstm(target, "sorted", torch.float32, (3.0, 3.0), True)
    assert expected[2].abs().max() == 3.0, "cell clip not reached: the test data should exercise it"
    assert expected[0][0].abs().max() == 3.0, "projection clip not reached"


def test_bilstm_lengths_on_cpu(target):
    check_bilstm(target, "unsorted_with_empty_rows", torch.float32, (3.0, 3.0), True, lengths_on_cpu=True)


@emulated_by_default()
def test_bilstm_non_contiguous_inputs(target):
    L, B, T, P, C, lengths = LSTM_CASES["unsorted_with_empty_rows"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 9, states=True)
    g = torch.Generator().manual_seed(1)
    xg0_nc = torch.cat([torch.randn(xg0.shape[0], 2, 3, generator=g), xg0], 2)[:, :, 3:]
    index_nc = torch.stack([token_index, token_index + 1000], 2).reshape(B, 2 * T)[:, ::2]  # column stride 2
    weights_nc = [w.t().contiguous().t() if w.dim() == 2 else torch.stack([w, w], 1)[:, 0] for w in weights]
    h0_nc = h0.transpose(0, 1).contiguous().transpose(0, 1)
    assert not any(t.is_contiguous() for t in (xg0_nc, index_nc, weights_nc[1], weights_nc[2], h0_nc))
    assert torch.equal(index_nc, token_index) and torch.equal(xg0_nc, xg0)
    got = run_bilstm(target, xg0_nc, index_nc, lengths, weights_nc, 3.0, 3.0, h0_nc, c0)
    expected = bilstm_ref(xg0, token_index, lengths, weights, 3.0, 3.0, h0, c0)
    for g_, e in zip(got, expected):
        assert_close(g_, e.double(), dtype=torch.float32, what=f"{target.name} bilstm non-contiguous")


def test_bilstm_stacked_weight_views(target):
    # Weights that are views of one [2, ...] tensor per kind take the no-copy path of stack_pair;
    # the results must be identical to separate tensors'.
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 2, states=True)
    dev = target.device
    stacked = []
    for l in range(L):
        for k in range(4):
            both = torch.stack([weights[8 * l + k], weights[8 * l + 4 + k]]).to(dev)
            stacked.append((l, k, both))
    views = [None] * len(weights)
    for l, k, both in stacked:
        views[8 * l + k], views[8 * l + 4 + k] = both[0], both[1]
    separate = run_bilstm(target, xg0, token_index, lengths, weights, 3.0, 3.0, h0, c0)
    shared = target.op("bilstm")(xg0.to(dev), token_index.to(dev), lengths.to(dev), views, 3.0, 3.0, h0.to(dev),
                                 c0.to(dev))
    for a, b in zip(separate, shared):
        assert torch.equal(a, b)


def test_bilstm_under_deterministic_algorithms(target, monkeypatch):
    # The host loop uses only ops that deterministic mode allows (gathers, no index_copy_/scatter);
    # cuBLAS GEMMs are allowed there only with a fixed workspace configuration.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        first = check_bilstm(target, "unsorted_with_empty_rows", torch.float32, (3.0, 3.0), True)[0]
        again = check_bilstm(target, "unsorted_with_empty_rows", torch.float32, (3.0, 3.0), True)[0]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@emulated_by_default()
def test_bilstm_clamps_token_index_as_the_reference(target):
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 3)
    token_index[0, 0], token_index[1, 2] = -3, xg0.shape[0] + 5  # active positions, out of range
    got = run_bilstm(target, xg0, token_index, lengths, weights, 3.0, 3.0, None, None)
    expected = bilstm_ref(xg0.double(), token_index, lengths, [w.double() for w in weights], 3.0, 3.0)
    for g_, e in zip(got, expected):
        assert_close(g_, e, dtype=torch.float32, what=f"{target.name} bilstm clamped index")


def test_bilstm_many_rows_use_the_grid_stride_loop(cuda_target):
    # 2 B > 65535 (direction, row) pairs: rows past grid.y come from the kernels' row loops.
    B = 33000
    lengths = torch.randint(0, 4, (B,), generator=torch.Generator().manual_seed(0)).tolist()
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(2, B, 3, 4, 4, lengths, torch.float32, 4, states=True)
    got = run_bilstm(cuda_target, xg0, token_index, lengths, weights, 3.0, 3.0, h0, c0)
    expected = bilstm_ref(xg0.double(), token_index, lengths, [w.double() for w in weights], 3.0, 3.0, h0.double(),
                          c0.double())
    for g_, e in zip(got, expected):
        assert_close(g_, e, dtype=torch.float32, what="bilstm B=33000")


def test_bilstm_errors_name_the_argument_on_cuda(cuda_target):
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, h0, c0 = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 5)
    dev = cuda_target.device
    op = torch.ops.elmo_fast.bilstm.default
    wd = [w.to(dev) for w in weights]
    with pytest.raises(RuntimeError, match="bilstm: token_index and xg0 must be on the same device"):
        op(xg0.to(dev), token_index, lengths.to(dev), wd, 3.0, 3.0, None, None)
    with pytest.raises(RuntimeError, match=r"bilstm: weights\[5\] \(w_hh\) must be on xg0's device"):
        op(xg0.to(dev), token_index.to(dev), lengths, [w if i == 5 else w.to(dev) for i, w in enumerate(weights)],
           3.0, 3.0, None, None)
    with pytest.raises(RuntimeError, match=r"bilstm: lengths\[0\] = 10 is out of range \[0, T = 9\]"):
        op(xg0.to(dev), token_index.to(dev), torch.tensor([10, 1, 1, 1, 1], device=dev), wd, 3.0, 3.0, None, None)
    with pytest.raises(RuntimeError, match="bilstm: cell_clip must be positive, 0 or None, got -1"):
        op(xg0.to(dev), token_index.to(dev), lengths, wd, -1.0, 3.0, None, None)


# --- the whole biLM -------------------------------------------------------------------------------


def ops_bilm(target, char_ids, w, h0=None, c0=None):
    """bilm_ref's computation through the target's ops: char CNN and highway once per distinct
    token, layer-0 gates per distinct token, the biLSTM over token indices (as a fast model does)."""
    o = w.options
    ids, mask = add_sentence_boundaries(char_ids)
    B, T2, W = ids.shape
    uniq, inverse = torch.unique(ids.reshape(B * T2, W), dim=0, return_inverse=True)
    tokens = target.op("char_cnn")(uniq, w.char_embedding, list(w.conv_weights), list(w.conv_biases), o.activation)
    tokens = target.op("highway")(tokens, list(w.highway_weights), list(w.highway_biases), w.proj_weight, w.proj_bias)
    lstm = flat_lstm_weights(w.lstm)
    outputs, h, c = target.op("bilstm")(layer0_gates_ref(tokens, lstm), inverse.view(B, T2), mask.sum(dim=1), lstm,
                                        o.cell_clip, o.proj_clip, h0, c0)
    token_vectors = tokens[inverse].view(B, T2, -1) * mask.unsqueeze(-1).to(tokens.dtype)
    return [torch.cat([token_vectors, token_vectors], dim=-1), *outputs.unbind(0)], mask, h, c


def sentences(rng, n, lo=1, hi=12):
    vocab = "the a cat sat on mat dog ran quickly home , . ! über 東京 antidisestablishmentarianism".split()
    return [[vocab[j] for j in rng.integers(0, len(vocab), rng.integers(lo, hi))] for _ in range(n)]


def bilm_outputs_ref(ids, weights) -> list:
    """bilm_ref's activations, h and c, in the weights' dtype (float64: the oracle of the fp32 bound)."""
    activations, _, h, c = bilm_ref(ids, weights)
    return [*activations, h, c]


_MODELED: dict = {}  # (preset, ids, fma) -> the rounding model's error: float64 runs of 'original' take a while


def modeled_bilm_error(preset, ids, w64, fma: bool) -> float:
    key = (preset, ids.numpy().tobytes(), tuple(ids.shape), fma)
    if key not in _MODELED:
        _MODELED[key] = modeled_error(lambda: bilm_outputs_ref(ids, w64), reference, fma=fma)
    return _MODELED[key]


def fp32_bilm_bound(target, preset, ids, w64) -> float:
    """The fp32 bound of a whole biLM on the target: the 1e-5 bar on the CPU emulator (its GEMMs are the
    CPU's) and for the tiny preset; on a GPU, for larger presets, the rounding-error model's bound
    (tests/tolerances.py: recursive FMA sums of 512 and 4096 terms, as cuBLAS makes them)."""
    if not target.is_cuda or preset == "tiny":
        return TOL[torch.float32]["atol"]
    return fp32_model_bound(modeled_bilm_error(preset, ids, w64, fma=True))


@emulated_by_default(lambda preset: preset == "tiny")
@pytest.mark.parametrize("preset", ["tiny", "small", "original"])
def test_ops_bilm_matches_reference(target, random_models, preset):
    options, weight_file = random_models(preset, exercise_clips=True)
    w_cpu = load_weights(weight_file, load_options(options))
    w = w_cpu.to(target.device)
    rng = np.random.default_rng(0)
    batch = sentences(rng, 5) + [["one"], []]
    ids = batch_to_ids(batch)
    poison(target)
    got, mask, h, c = ops_bilm(target, ids.to(target.device), w)
    # The float64 reference on the same weights: the bound is the fast path's own error
    # (the fp32 reference itself is ~4e-6 from it on the small and original presets).
    w64 = w_cpu.to(dtype=torch.float64)
    want_cpu, mask_cpu, h_cpu, c_cpu = bilm_ref(ids, w64)
    bound = fp32_bilm_bound(target, preset, ids, w64)
    what = f"{target.name} biLM {preset}"
    assert torch.equal(mask.cpu(), mask_cpu)
    for k, (g, e) in enumerate(zip(got + [h, c], want_cpu + [h_cpu, c_cpu])):
        no_nan(g, f"{what}, output {k}")
        assert max_abs_error(g, e) <= bound, f"{what} vs float64 CPU reference, output {k}: > {bound:.3g}"
    if target.is_cuda:  # and against the reference on the same device (itself fp32: twice the bound)
        want_dev = bilm_ref(ids.to(target.device), w)
        for k, (g, e) in enumerate(zip(got + [h, c], list(want_dev[0]) + list(want_dev[2:]))):
            assert max_abs_error(g, e) <= 2 * bound, f"{what} vs CUDA reference, output {k}"


@pytest.mark.parametrize("preset", ["tiny", "small", "original"])
def test_fp32_error_within_the_rounding_model(target, random_models, preset):
    """The kernels built as a GPU builds them (the emulator with FMA contraction; a GPU) stay within the
    rounding-error model's bound (tests/tolerances.py), which contraction does not move: the model with
    FMA and without differ by less than 5%. (Slow in the emulator: the full set only.)"""
    options, weight_file = random_models(preset, exercise_clips=True)
    w_cpu = load_weights(weight_file, load_options(options))
    ids = batch_to_ids(sentences(np.random.default_rng(0), 5) + [["one"], []])
    got, _, h, c = ops_bilm(target, ids.to(target.device), w_cpu.to(target.device))
    w64 = w_cpu.to(dtype=torch.float64)
    with_fma, without = (modeled_bilm_error(preset, ids, w64, fma) for fma in (True, False))
    assert abs(with_fma - without) <= 0.05 * without, f"model with FMA {with_fma:.3g}, without {without:.3g}"
    bound = fp32_model_bound(with_fma)
    err = max(max_abs_error(g, e) for g, e in zip(got + [h, c], bilm_outputs_ref(ids, w64)))
    assert err <= bound, f"{target.name} {preset}: max abs error {err:.3g} > the model's bound {bound:.3g}"


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
@pytest.mark.parametrize("preset", ["tiny", "small", "original"])
def test_fast_model_on_cuda_matches_reference(cuda_target, random_models, preset):
    options, weight_file = random_models(preset, exercise_clips=True)
    fast = ElmoBiLm(options, weight_file, backend="fast").to("cuda")
    ref = ElmoBiLm(options, weight_file)
    w64 = load_weights(weight_file, load_options(options)).to(dtype=torch.float64)
    rng = np.random.default_rng(1)
    for batch in (sentences(rng, 6), [["a"]], sentences(rng, 3, 20, 40)):
        ids = batch_to_ids(batch)
        poison(cuda_target)
        got = fast(ids.cuda())
        want = ref(ids)
        assert torch.equal(got["mask"].cpu(), want["mask"])
        # both sides fp32: twice the model's bound (tiny: the bar)
        bound = fp32_bilm_bound(cuda_target, preset, ids, w64) * (1 if preset == "tiny" else 2)
        for k, (g, e) in enumerate(zip(got["activations"], want["activations"])):
            assert max_abs_error(g, e) <= bound, f"fast model {preset} layer {k}: > {bound:.3g}"


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cache", [0, 10_000], ids=["no_cache", "token_cache"])
def test_fast_model_forward_from_host_inputs_never_waits_for_the_gpu(cuda_target, random_models, dtype, cache):
    """Char ids on the CPU, model on the GPU: the distinct tokens, lengths and the bilstm schedule are
    made on the host and copied from pinned memory, so the forward queues work without one device
    sync (torch's sync debug mode raises on any) and gives the reference's vectors."""
    files = random_models("small", exercise_clips=True)
    fast = ElmoBiLm(*files, backend="fast", dtype=dtype, token_cache_size=cache).to("cuda")
    ref = ElmoBiLm(*files, backend="reference")
    rng = np.random.default_rng(7)
    batches = [sentences(rng, 6) + [[]], sentences(rng, 3, 20, 40)]
    with torch.inference_mode():
        fast(batch_to_ids(batches[0]))  # warm-up: cuBLAS handles, the stacked weights, pinned blocks
        torch.cuda.synchronize()
        for batch in batches:
            ids = batch_to_ids(batch)
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = fast(ids)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            want = ref(ids)
            assert torch.equal(got["mask"].cpu(), want["mask"])
            for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
                if dtype == torch.float32:
                    assert_close(g, w, dtype=torch.float32, what=f"host-planned forward layer {k}")
                else:
                    m = want["mask"]
                    err = (g.cpu()[m].double() - w[m].double()).abs().max()
                    assert err <= MODEL_BF16["max_rel"] * w[m].abs().max(), f"layer {k}: bf16 error {err:.3g}"
    weights = fast._flat_lstm()
    assert fast._flat_lstm() is weights and all(w.dtype == dtype and w.is_cuda for w in weights)
    assert weights[1].untyped_storage().data_ptr() == weights[5].untyped_storage().data_ptr()  # stacked


def test_embedder_on_cuda_plans_on_the_host(cuda_target, random_models):
    """ElmoEmbedder hands the biLM its ids on the CPU: batch_to_embeddings never waits for the GPU."""
    embedder = ElmoEmbedder(*random_models("small"), device="cuda")
    batch = sentences(np.random.default_rng(11), 5)
    embedder.batch_to_embeddings(batch)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got, mask = embedder.batch_to_embeddings(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want, want_mask = ElmoEmbedder(*random_models("small")).batch_to_embeddings(batch)
    assert torch.equal(mask.cpu(), want_mask)
    assert_close(got, want, dtype=torch.float32, what="ElmoEmbedder on CUDA, host-planned")


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_graphs_replay_the_eager_forward(cuda_target, random_models, dtype):
    """ElmoBiLm(cuda_graphs=N): buckets captured on their second batch and replayed after, with other
    tokens of the same lengths and interleaved with other buckets (each graph's memory is its own),
    give the eager forward's vectors; a replay never waits for the GPU."""
    files = random_models("small", exercise_clips=True)
    graphed = ElmoBiLm(*files, backend="fast", dtype=dtype, cuda_graphs=2).to("cuda")
    eager = ElmoBiLm(*files, backend="fast", dtype=dtype).to("cuda")
    rng = np.random.default_rng(9)
    one = sentences(rng, 1, 20, 21)  # one sentence of 20 tokens: the latency case
    one_other = [[w[::-1] for w in one[0]]]  # the same length, other tokens
    four = sentences(rng, 4, 1, 12)
    four_other = [[w + "s" for w in s] for s in four]
    third = sentences(rng, 3, 5, 9)
    steps = [one, one, one_other, four, four, one, four_other, third, third, four, one_other]
    captures = {1, 4, 8, 10}  # a bucket's second batch; at 8 `one` goes (2 kept), at 10 it comes back
    with torch.inference_mode():
        for i, batch in enumerate(steps):
            ids = batch_to_ids(batch)
            if i not in captures:  # replays, and first batches run eagerly: no sync either way
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                got = graphed(ids)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            want = eager(ids)
            assert torch.equal(got["mask"].cpu(), want["mask"].cpu()), i
            for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
                err = max_abs_error(g, w)
                bound = TOL[torch.float32]["atol"] if dtype == torch.float32 else 1e-2 * w.abs().max().item()
                assert err <= bound, f"step {i}, layer {k}: {err:.3g}"
    assert 0 < len(graphed._graphs) <= 2


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_bf16_fast_model_on_cuda_error_bound(cuda_target, random_models, preset):
    """dtype=bfloat16 on CUDA: the same stated bound as on CPU (tests/test_fast_model.py), though
    the CUDA bilstm rounds its layer-0 gates and biases to bf16 too."""
    files = random_models(preset, exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(2), 9))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        low = ElmoBiLm(*files, backend="fast", dtype=torch.bfloat16).to("cuda")(ids.cuda())
    mask = ref["mask"]
    for k, (r, x) in enumerate(zip(ref["activations"], low["activations"])):
        assert x.dtype == torch.float32
        r, x = r[mask].double(), x.cpu()[mask].double()
        err = (x - r).abs()
        assert err.max() <= MODEL_BF16["max_rel"] * r.abs().max(), f"layer {k}: max err {err.max():.3g}"
        assert err.pow(2).mean().sqrt() <= MODEL_BF16["rms_rel"] * r.pow(2).mean().sqrt(), f"layer {k}: RMS err"


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_low_precision_on_cuda_within_the_stated_bound(cuda_target, random_models, preset, precision):
    """Each precision's bound (elmo_fast.bilm.precision, MODEL_BOUNDS) on a GPU, against the fp32
    CPU reference, per output layer; and fp32 stays within the fp32 bar while the process has TF32
    on for itself (fp32 turns it off for the forward)."""
    files = random_models(preset, exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(3), 9))
    with torch.inference_mode():
        ref = ElmoBiLm(*files, backend="reference")(ids)
        low = ElmoBiLm(*files, backend="fast", precision=precision).to("cuda")(ids.cuda())
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            exact = ElmoBiLm(*files, backend="fast").to("cuda")(ids.cuda())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    mask = ref["mask"]
    bound = MODEL_BOUNDS[precision]
    # fp32 on both sides: the bar for tiny, twice the rounding model's GPU bound beyond (tests/tolerances.py)
    w64 = load_weights(files[1], load_options(files[0])).to(dtype=torch.float64)
    fp32_bound = fp32_bilm_bound(cuda_target, preset, ids, w64) * (1 if preset == "tiny" else 2)
    for k, (r, x, e) in enumerate(zip(ref["activations"], low["activations"], exact["activations"])):
        assert x.dtype == torch.float32
        assert max_abs_error(e.cpu(), r) <= fp32_bound, f"fp32 under a process's TF32, layer {k}"
        r, x = r[mask].double(), x.cpu()[mask].double()
        err = (x - r).abs()
        assert err.max() <= bound["max_rel"] * r.abs().max(), f"{precision} layer {k}: max err {err.max():.3g}"
        assert err.pow(2).mean().sqrt() <= bound["rms_rel"] * r.pow(2).mean().sqrt(), f"{precision} layer {k}: RMS"


def expected_top_layers(bilm_tf_tiny):
    from bilm_cases import expected_top_layers as read

    return read(bilm_tf_tiny)


@emulated_by_default()
def test_golden_bilm_tf_stateful(target, bilm_tf_tiny, tiny_files, fixture_sentences):
    """bilm-tf's outputs of the real tiny model, batch after batch with carried states (see
    test_reference.test_golden_lm_embeddings_stateful), through the target's ops."""
    expected = expected_top_layers(bilm_tf_tiny)
    w = load_weights(tiny_files[1], load_options(tiny_files[0])).to(target.device)
    h = c = None
    worst = 0.0
    for i in range(10):
        batch = [fixture_sentences[k][i].split() for k in range(3)]
        poison(target)
        acts, mask, h, c = ops_bilm(target, batch_to_ids(batch).to(target.device), w, h, c)
        for k in range(3):
            n = len(batch[k])
            got = acts[2][k, 1:n + 1].cpu().numpy()  # drop <S>
            worst = max(worst, float(np.abs(got - expected[k][i]).max()))
    assert worst <= TOL[torch.float32]["atol"], f"{target.name}: max abs error vs bilm-tf {worst:.3g}"


@pytest.mark.skipif("fast" not in model_module.BACKENDS, reason="ElmoBiLm has no backend='fast' in this tree yet")
def test_golden_bilm_tf_stateful_fast_model(cuda_target, bilm_tf_tiny, tiny_files, fixture_sentences):
    expected = expected_top_layers(bilm_tf_tiny)
    bilm = ElmoBiLm(*tiny_files, stateful=True, backend="fast").to("cuda")
    worst = 0.0
    for i in range(10):
        batch = [fixture_sentences[k][i].split() for k in range(3)]
        top, _ = bilm.embed(batch_to_ids(batch).cuda())
        for k in range(3):
            worst = max(worst, float(np.abs(top[k, 2, : len(batch[k])].cpu().numpy() - expected[k][i]).max()))
    assert worst <= TOL[torch.float32]["atol"], f"max abs error vs bilm-tf {worst:.3g}"


def test_emulation_schemas_match_the_library(emulated_target):
    if not ops.HAS_EXTENSION:
        pytest.skip("elmo_fast._C not built")
    for name in ("highway_gate", "highway", "char_cnn", "bilstm"):
        real = getattr(torch.ops.elmo_fast, name, None)
        if real is None:
            continue
        emu = getattr(torch.ops.elmo_fast_emu, name).default._schema
        assert str(emu).replace("elmo_fast_emu::", "elmo_fast::") == str(real.default._schema), name


# --- the modules on top of the ops, on a GPU: Elmo, HubElmo, embed_file ------------------------------


def test_elmo_on_cuda_matches_cpu_reference(cuda_target, random_models):
    from elmo_fast import Elmo

    files = random_models("small", exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(4), 7) + [["one"]])
    for layer_norm in (False, True):
        kwargs = dict(num_output_representations=2, do_layer_norm=layer_norm, dropout=0.0)
        gpu = Elmo(*files, backend="fast", device="cuda", **kwargs).eval()
        cpu = Elmo(*files, backend="reference", **kwargs).eval()
        with torch.no_grad():
            for mix in (gpu, cpu):
                mix.scalar_mix_1.load_state_dict({"scalar_parameters.0": torch.tensor([0.3]), "gamma": torch.tensor([1.7]),
                                                  "scalar_parameters.1": torch.tensor([-0.2]),
                                                  "scalar_parameters.2": torch.tensor([0.5])})
            poison(cuda_target)
            got, want = gpu(ids.cuda()), cpu(ids)
        assert torch.equal(got["mask"].cpu(), want["mask"])
        for k, (g, w) in enumerate(zip(got["elmo_representations"], want["elmo_representations"])):
            assert_close(g, w, dtype=torch.float32, what=f"Elmo on CUDA, layer norm {layer_norm}, representation {k}")


@pytest.mark.parametrize("requires_grad", [False, True], ids=["frozen", "fine-tuned"])
def test_elmo_gradients_on_cuda_match_cpu(cuda_target, random_models, requires_grad):
    """A training step on the GPU (fast path under a frozen biLM, the reference's autograd when the
    biLM trains) gives the CPU reference's gradients within 1e-4 relative."""
    from elmo_fast import Elmo

    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(5), 5))
    grads = {}
    for where, kwargs in (("cuda", dict(backend="fast", device="cuda")), ("cpu", dict(backend="reference"))):
        model = Elmo(*files, 2, do_layer_norm=True, dropout=0.0, requires_grad=requires_grad, **kwargs).train()
        reps = model(ids.to(next(model.parameters()).device))["elmo_representations"]
        (reps[0].square().mean() + reps[1].mean()).backward()
        grads[where] = {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["cuda"].keys() == grads["cpu"].keys()
    assert any("_elmo_lstm" in n for n in grads["cpu"]) == requires_grad
    for name, want in grads["cpu"].items():
        err = (grads["cuda"][name] - want).abs().max() / want.abs().max().clamp_min(1e-12)
        assert err <= 1e-4, f"{name}: relative gradient error {err:.3g}"


def test_hub_elmo_on_cuda_matches_cpu(cuda_target, random_models):
    from elmo_fast import HubElmo

    files = random_models("small", exercise_clips=True)
    strings = ["the cat sat on the mat", "one", "über 東京 antidisestablishmentarianism , ."]
    got = HubElmo(*files, backend="fast", device="cuda")(strings)
    want = HubElmo(*files, backend="reference")(strings)
    for name, w in want.items():
        g = got[name]
        assert g.device.type == "cuda", name
        if w.dtype.is_floating_point:
            assert_close(g, w, dtype=torch.float32, what=f"HubElmo on CUDA: {name}")
        else:
            assert torch.equal(g.cpu(), w), name


def test_embed_file_on_cuda_matches_cpu(cuda_target, random_models, tmp_path):
    from embed_runs import assert_same_output, random_sentences, write_lines

    files = random_models("small")
    inp = write_lines(tmp_path / "in.txt", random_sentences(random.Random(6), 150))
    ElmoEmbedder(*files, device="cuda").embed_file(inp, tmp_path / "gpu.h5", "all", progress=False)
    ElmoEmbedder(*files).embed_file(inp, tmp_path / "cpu.h5", "all", progress=False)
    assert_same_output(tmp_path / "gpu.h5", tmp_path / "cpu.h5", "embed_file on CUDA vs CPU")


def test_embed_file_on_cuda_splits_batches_that_run_out_of_memory(cuda_target, random_models, tmp_path):
    """A real CUDA out-of-memory: the caching allocator capped ~120 MB above the model, so a batch of
    32 sentences of 300 tokens (its layer >= 1 input gates alone take 2 x 32 x 302 x 4096 x 4 bytes
    = 317 MB on `small`) must be halved until it fits, and a 10k-token sentence (328 MB alone)
    is refused naming its line."""
    from embed_runs import assert_same_output, write_lines

    files = random_models("small")
    rng = random.Random(5)
    words = ["the", "cat", "sat", "on", "a", "mat", ".", "über"]
    inp = write_lines(tmp_path / "in.txt", [" ".join(rng.choice(words) for _ in range(300)) for _ in range(32)])
    too_long = write_lines(tmp_path / "long.txt", ["a short one", " ".join(rng.choice(words) for _ in range(10_000))])
    embedder = ElmoEmbedder(*files, device="cuda", batch_size=32, token_cache_mb=0)
    embedder.embed_file(inp, tmp_path / "free.h5", "top", progress=False, bucketing=False)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 120 * 2**20) / total)
    try:
        stats = embedder.embed_file(inp, tmp_path / "tight.h5", "top", progress=False, bucketing=False)
        with pytest.raises(InputError, match=r"line 2: its sentence of 10000 tokens does not fit in memory"):
            embedder.embed_file(too_long, tmp_path / "never.h5", "top", progress=False, bucketing=False)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert stats["oom_splits"] > 0
    assert_same_output(tmp_path / "tight.h5", tmp_path / "free.h5", "embed_file split after CUDA OOM")
    assert not (tmp_path / "never.h5").exists()


@pytest.mark.parametrize("variant", ["words+chars", "20 chars, tanh, 3 layers"])
def test_manylangs_model_on_cuda_matches_reference(cuda_target, tmp_path, variant):
    """An ELMoForManyLangs model on the GPU (word embedding, char CNN over its own table and token
    length, highway_gate, bilstm) against the reference on the CPU."""
    from elmo_fast.manylangs import Embedder
    from manylangs_models import sentences, write_variant

    d = write_variant(variant, tmp_path / "model")
    sents = sentences(["szó", "kutya", "ház", "的一", "один"])
    want = Embedder(d, backend="reference").sents2elmo(sents, output_layer=-2)
    poison(cuda_target)
    got = Embedder(d, device="cuda", backend="fast").sents2elmo(sents, output_layer=-2)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        assert_close(torch.from_numpy(g), torch.from_numpy(w), torch.float32, what=f"{variant} sentence {i}")
