"""The CPU emulator of the CUDA kernels (tests/cuda_emulation) fails where a GPU would and a CPU would not.

Each strictness feature against a deliberately broken tiny kernel or binding of the test-only op library
``elmo_fast_emu_test`` (tests/cuda_emulation/emu_strictness.cpp) and its correct twin: garbage in shared
memory and in fresh allocations, shuffled threads (a missing __syncthreads), host buffers scribbled over
after an asynchronous copy, the device guard, CUDA graph capture, FMA contraction; then the real
bindings under those rules (device errors name the argument; the LSTM ops under capture). Runs in the
README's test command: the emulator's build is cached across runs (a first build takes a minute or two).
"""

import pytest
import torch
from lstm_cases import LSTM_CASES, layer_case, lstm_inputs


@pytest.fixture(scope="module")
def emu(emulated_target):
    return torch.ops.elmo_fast_emu_test


BLOCK = 64  # threads per block of the test kernels (emu_strictness.cpp)


def test_shared_memory_holds_garbage_at_each_block(emu):
    """A read of shared memory no thread wrote gives NaN (a CPU's static array would hold zeros or the
    previous block's values)."""
    broken = emu.shared_read(True)
    assert broken.view(2, BLOCK)[:, BLOCK // 2 :].isnan().all(), "unwritten shared memory read as a number"
    assert not broken.view(2, BLOCK)[:, : BLOCK // 2].isnan().any()
    assert torch.equal(emu.shared_read(False), torch.arange(BLOCK, dtype=torch.float32).repeat(2))


@pytest.mark.parametrize("seed", ["0", "1", "12345"])
def test_shuffled_threads_expose_a_missing_syncthreads(emu, monkeypatch, seed):
    """Threads run one at a time between barriers, in a random order: a neighbour's shared value read
    without a __syncthreads() after its write is garbage for most threads, whatever the seed."""
    monkeypatch.setenv("ELMO_FAST_EMULATION_SEED", seed)
    expected = torch.tensor([(t + 1) % BLOCK + 1 for t in range(BLOCK)], dtype=torch.float32).repeat(2)
    wrong = int((emu.neighbour_read(True) != expected).sum())
    assert wrong >= BLOCK // 4, f"seed {seed}: only {wrong} of {2 * BLOCK} reads saw the race"
    assert torch.equal(emu.neighbour_read(False), expected)


def test_divergent_syncthreads_fail_in_both_schedules(emu, monkeypatch):
    for schedule in ("shuffle", "threads"):
        monkeypatch.setenv("ELMO_FAST_EMULATION_SCHEDULE", schedule)
        with pytest.raises(
            RuntimeError,
            match=r"divergent_sync_kernel: threads of block .* reached "
            r"__syncthreads\(\) \d+ and \d+ times",
        ):
            emu.divergent_sync(True)
        assert torch.equal(emu.divergent_sync(False), torch.ones(BLOCK))


def test_threads_schedule_runs_the_kernels_concurrently(emu, monkeypatch):
    """ELMO_FAST_EMULATION_SCHEDULE=threads (for ThreadSanitizer): the correct kernels' results."""
    monkeypatch.setenv("ELMO_FAST_EMULATION_SCHEDULE", "threads")
    assert torch.equal(emu.shared_read(False), torch.arange(BLOCK, dtype=torch.float32).repeat(2))
    expected = torch.tensor([(t + 1) % BLOCK + 1 for t in range(BLOCK)], dtype=torch.float32).repeat(2)
    assert torch.equal(emu.neighbour_read(False), expected)


def test_fresh_allocations_hold_garbage(emu):
    """An output the kernel does not write whole shows NaN where it did not (at::empty under the
    emulated device guard; a CPU allocation is often zeros)."""
    broken = emu.fresh_output(True)
    assert broken[-1].isnan() and not broken[:-1].isnan().any()
    assert torch.equal(emu.fresh_output(False), torch.ones(100))


def test_host_buffers_are_scribbled_after_an_async_copy(emu):
    """A kernel handed the host staging buffer instead of its device copy reads garbage (on a GPU: an
    illegal address, or a buffer the allocator already gave to someone else)."""
    values = torch.tensor([1.5, -2.0, 3.25, 0.0, 7.0])
    assert emu.host_buffer_in_kernel(values, True).isnan().all()
    assert torch.equal(emu.host_buffer_in_kernel(values, False), values + 1)


def test_device_guard_rejects_another_device(emu):
    """CUDAGuard refuses a device that is not a GPU; so does the emulated one (`meta` playing the CPU):
    a binding that makes its guard before checking its argument's device names the wrong problem."""
    x = torch.zeros(3, device="meta")
    with pytest.raises(
        RuntimeError,
        match=r"emulated CUDAGuard: expected a device of the emulated GPU \(cpu\), "
        r"got meta",
    ):
        emu.guard_order(x, True)
    with pytest.raises(RuntimeError, match=r"guard_order: x must be a CUDA tensor \(emulated: cpu\), got meta"):
        emu.guard_order(x, False)


def test_multiply_add_is_fused_as_on_a_gpu(emu):
    """nvcc contracts a * b + c into one FMA (--fmad=true): so does the emulator's build
    (-ffp-contract=fast). (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 with one rounding, 0 with two."""
    a = torch.tensor([1 + 2.0**-12])
    got = emu.multiply_add(a, a, torch.tensor([-(1 + 2.0**-11)])).item()
    assert got == 2.0**-24, f"a * b + c = {got!r}: the emulated kernels are not built with FMA contraction"


@pytest.fixture
def capturing(emu):
    """An emulated CUDA graph capture for the duration of the test."""
    emu.set_capturing(True)
    try:
        yield
    finally:
        emu.set_capturing(False)


@pytest.mark.parametrize("size", [0, 1, 447, 448, 449, 1000])
def test_plans_upload_without_pinned_memory_under_capture(emu, capturing, size):
    """cudaHostAlloc is not permitted during a CUDA graph capture: host staging fails there, and the
    LSTM bindings' plan upload (plan_upload.h) writes the values from kernel parameters instead, in
    launches of 448 values."""
    values = torch.randint(-(2**40), 2**40, (size,), generator=torch.Generator().manual_seed(size))
    with pytest.raises(RuntimeError, match="pinned host memory allocated while a CUDA graph is captured"):
        emu.upload_plan(values, True)
    assert torch.equal(emu.upload_plan(values, False), values)


def test_lstm_ops_under_capture_match_eager(emu, emulated_target):
    """bilstm and the trainable layer's ops while a graph is captured (plans uploaded by kernels) give
    the eager calls' results exactly."""
    lib = torch.ops.elmo_fast_emu
    L, B, T, P, C, lengths = LSTM_CASES["unsorted_with_empty_rows"]
    args = lstm_inputs(L, B, T, P, C, lengths, torch.float32, seed=3, states=True)
    xg, lens, w_hh, w_proj, h0, c0 = layer_case(5, 7, 3, 5, torch.float32, seed=4, lengths=[7, 0, 3, 1, 5])
    xg = xg.nan_to_num()

    def run():
        out = list(lib.bilstm(*args[:4], 3.0, 3.0, *args[4:]))
        y, h, c, saved = lib.lstm_layer_forward(xg, lens, w_hh, w_proj, 1.0, 0.7, h0, c0)
        grads = lib.lstm_layer_backward(
            torch.ones_like(y), None, None, saved, lens, None, list(xg.shape), w_hh, w_proj, 1.0, 0.7, h0, c0
        )
        return out + [y, h, c, saved, *grads]

    eager = run()
    emu.set_capturing(True)
    try:
        captured = run()
    finally:
        emu.set_capturing(False)
    for k, (a, b) in enumerate(zip(eager, captured)):
        assert torch.equal(a, b), f"output {k} differs under capture"
