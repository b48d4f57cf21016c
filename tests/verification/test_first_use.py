"""The first-use self-check (ELMO_FAST_SELFCHECK, elmo_fast.verification.first_use): only a wrong result
falls back to the op's reference twin, with one warning, and shows wherever the user looks; whatever
the check raises reaches the caller unchanged and leaves the op unchecked; the check runs the op in the
schedule the call takes (packed weights, GEMV thresholds, the LSTM's tuning).

A broken op is simulated below the typed wrappers of elmo_fast.bilm.ops (tests/support/broken_kernels.py).
"""

import os
import re
import sys
import warnings
from types import SimpleNamespace

import cli_process
import pytest
import torch
from broken_kernels import break_kernel
from cpu_features import packed_dtypes
from tolerances import assert_close, max_abs_error

from elmo_fast.bilm import ops, reference
from elmo_fast.verification import first_use, selfcheck

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


def mark_failed(op, device, schedule=None):
    """The op's check on ``device`` in ``schedule`` recorded as failed (as if its kernel gave wrong results)."""
    key = (op, device, schedule)
    first_use._passed.discard(key)
    first_use._failed[key] = f"{op}: marked failed by the test"


@needs_extension
def test_first_use_strict_raises_one_line(monkeypatch, selfcheck_mode):
    selfcheck_mode("all,strict")  # CPU ops too, so that the mechanism is tested without a GPU
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    good = ops.highway_gate(projected, x)  # checked on its first use: right
    assert first_use.state("highway_gate", "cpu") == "passed"
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    ops.highway_gate(projected, x)  # checked once per process: not again
    first_use.forget_checked()
    with pytest.raises(first_use.SelfCheckError) as error:
        ops.highway_gate(projected, x)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("elmo-fast self-check (ELMO_FAST_SELFCHECK=all,strict): ")
    assert "highway_gate gives wrong results on cpu" in message and "highway_gate_ref" in message
    assert "highway_gate on cpu, float32 forward: max error 0.01" in message
    assert "raising, as strict asks" in message and "elmo-fast doctor" in message
    with pytest.raises(first_use.SelfCheckError, match="highway_gate gives wrong results"):
        ops.highway_gate(projected, x)  # failed: every later call says so too (checked once)
    assert len(first_use._passed) + len(first_use._failed) == 1
    first_use.enable(None)  # off: the op runs, wrong as it is
    assert torch.allclose(ops.highway_gate(projected, x) - 0.01, good)


