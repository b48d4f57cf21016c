"""The targets of the CUDA kernels' tests (tests/<room>/test_*_cuda.py), and what they share.

Two targets run the same tests:
  * "cuda": torch.ops.elmo_fast on a GPU (skips, saying why, without a GPU or CUDA kernels);
  * "emulated": the same kernels and bindings compiled for the CPU emulator
    (tests/cuda_emulation, op library elmo_fast_emu, CPU tensors), for machines without a GPU. A
    representative subset runs by default (tests marked @emulated_by_default: every kernel forward and
    backward, odd shapes, bf16); ELMO_FAST_CUDA_EMULATION=1 runs every case. The emulator's build is
    cached across runs (torch's extension cache) and made once per session.
GPU tests run with the first-use self-check strict (a wrong kernel fails them, never passing through its
reference twin) and TF32 off (the fp32 bar is 1e-5) and compare with the reference on the CPU in
float64 (the op's own error) and, where they say so, with the reference on the same device.
Outputs come from a poisoned allocator: the caching allocator's free blocks are filled with NaN
first, so an element a kernel fails to write shows up as NaN; the backward passes' tests also run with
deterministic mode's NaN fill of every allocation (@poisoned, tests/support/grad_checks.py). The tests of
what a build without CUDA kernels says run everywhere (tests/bilm/test_ops.py).
"""

import contextlib
import dataclasses
import os

import pytest
import torch

from elmo_fast.bilm import ops

HAS_GPU = torch.cuda.is_available()
CUDA_SKIP_REASON = (
    "no CUDA GPU visible to torch"
    if not HAS_GPU
    else f"elmo_fast._C has no CUDA kernels: {ops.cuda_kernels_missing_reason()}"
)
#: every emulated case, not only the default subset (the emulator is slow: kernels run thread by thread)
EMULATION_FULL = os.environ.get("ELMO_FAST_CUDA_EMULATION") == "1"
LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


#: the CUDA training ops' tests compare with the CPU ops
needs_cpu_ops = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built (the CPU ops are compared with)"
)


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


def _strict_on_the_gpu(request) -> None:
    """A kernel wrong on the hardware must fail the test that runs it, naming the op, not pass through the
    reference twin the first-use self-check would fall back to: the GPU's tests ask for its strict mode."""
    request.getfixturevalue("selfcheck_mode")("cuda,strict")


@pytest.fixture(params=["cuda", "emulated"])
def target(request):
    if request.param == "cuda":
        if not (HAS_GPU and ops.HAS_CUDA_KERNELS):
            pytest.skip(CUDA_SKIP_REASON)
        _strict_on_the_gpu(request)
        return Target("cuda", torch.device("cuda"), torch.ops.elmo_fast)
    if not (EMULATION_FULL or in_default_emulated_subset(request)):
        pytest.skip("emulated case outside the default subset: ELMO_FAST_CUDA_EMULATION=1 runs every case")
    return request.getfixturevalue("emulated_target")


@pytest.fixture
def cuda_target(request):
    if not (HAS_GPU and ops.HAS_CUDA_KERNELS):
        pytest.skip(CUDA_SKIP_REASON)
    _strict_on_the_gpu(request)
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


def on(target, t):
    return None if t is None else same_layout_on(t, target.device)


_EMU_AUTOGRAD = []


@pytest.fixture
def ops_on(target, monkeypatch):
    """The device on which elmo_fast.bilm.ops runs the target's kernels: CUDA tensors for "cuda"; for
    "emulated", CPU tensors with torch.ops.elmo_fast swapped for the emulation's library (and the ops'
    autograd formulas registered on it), so that ops.* run the emulated CUDA kernels."""
    if target.is_cuda:
        return target.device
    emu = torch.ops.elmo_fast_emu
    assert torch.ops.elmo_fast is not emu  # (also makes the namespace an attribute of torch.ops)
    if not _EMU_AUTOGRAD:
        for name, backward, setup in (
            ("char_cnn", ops._char_cnn_backward, ops._char_cnn_setup_context),
            ("highway_gate", ops._highway_gate_backward, ops._highway_gate_setup_context),
            ("lstm_layer_forward", ops._lstm_layer_backward, ops._lstm_layer_setup_context),
        ):
            torch.library.register_autograd(f"elmo_fast_emu::{name}", backward, setup_context=setup)
        _EMU_AUTOGRAD.append(True)
    monkeypatch.setattr(torch.ops, "elmo_fast", emu)
    return target.device


@contextlib.contextmanager
def ran_ops(target):
    """The names of the target library's ops (elmo_fast / elmo_fast_emu) that ran inside the block."""
    library = "elmo_fast_emu::" if target.name == "emulated" else "elmo_fast::"
    ran = set()
    with torch.autograd.profiler.profile() as prof:
        yield ran
    ran.update(e.name[len(library) :] for e in prof.function_events if e.name.startswith(library))
