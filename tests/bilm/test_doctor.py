"""`elmo-fast doctor`, `elmo-fast --version` and the first-use self-check (ELMO_FAST_SELFCHECK).

A broken op is simulated below the typed wrappers of elmo_fast.bilm.ops, where a miscompiled or
misbehaving kernel would be: ``torch.ops.elmo_fast.<op>`` is replaced by one whose results are off.
"""

import inspect
import json
import os
import re
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
from tolerances import assert_close, max_abs_error

from elmo_fast import __version__
from elmo_fast.bilm import ops, reference, selfcheck
from elmo_fast.bilm.build_report import BuildReport, arch_mismatch, build_report
from elmo_fast.bilm.selfcheck_cases import OPS
from elmo_fast.cli import main

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


def break_kernel(monkeypatch, name, wrong):
    """torch.ops.elmo_fast.<name>.default replaced by ``wrong(real_default, *args)``."""
    real = getattr(torch.ops.elmo_fast, name)
    monkeypatch.setattr(torch.ops.elmo_fast, name, SimpleNamespace(default=lambda *a: wrong(real.default, *a)))


def rows(stdout):
    """The table's rows as lists of columns (two spaces or more apart), the status reduced to its
    first word (ok, FAIL, error:, skip:); the build lines and the verdict left out."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("op "))
    table = [
        re.split(r"\s{2,}", line.strip())
        for line in lines[start + 1 :]
        if line.strip() and not line.startswith(("OK:", "FAIL:", "("))
    ]
    return [r[:8] + [r[8].split()[0]] for r in table]


def test_every_op_with_a_twin_is_checked():
    """A new op of elmo_fast.bilm.ops with a reference twin is in the doctor's table, or this fails."""
    public = {
        name
        for name, f in vars(ops).items()
        if inspect.isfunction(f) and f.__module__ == ops.__name__ and not name.startswith("_")
    }
    with_twin = {name for name in public if hasattr(reference, f"{name}_ref") or hasattr(reference, f"{name}_pair_ref")}
    assert with_twin == set(OPS)
    assert all(callable(getattr(reference, spec.twin)) for spec in OPS.values())


@needs_extension
@pytest.mark.slow
def test_doctor_on_a_healthy_install(capsys):
    rng = torch.get_rng_state()
    assert main(["doctor", "--device", "cpu"]) == 0
    assert torch.equal(torch.get_rng_state(), rng)  # fresh inputs from the OS, torch's RNG untouched
    out = capsys.readouterr().out
    assert out.splitlines()[0] == build_report().one_line()
    table = rows(out)
    assert {r[0] for r in table} == set(OPS) | {"ElmoBiLm"}
    assert all(r[-1] == "ok" for r in table), out
    checks = {(r[0], r[3], r[4]) for r in table}
    for name, spec in OPS.items():  # every dtype the op takes on the CPU, and its gradients
        assert {(name, str(d).replace("torch.", ""), "forward") for d in spec.forward["cpu"]} <= checks
        if spec.differentiable:
            assert {(name, "float32", "grad"), (name, "float64", "gradcheck")} <= checks
    assert {("ElmoBiLm", "fp32", "model"), ("ElmoBiLm", "bf16", "model")} <= checks
    bf16 = next(r for r in table if r[:5] == ["ElmoBiLm", "backend=reference", "cpu", "bf16", "model"])
    assert float(bf16[5]) > 1e-4  # it really ran in bf16
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith(f"OK: all {len(table)} checks passed on cpu"), verdict


@needs_extension
@pytest.mark.slow
def test_doctor_names_a_broken_forward_and_exits_1(monkeypatch, capsys):
    # the fused biLSTM off by 1e-4 (ten times the fp32 bound) on every output: the op's rows and the model's fail
    break_kernel(monkeypatch, "bilstm", lambda real, *a: tuple(t + 1e-4 for t in real(*a)))
    assert main(["doctor", "--device", "cpu", "--seed", "7"]) == 1
    out = capsys.readouterr().out
    status = {(r[0], r[3], r[4]): r for r in rows(out)}
    assert status["bilstm", "float32", "forward"][8] == "FAIL", out
    assert status["ElmoBiLm", "fp32", "model"][8] == "FAIL", out
    assert float(status["bilstm", "float32", "forward"][5]) == pytest.approx(1e-4, rel=0.01)
    assert status["char_cnn", "float32", "forward"][8] == "ok"
    assert status["lstm_layer", "float32", "grad"][8] == "ok"
    verdict = [line for line in out.splitlines() if line.startswith("FAIL:")]
    assert len(verdict) == 1 and "bilstm on cpu" in verdict[0] and "ElmoBiLm on cpu" in verdict[0]
    assert "char_cnn" not in verdict[0]
    assert "--seed 7" in out