@needs_extension
def test_first_use_falls_back_to_the_twin_with_one_warning(monkeypatch, selfcheck_mode):
    """A failed check: one warning naming the op, its error and the bound; from then on the op's
    results are its twin's (and differentiable); the doctor's checks still see the broken kernel."""
    selfcheck_mode("all")
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    with pytest.warns(first_use.SelfCheckWarning) as caught:
        got = ops.highway_gate(projected, x)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "\n" not in message
    assert message.startswith("elmo-fast self-check (ELMO_FAST_SELFCHECK=all): highway_gate gives wrong results on cpu")
    assert "highway_gate on cpu, float32 forward: max error 0.01 against the bound 1e-05" in message
    assert "elmo_fast.bilm.reference.highway_gate_ref runs instead on cpu for the rest of this process" in message
    assert caught[0].filename == __file__  # pointed at the caller of the op
    assert torch.equal(got, reference.highway_gate_ref(projected, x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per op and device: none now
        p = projected.clone().requires_grad_()
        again = ops.highway_gate(p, x)
        again.sum().backward()
    assert torch.equal(again, reference.highway_gate_ref(projected, x))
    p_ref = projected.clone().requires_grad_()
    reference.highway_gate_ref(p_ref, x).sum().backward()
    assert torch.equal(p.grad, p_ref.grad)
    low = ops.highway_gate(projected.bfloat16(), x.bfloat16())  # the twin in fp32, the op's dtype back
    assert low.dtype == torch.bfloat16
    assert torch.equal(low, reference.highway_gate_ref(projected.bfloat16().float(), x.bfloat16().float()).bfloat16())
    # the doctor (and any check) runs the kernel itself, not the twin the process now uses
    assert any(r.status == "FAIL" for r in selfcheck.check_op("highway_gate", "cpu", checks=("forward",)))
    assert first_use.state("highway_gate", "cpu") == "failed"


@needs_extension
def test_first_use_checks_cuda_ops_only_by_default(monkeypatch, selfcheck_mode):
    selfcheck_mode("1")
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    ops.highway_gate(torch.randn(2, 4), torch.randn(2, 2))  # a CPU op: not checked
    assert not first_use._passed and not first_use._failed


@needs_extension
def test_first_use_check_runs_inside_inference_mode_and_leaves_settings(selfcheck_mode):
    selfcheck_mode("all")
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with torch.inference_mode():
            ops.lstm_layer(
                torch.randn(2, 1, 3, 8), torch.tensor([3]), torch.randn(2, 8, 2), torch.randn(2, 2, 2), None, None
            )
        assert first_use.state("lstm_layer", "cpu") == "passed"
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


# --- only a wrong result falls back; whatever the check raises is the caller's --------------------------


def _raising_until(flag, exc):
    """A kernel that raises ``exc`` while ``flag[0]`` holds, then runs the real one."""

    def kernel(real, *a):
        if flag[0]:
            raise exc
        return real(*a)

    return kernel


@needs_extension
@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        KeyboardInterrupt(),
    ],
    ids=["out_of_memory", "earlier_cuda_error", "interrupt"],
)
def test_an_exception_in_the_check_is_the_callers_and_leaves_the_op_unchecked(monkeypatch, selfcheck_mode, exc):
    """An out-of-memory error (the user's batch too large for what is left), an earlier CUDA error surfacing
    in the check's first kernel, an interrupt: the call raises that very exception, no warning, no fallback,
    and the op stays unchecked: its next call checks it again, and a kernel that then gives wrong results
    falls back then."""
    selfcheck_mode("all")
    flag = [True]
    break_kernel(monkeypatch, "highway_gate", _raising_until(flag, exc))
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", first_use.SelfCheckWarning)
        with pytest.raises(type(exc)) as raised:
            ops.highway_gate(projected, x)
    assert raised.value is exc and type(raised.value) is type(exc)
    assert first_use.state("highway_gate", "cpu") == "unchecked"
    assert first_use.fallbacks()["highway_gate"] == []
    # the next call checks again: here the kernel now gives wrong results, which falls back
    flag[0] = False
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    with pytest.warns(first_use.SelfCheckWarning, match="highway_gate gives wrong results on cpu"):
        got = ops.highway_gate(projected, x)
    assert torch.equal(got, reference.highway_gate_ref(projected, x))
    assert first_use.state("highway_gate", "cpu") == "failed"


@needs_extension
def test_a_check_raising_in_another_thread_leaves_the_op_to_be_checked_there(monkeypatch, selfcheck_mode):
    """A check that raised (another thread's OOM) decides nothing: a later call in another thread checks,
    and passes."""
    import threading

    selfcheck_mode("all")
    flag = [True]
    break_kernel(monkeypatch, "highway_gate", _raising_until(flag, torch.OutOfMemoryError("CUDA out of memory.")))
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    errors = []

    def call():
        try:
            ops.highway_gate(projected, x)
        except torch.OutOfMemoryError as e:
            errors.append(e)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert len(errors) == 1 and first_use.state("highway_gate", "cpu") == "unchecked"
    flag[0] = False
    ops.highway_gate(projected, x)
    assert first_use.state("highway_gate", "cpu") == "passed"


@needs_extension
def test_outputs_of_the_wrong_shape_are_wrong_results(monkeypatch, selfcheck_mode):
    selfcheck_mode("all")
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a)[:, :-1])
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    with pytest.warns(
        first_use.SelfCheckWarning, match=r"max error inf .*output shapes \[\(\d+, \d+\)\] != the twin's"
    ):
        got = ops.highway_gate(projected, x)
    assert torch.equal(got, reference.highway_gate_ref(projected, x))


# --- the check runs the op as the call does: the model's tuning, its packed weights ------------------------


def _model_with(random_models, **choice):
    """A random 'tiny' biLM (P 16, C 64: packable) whose CPU tuning is ``choice`` over its own."""
    import dataclasses

    from elmo_fast import ElmoBiLm

    bilm = ElmoBiLm(*random_models("tiny", exercise_clips=True), backend="fast")
    tuning = dataclasses.replace(bilm.cpu_tuning(), **choice)
    bilm.cpu_tuning = lambda precision=None: tuning
    return bilm


SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["über", "東京", "antidisestablishmentarianism"], ["a"]]


def _assert_reference_vectors(bilm, random_models, ids):
    from elmo_fast import ElmoBiLm

    want = ElmoBiLm(*random_models("tiny", exercise_clips=True), backend="reference")(ids)
    got = bilm(ids)
    for k, (g, w) in enumerate(zip(got["activations"], want["activations"])):
        assert_close(g[want["mask"]], w[want["mask"]], torch.float32, what=f"layer {k} after the fallback")


ALWAYS = 2**31 - 1


@needs_extension
def test_the_check_runs_the_tuning_the_model_passes(monkeypatch, selfcheck_mode, random_models):
    """The biLSTM kernel wrong only in one schedule (its GEMV with the directions concurrent), which the
    model's tuning asks for: the check runs that tuning, so it fails, names the schedule, and the model's
    vectors are the reference's; a call in the kernels' defaults still runs the kernel."""
    from elmo_fast import batch_to_ids

    tuning = (ALWAYS, ALWAYS, 1)
    bilm = _model_with(random_models, lstm=tuning, packed=False)

    def wrong_in_that_schedule(real, *a):
        out = real(*a)
        return tuple(t + 1e-3 for t in out) if a[8] is not None and tuple(a[8]) == tuning else out

    break_kernel(monkeypatch, "bilstm", wrong_in_that_schedule)
    selfcheck_mode("all")
    ids = batch_to_ids(SENTENCES)
    with pytest.warns(first_use.SelfCheckWarning) as record:
        _assert_reference_vectors(bilm, random_models, ids)
    lines = [str(w.message) for w in record if issubclass(w.category, first_use.SelfCheckWarning)]
    assert len(lines) == 1 and "bilstm gives wrong results on cpu (tuning always,always,1)" in lines[0], lines
    assert first_use.fallbacks()["bilstm"] == ["cpu (tuning always,always,1)"]
    assert first_use.state("bilstm", "cpu", (None, None, tuning)) == "failed"
    assert first_use.state("bilstm", "cpu") == "unchecked"  # the defaults: never called here, not condemned
    xg0, index, lengths = torch.randn(3, 2, 4 * 6), torch.tensor([[0, 1, 2]]), torch.tensor([3])
    w = [torch.randn(4 * 6, 4) * 0.3, torch.randn(4 * 6, 4) * 0.3, torch.randn(4 * 6), torch.randn(4, 6) * 0.3] * 2
    ops.bilstm(xg0, index, lengths, w, 3.0, 3.0)
    assert first_use.state("bilstm", "cpu") == "passed"


@needs_extension
def test_the_check_runs_the_packed_weights_the_model_passes(monkeypatch, selfcheck_mode, random_models):
    """linear wrong only on packed weights (a broken BRGeMM path): the model's packed fp32 layer-0 gates
    are checked packed, fail, name the schedule, and fall back."""
    from elmo_fast import batch_to_ids

    try:
        ops.linear(torch.randn(2, 16), ops.pack_weight(torch.randn(16, 16)))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"this CPU cannot run packed weights: {e}")
    bilm = _model_with(random_models, packed=True)
    break_kernel(monkeypatch, "linear", lambda real, x, w, *a: real(x, w, *a) + (1e-3 if w.dim() == 4 else 0.0))
    selfcheck_mode("all")
    with pytest.warns(first_use.SelfCheckWarning) as record:
        _assert_reference_vectors(bilm, random_models, batch_to_ids(SENTENCES))
    lines = [str(w.message) for w in record if issubclass(w.category, first_use.SelfCheckWarning)]
    assert len(lines) == 1 and "linear gives wrong results on cpu (packed float32)" in lines[0], lines
    assert first_use.fallbacks()["linear"] == ["cpu (packed float32)"]
    assert first_use.fallback_summary() == "linear on cpu (packed float32)"