@needs_extension
@pytest.mark.slow
def test_doctor_catches_a_wrong_backward(monkeypatch, capsys):
    # forward values right, the fused gate's backward 1% off: only gradient rows fail
    break_kernel(monkeypatch, "highway_gate_backward", lambda real, *a: tuple(g * 1.01 for g in real(*a)))
    assert main(["doctor", "--device", "cpu", "--no-model"]) == 1
    status = {(r[0], r[3], r[4]): r[8] for r in rows(capsys.readouterr().out)}
    assert status["highway_gate", "float32", "grad"] == "FAIL"
    assert status["highway_gate", "float64", "gradcheck"] == "FAIL"
    assert status["highway_gate", "float32", "forward"] == "ok"
    assert status["highway_gate", "bfloat16", "forward"] == "ok"
    assert status["char_cnn", "float32", "grad"] == "ok"


@needs_extension
@pytest.mark.slow
def test_doctor_reports_an_op_that_raises(monkeypatch, capsys):
    def crash(real, *a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    break_kernel(monkeypatch, "char_cnn", crash)
    assert main(["doctor", "--device", "cpu", "--no-model"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("char_cnn ") and " forward " in line)
    assert "error: RuntimeError: CUDA error: an illegal memory access was encountered" in line


@needs_extension
@pytest.mark.slow
def test_doctor_json(capsys):
    assert main(["doctor", "--device", "cpu", "--json", "--no-model", "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["devices"] == ["cpu"] and report["seed"] == 3
    assert report["build"]["version"] == __version__ and report["build"]["torch"] == torch.__version__
    assert report["build"]["backends"][0] == "cpu"
    results = report["results"]
    assert {r["op"] for r in results} == set(OPS)
    for r in results:
        assert r["status"] == "ok" and 0 <= r["ratio"] <= 1 and r["error"] >= 0, r
    # the bf16 rows really ran in bf16: errors far above fp32's
    assert max(r["error"] for r in results if r["dtype"] == "bfloat16") > 1e-4
    assert report["verdict"].startswith("OK: all")


def test_doctor_rejects_a_device_it_cannot_check(capsys):
    assert main(["doctor", "--device", "tpu"]) == 2
    assert "tpu" in capsys.readouterr().err


@needs_extension
def test_same_seed_same_inputs():
    a = selfcheck.check_op("bilstm", "cpu", seed=11)
    b = selfcheck.check_op("bilstm", "cpu", seed=11)
    assert [(r.check, r.error, r.detail) for r in a] == [(r.check, r.error, r.detail) for r in b]
    c = selfcheck.check_op("bilstm", "cpu", seed=12)
    assert [r.detail for r in a] != [r.detail for r in c] or [r.error for r in a] != [r.error for r in c]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    assert line.startswith(f"elmo-fast {__version__} (torch {torch.__version__}; ")
    if ops.HAS_EXTENSION:
        assert "; extension: cpu" in line
    if not ops.HAS_CUDA_KERNELS:
        assert line.endswith("; cuda: not built)")


def test_version_of_a_cuda_build():
    report = BuildReport(
        version="0.1.0",
        torch="2.13.0+cu124",
        torch_cuda="12.4",
        extension="loaded",
        extension_error=None,
        built_against_torch="2.13.0+cu124",
        backends=("cpu", "cuda"),
        cuda_runtime="12.4",
        cuda_archs=("sm_80", "sm_90", "compute_90"),
        cuda_training_ops=True,
        cuda_missing=None,
    )
    assert report.one_line() == (
        "elmo-fast 0.1.0 (torch 2.13.0+cu124; extension: cpu+cuda [built against torch "
        "2.13.0+cu124]; cuda: built, CUDA 12.4, sm_80 sm_90 compute_90)"
    )


def test_the_model_is_checked_in_each_precision_that_differs_there():
    assert [p.name for p in selfcheck.model_precisions("cpu")] == ["fp32", "bf16"]  # tf32 is fp32 on a CPU
    assert [p.name for p in selfcheck.model_precisions("cuda")] == ["fp32", "tf32", "bf16", "fp16"]


def test_arch_mismatch():
    archs = ("sm_80", "sm_90a", "compute_90")
    assert arch_mismatch(archs, (8, 0)) is None
    assert arch_mismatch(archs, (8, 6)) is None  # sm_80 SASS runs on later minors of 8
    assert arch_mismatch(archs, (10, 0)) is None  # PTX compute_90 is JIT-compiled for newer GPUs
    assert arch_mismatch(("sm_90a",), (9, 0)) is None
    assert "compute capability 7.5" in arch_mismatch(archs, (7, 5))
    assert arch_mismatch(("sm_80", "sm_90a"), (10, 0)) is not None  # no PTX, arch-specific SASS
    assert arch_mismatch(None, (7, 5)) is None  # not recorded: nothing to say


# --- the first-use self-check -------------------------------------------------------------------------


@pytest.fixture
def first_use(request):
    """The self-check enabled in this process with the mode given by the test; as before after."""
    before = (selfcheck._mode, selfcheck._strict)

    def enable(mode):
        selfcheck.forget_checked()
        selfcheck.enable(mode)

    yield enable
    selfcheck.enable(None if before[0] is None else before[0] + (",strict" if before[1] else ""))
    selfcheck.forget_checked()


@needs_extension
def test_first_use_strict_raises_one_line(monkeypatch, first_use):
    first_use("all,strict")  # CPU ops too, so that the mechanism is tested without a GPU
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    good = ops.highway_gate(projected, x)  # checked on its first use: right
    assert ("highway_gate", "cpu") in selfcheck._checked
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    ops.highway_gate(projected, x)  # checked once per process: not again
    selfcheck.forget_checked()
    with pytest.raises(selfcheck.SelfCheckError) as error:
        ops.highway_gate(projected, x)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("elmo-fast self-check (ELMO_FAST_SELFCHECK=all,strict): ")
    assert "highway_gate gives wrong results on cpu" in message and "highway_gate_ref" in message
    assert "highway_gate on cpu, float32 forward: max error 0.01" in message
    assert "raising, as strict asks" in message and "elmo-fast doctor" in message
    with pytest.raises(selfcheck.SelfCheckError, match="highway_gate gives wrong results"):
        ops.highway_gate(projected, x)  # failed: every later call says so too (checked once)
    assert len(selfcheck._checked) == 1
    selfcheck.enable(None)  # off: the op runs, wrong as it is
    assert torch.allclose(ops.highway_gate(projected, x) - 0.01, good)


@needs_extension
def test_first_use_falls_back_to_the_twin_with_one_warning(monkeypatch, first_use):
    """A failed check: one warning naming the op, its error and the bound; from then on the op's
    results are its twin's (and differentiable); the doctor's checks still see the broken kernel."""
    first_use("all")
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    projected, x = torch.randn(5, 6), torch.randn(5, 3)
    with pytest.warns(selfcheck.SelfCheckWarning) as caught:
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
    assert ("highway_gate", "cpu") not in selfcheck._passed


@needs_extension
def test_first_use_checks_cuda_ops_only_by_default(monkeypatch, first_use):
    first_use("1")
    break_kernel(monkeypatch, "highway_gate", lambda real, *a: real(*a) + 0.01)
    ops.highway_gate(torch.randn(2, 4), torch.randn(2, 2))  # a CPU op: not checked
    assert not selfcheck._checked


@needs_extension
def test_first_use_check_runs_inside_inference_mode_and_leaves_settings(first_use):
    first_use("all")
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with torch.inference_mode():
            ops.lstm_layer(
                torch.randn(2, 1, 3, 8), torch.tensor([3]), torch.randn(2, 8, 2), torch.randn(2, 2, 2), None, None
            )
        assert ("lstm_layer", "cpu") in selfcheck._passed
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


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
    assert selfcheck.parse_mode(value) == mode


@pytest.mark.parametrize("value", ["sometimes", "cuda,all", "0,strict2"])
def test_selfcheck_values_it_does_not_know(value):
    with pytest.raises(ValueError, match="expected 1 .*all: ops on every device; strict"):
        selfcheck.parse_mode(value)


def _mode_in_a_fresh_process(value):
    code = "from elmo_fast.bilm import ops, selfcheck; print(selfcheck._mode, selfcheck._strict, ops._first_use_hook is not None)"
    env = {k: v for k, v in os.environ.items() if k != selfcheck.ENV_VAR}
    if value is not None:
        env[selfcheck.ENV_VAR] = value
    out = subprocess.run(
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
        "import torch; from elmo_fast.bilm import ops, selfcheck; "
        "ops.highway_gate(torch.randn(2, 4), torch.randn(2, 2)); print(sorted(selfcheck._checked))"
    )
    env = dict(os.environ, ELMO_FAST_SELFCHECK="all")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('highway_gate', 'cpu')]"


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
def test_fallen_back_ops_give_their_twins_values(first_use, device):
    """Every op marked failed on the device runs its twin through elmo_fast.bilm.fallback, on the
    self-check's own cases (awkward shapes, the dtypes each device takes, lengths on the CPU beside
    device tensors, the CPU's bf16 weights beside fp32 gates): within the table's bound of the float64
    twin, in the op's dtype."""
    from elmo_fast.bilm.selfcheck_cases import OPS as cases
    from elmo_fast.bilm.tolerances import tolerance_ratio

    first_use("all")
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    for name in cases:
        selfcheck._checked.add((name, str(dev)))
        selfcheck._failed[(name, str(dev))] = f"{name}: marked failed by the test"
    gen = torch.Generator().manual_seed(3)
    for name, spec in cases.items():
        for dtype in spec.forward[dev.type]:
            for shape in range(spec.shapes):
                case = spec.build(gen, shape, dev, dtype)
                with torch.no_grad():
                    got = case.fast(*case.leaves)
                    want = case.reference(*[t.double() for t in case.leaves])
                got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
                for g, w in zip(got, want):
                    assert g.device == dev and g.dtype == case.leaves[0].dtype, (name, dtype, shape)
                    assert tolerance_ratio(g, w, dtype) <= 1.0, f"{name} {dtype} shape {shape}: the twin's values"


@needs_extension
def test_fallen_back_lstm_layer_reads_packed_gates(first_use):
    """lstm_layer's gates packed by token_index ([2, U, 4C]): the twin unpacks them."""
    first_use("all")
    gen = torch.Generator().manual_seed(4)
    B, T, P, C, U = 3, 5, 4, 6, 7
    lengths = torch.tensor([5, 0, 2])
    token_index = torch.randint(0, U, (B, T), generator=gen)
    xg = torch.randn(2, U, 4 * C, generator=gen)
    w_hh, w_proj = torch.randn(2, 4 * C, P, generator=gen) * 0.3, torch.randn(2, P, C, generator=gen) * 0.5
    kernel = ops.lstm_layer(xg, lengths, w_hh, w_proj, 3.0, 3.0, token_index=token_index)
    selfcheck._failed[("lstm_layer", "cpu")] = "lstm_layer: marked failed by the test"
    twin = ops.lstm_layer(xg, lengths, w_hh, w_proj, 3.0, 3.0, token_index=token_index)
    for k, t in zip(kernel, twin):
        assert max_abs_error(t, k) <= 1e-5


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.slow
def test_fallen_back_ops_take_packed_weights(first_use, dtype):
    """linear and bilstm with weights packed for the CPU's BRGeMM (ops.pack_weight, what the calibration
    may choose): their twins unpack them, and give the kernels' values."""
    from elmo_fast.bilm.fallback import unpack_weight

    first_use("all")
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(48, 10, generator=gen).to(dtype)
    assert torch.equal(unpack_weight(ops.pack_weight(w)), w)
    x, bias = torch.randn(3, 10, generator=gen), torch.randn(48, generator=gen)
    kernel = ops.linear(x, ops.pack_weight(w), bias)
    selfcheck._failed[("linear", "cpu")] = "linear: marked failed by the test"
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
    selfcheck._failed[("bilstm", "cpu")] = "bilstm: marked failed by the test"
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
    monkeypatch, first_use, emulator, random_models, wrong
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
    first_use(None)
    bilm = ElmoBiLm(*files, backend="fast")
    broken = bilm(ids)
    mask = want["mask"]
    off = max(max_abs_error(g[mask], w[mask]) for g, w in zip(broken["activations"], want["activations"]))
    assert off > 1e-4, f"the wrong kernel must move the vectors: {off:.3g}"

    first_use("all")
    with pytest.warns(selfcheck.SelfCheckWarning) as record:
        got = bilm(ids)
    # (the check's gradient rows also meet torch's warning that the stand-in has no autograd kernel)
    caught = [w for w in record if issubclass(w.category, selfcheck.SelfCheckWarning)]
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert re.search(
        r"char_cnn gives wrong results on cpu: char_cnn on cpu, float32 forward: max error "
        r"\S+ against the bound 1e-05 \(\S+x its bound\)",
        message,
    ), message
    assert "elmo_fast.bilm.reference.char_cnn_ref runs instead on cpu for the rest of this process" in message
    assert ("char_cnn", "cpu") in selfcheck._failed
    assert {("highway", "cpu"), ("bilstm", "cpu")} <= selfcheck._passed  # the real CPU kernels pass theirs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = bilm(batch_to_ids(sentences[::-1]))
    for out, batch in ((got, want), (again, ElmoBiLm(*files, backend="reference")(batch_to_ids(sentences[::-1])))):
        assert torch.equal(out["mask"], batch["mask"])
        for k, (g, w) in enumerate(zip(out["activations"], batch["activations"])):
            assert_close(g, w, torch.float32, what=f"layer {k} after the fallback")


# --- the doctor's CUDA rows, before any GPU: on the CPU emulator of the CUDA kernels ---------------

#: the CUDA kernels' ops the emulator provides, as torch.ops.elmo_fast_emu.<op> on CPU tensors
EMULATED_FORWARD = ("char_cnn", "highway_gate", "highway", "bilstm", "lstm_layer_forward")
EMULATED_BACKWARD = ("char_cnn_backward", "highway_gate_backward")


@pytest.fixture
def emulated_cuda_kernels():
    if os.environ.get("ELMO_FAST_CUDA_EMULATION") != "1":
        pytest.skip("CPU emulation of the CUDA kernels is opt-in: ELMO_FAST_CUDA_EMULATION=1")
    from cuda_emulation.build import load_emulation

    load_emulation()
    return torch.ops.elmo_fast_emu


@needs_extension
def test_doctor_cuda_rows_hold_on_the_emulated_cuda_kernels(monkeypatch, emulated_cuda_kernels):
    """The checks a GPU's doctor runs (CUDA's dtypes: the bf16 char CNN, the all-bf16 biLSTM), with the
    CUDA kernels compiled for the CPU emulator in place of the CPU ones: within the same bounds, so a
    first GPU run fails only for what differs on the hardware. Forward rows with the emulated forward
    kernels; gradient rows with the emulated backward kernels behind the CPU forwards' autograd."""
    from elmo_fast.bilm import selfcheck_cases

    monkeypatch.setattr(selfcheck_cases, "ONE_DTYPE_BILSTM_DEVICES", ("cpu", "cuda"))
    for spec in OPS.values():
        monkeypatch.setitem(spec.forward, "cpu", spec.forward["cuda"])
    real = {name: getattr(torch.ops.elmo_fast, name) for name in EMULATED_FORWARD}
    for name in EMULATED_FORWARD:
        monkeypatch.setattr(torch.ops.elmo_fast, name, getattr(emulated_cuda_kernels, name))
    results = [r for name in OPS for r in selfcheck.check_op(name, "cpu", seed=5, checks=("forward",))]
    for name in EMULATED_FORWARD:
        monkeypatch.setattr(torch.ops.elmo_fast, name, real[name])
    for name in EMULATED_BACKWARD:
        monkeypatch.setattr(torch.ops.elmo_fast, name, getattr(emulated_cuda_kernels, name))
    for name in ("char_cnn", "highway_gate", "highway"):
        results += selfcheck.check_op(name, "cpu", seed=6, checks=("grad", "gradcheck"))
    failed = [r.one_line() for r in results if r.status != "ok"]
    assert not failed, "\n".join(failed)
    ran = {(r.op, r.dtype, r.check) for r in results}
    assert {
        ("char_cnn", "bfloat16", "forward"),
        ("bilstm", "bfloat16", "forward"),
        ("char_cnn", "float32", "grad"),
        ("highway_gate", "float64", "gradcheck"),
    } <= ran