@pytest.mark.parametrize(
    "value,mode",
    [
        ("0", (None, False)),
        ("off", (None, False)),
        ("", (None, False)),
        ("1", ("cuda", False)),
        ("cuda", ("cuda", False)),
        ("all", ("all", False)),
        ("strict", ("cuda", True)),
        ("all,strict", ("all", True)),
        ("STRICT+all", ("all", True)),
        ("1,strict", ("cuda", True)),
    ],
)
def test_selfcheck_values(value, mode):
    assert first_use.parse_mode(value) == mode


@pytest.mark.parametrize("value", ["sometimes", "cuda,all", "0,strict2"])
def test_selfcheck_values_it_does_not_know(value):
    with pytest.raises(ValueError, match="expected 1 .*all: ops on every device; strict"):
        first_use.parse_mode(value)


def _mode_in_a_fresh_process(value):
    code = (
        "from elmo_fast.bilm import ops; from elmo_fast.verification import first_use; "
        "print(first_use._mode, first_use._strict, ops._first_use_hook is not None)"
    )
    env = {k: v for k, v in os.environ.items() if k != first_use.ENV_VAR}
    if value is not None:
        env[first_use.ENV_VAR] = value
    out = cli_process.run(
        [sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), out.stderr


@pytest.mark.slow
def test_unset_variable_checks_cuda_ops_and_falls_back():
    """On by default, until a GPU run has verified the kernels: CUDA ops, falling back."""
    assert _mode_in_a_fresh_process(None)[0] == "cuda False True"
    assert _mode_in_a_fresh_process("0")[0] == "None False False"
    assert _mode_in_a_fresh_process("all,strict")[0] == "all True True"


@pytest.mark.slow
def test_unknown_value_warns_and_the_default_applies():
    mode, stderr = _mode_in_a_fresh_process("sometimes")
    assert mode == "cuda False True"
    assert "ELMO_FAST_SELFCHECK='sometimes': expected 1" in stderr and "the default (cuda) applies" in stderr


@needs_extension
@pytest.mark.slow
def test_variable_read_at_import():
    code = (
        "import torch; from elmo_fast.bilm import ops; "
        "from elmo_fast.verification import first_use; "
        "ops.highway_gate(torch.randn(2, 4), torch.randn(2, 2)); print(sorted(first_use._passed))"
    )
    env = dict(os.environ, ELMO_FAST_SELFCHECK="all")
    out = cli_process.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('highway_gate', 'cpu', None)]"


@needs_extension
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not (torch.cuda.is_available() and ops.HAS_CUDA_KERNELS),
                reason="no CUDA GPU, or no CUDA kernels in this build",
            ),
        ),
    ],
)
def test_fallen_back_ops_give_their_twins_values(selfcheck_mode, device):
    """Every op marked failed on the device runs its twin through elmo_fast.verification.fallback, on the
    self-check's own cases (awkward shapes, the dtypes each device takes, lengths on the CPU beside
    device tensors, the CPU's bf16 weights beside fp32 gates): within the table's bound of the float64
    twin, in the op's dtype."""
    from elmo_fast.verification.selfcheck_cases import OPS as cases
    from elmo_fast.verification.tolerances import tolerance_ratio

    selfcheck_mode("all")
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    for name in cases:
        mark_failed(name, str(dev))
    gen = torch.Generator().manual_seed(3)
    for name, spec in cases.items():
        for dtype in spec.forward[dev.type]:
            for shape in spec.shapes(None):
                case = spec.build(gen, shape, dev, dtype, None)
                with torch.no_grad():
                    got = case.fast(*case.leaves)
                    want = case.reference(*[t.double() for t in case.leaves])
                got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
                for g, w in zip(got, want):
                    assert g.device == dev and g.dtype == case.leaves[0].dtype, (name, dtype, shape)
                    assert tolerance_ratio(g, w, dtype) <= 1.0, f"{name} {dtype} shape {shape}: the twin's values"


@needs_extension
def test_fallen_back_lstm_layer_reads_packed_gates(selfcheck_mode):
    """lstm_layer's gates packed by token_index ([2, U, 4C]): the twin unpacks them."""
    selfcheck_mode("all")
    gen = torch.Generator().manual_seed(4)
    B, T, P, C, U = 3, 5, 4, 6, 7
    lengths = torch.tensor([5, 0, 2])
    token_index = torch.randint(0, U, (B, T), generator=gen)
    xg = torch.randn(2, U, 4 * C, generator=gen)
    w_hh, w_proj = torch.randn(2, 4 * C, P, generator=gen) * 0.3, torch.randn(2, P, C, generator=gen) * 0.5
    kernel = ops.lstm_layer(xg, lengths, w_hh, w_proj, 3.0, 3.0, token_index=token_index)
    mark_failed("lstm_layer", "cpu")
    twin = ops.lstm_layer(xg, lengths, w_hh, w_proj, 3.0, 3.0, token_index=token_index)
    for k, t in zip(kernel, twin):
        assert max_abs_error(t, k) <= 1e-5


@needs_extension
@pytest.mark.parametrize("dtype", packed_dtypes())
def test_fallen_back_ops_take_packed_weights(selfcheck_mode, dtype):
    """linear and bilstm with weights packed for the CPU's BRGeMM (ops.pack_weight, what the calibration
    may choose): their twins unpack them, and give the kernels' values."""
    from elmo_fast.verification.fallback import unpack_weight

    selfcheck_mode("all")
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(48, 10, generator=gen).to(dtype)
    assert torch.equal(unpack_weight(ops.pack_weight(w)), w)
    x, bias = torch.randn(3, 10, generator=gen), torch.randn(48, generator=gen)
    kernel = ops.linear(x, ops.pack_weight(w), bias)
    mark_failed("linear", "cpu", (dtype, None, None))  # the schedule of a call with a packed weight
    twin = ops.linear(x, ops.pack_weight(w), bias)
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    assert twin.shape == kernel.shape and max_abs_error(twin, kernel) <= bound * kernel.abs().max()

    L, B, T, P, C, U = 2, 3, 4, 16, 32, 6
    lengths = torch.tensor([4, 1, 0])
    token_index = torch.randint(0, U, (B, T), generator=gen)
    xg0 = torch.randn(U, 2, 4 * C, generator=gen)
    plain = []
    for _layer in range(L):
        for _direction in range(2):
            plain += [
                (torch.randn(4 * C, P, generator=gen) * 0.3).to(dtype),
                (torch.randn(4 * C, P, generator=gen) * 0.3).to(dtype),
                torch.randn(4 * C, generator=gen),
                (torch.randn(P, C, generator=gen) * 0.3).to(dtype),
            ]
    # every GEMM weight packed: w_hh and w_proj, and w_ih of layers >= 1 (layer 0's is folded into xg0)
    packed = [w if k % 4 == 2 or (k < 8 and k % 4 == 0) else ops.pack_weight(w) for k, w in enumerate(plain)]
    kernel = ops.bilstm(xg0, token_index, lengths, packed, 3.0, 3.0)
    mark_failed("bilstm", "cpu", (dtype, None, None))
    twin = ops.bilstm(xg0, token_index, lengths, packed, 3.0, 3.0)
    for k, t in zip(kernel, twin):
        assert t.shape == k.shape and max_abs_error(t, k) <= 5 * bound * max(1.0, k.abs().max().item())


@pytest.fixture(scope="module")
def emulator():
    """The CUDA kernels compiled for the CPU (tests/cuda_emulation), as torch.ops.elmo_fast_emu."""
    from cuda_emulation.build import cuda_include_dir, load_emulation

    if cuda_include_dir() is None:
        pytest.skip("the CPU emulation of the CUDA kernels needs the CUDA headers (cuda_runtime_api.h); set CUDA_HOME")
    load_emulation()
    return torch.ops.elmo_fast_emu


def _last_column_unwritten(emu, ids, emb, weights, biases, activation):
    """The emulated CUDA char CNN with a kernel whose filter loop stops one short: each convolution's
    last column left as the zeroed output had it."""
    out = emu.char_cnn.default(ids, emb, weights, biases, activation)
    ends = torch.tensor([w.shape[0] for w in weights]).cumsum(0) - 1
    return out.index_fill(1, ends, 0.0)


def _bf16_table(emu, ids, emb, weights, biases, activation):
    """The emulated CUDA char CNN with its inputs read in bf16 (a kernel keeping its folded table in bf16:
    errors ~1e-3, a hundred times the fp32 bar, invisible to the eye)."""
    if emb.dtype != torch.float32:
        return emu.char_cnn.default(ids, emb, weights, biases, activation)
    low = [t.bfloat16().float() for t in [emb, *weights]]
    return emu.char_cnn.default(ids, low[0], low[1:], biases, activation)


@needs_extension
@pytest.mark.filterwarnings("ignore:elmo_fast_emu.*an autograd kernel was not registered")
@pytest.mark.parametrize("wrong", [_last_column_unwritten, _bf16_table], ids=["unwritten_column", "bf16_table"])
def test_first_use_catches_a_wrong_emulated_cuda_kernel_in_the_model(
    monkeypatch, selfcheck_mode, emulator, random_models, wrong
):
    """The proof on the emulator: the model's char CNN run by the CUDA kernel, made wrong on purpose,
    compiled for the CPU (so the check runs in mode `all`: the emulated GPU is the CPU). Unchecked, the
    vectors are off; checked, its first use gives one warning naming char_cnn, its error and the bound,
    and the vectors then equal the reference's (fp32 bar), batch after batch, with no other warning."""
    from elmo_fast import ElmoBiLm, batch_to_ids

    files = random_models("tiny", exercise_clips=True)
    sentences = [
        ["The", "cat", "sat", "on", "the", "mat", "."],
        ["über", "東京", "antidisestablishmentarianism"],
        ["a"],
    ]
    ids = batch_to_ids(sentences)
    want = ElmoBiLm(*files, backend="reference")(ids)
    monkeypatch.setattr(torch.ops.elmo_fast, "char_cnn", SimpleNamespace(default=lambda *a: wrong(emulator, *a)))
    selfcheck_mode(None)
    bilm = ElmoBiLm(*files, backend="fast")
    broken = bilm(ids)
    mask = want["mask"]
    off = max(max_abs_error(g[mask], w[mask]) for g, w in zip(broken["activations"], want["activations"]))
    assert off > 1e-4, f"the wrong kernel must move the vectors: {off:.3g}"

    selfcheck_mode("all")
    with pytest.warns(first_use.SelfCheckWarning) as record:
        got = bilm(ids)
    # (the check's gradient rows also meet torch's warning that the stand-in has no autograd kernel)
    caught = [w for w in record if issubclass(w.category, first_use.SelfCheckWarning)]
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert re.search(
        r"char_cnn gives wrong results on cpu: char_cnn on cpu, float32 forward: max error "
        r"\S+ against the bound 1e-05 \(\S+x its bound\)",
        message,
    ), message
    assert "elmo_fast.bilm.reference.char_cnn_ref runs instead on cpu for the rest of this process" in message
    assert first_use.state("char_cnn", "cpu") == "failed"
    # the real CPU kernels pass theirs (in the schedule the model runs them in)
    assert {(op, device) for op, device, _ in first_use._passed} >= {("highway", "cpu"), ("bilstm", "cpu")}
    assert first_use.fallbacks()["char_cnn"] == ["cpu"] and first_use.fallbacks()["bilstm"] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = bilm(batch_to_ids(sentences[::-1]))
    for out, batch in ((got, want), (again, ElmoBiLm(*files, backend="reference")(batch_to_ids(sentences[::-1])))):
        assert torch.equal(out["mask"], batch["mask"])
        for k, (g, w) in enumerate(zip(out["activations"], batch["activations"])):
            assert_close(g, w, torch.float32, what=f"layer {k} after the fallback")
