"""Every compiled op against its reference twin on this machine's devices: what ``elmo-fast doctor``
runs, and what ``ELMO_FAST_SELFCHECK`` runs for an op the first time a process uses it.

Each op of :mod:`elmo_fast.bilm.ops` that has a twin in :mod:`elmo_fast.bilm.reference` gets fresh
random inputs of small, awkward shapes (:mod:`elmo_fast.bilm.selfcheck_cases`) and is held to the
project's bounds (:mod:`elmo_fast.bilm.tolerances`), the twin computing in float64 on the same
(already rounded) inputs:

* ``forward``    every output, elementwise within ``TOL[dtype]``: float32, and bfloat16 where the
                 op takes it on that device;
* ``grad``       the gradients of a random projection of the outputs, float32, fast vs twin,
                 within ``GRAD_RTOL[float32]`` of each gradient's largest entry;
* ``gradcheck``  float64: the op's backward against central differences of its own forward along
                 random directions (torch.autograd.gradcheck's fast mode and default bounds);
* ``model``      :class:`~elmo_fast.bilm.model.ElmoBiLm` fast vs reference on a few sentences of a
                 small random model, in each precision (fp32, bf16; on CUDA also tf32 and fp16)
                 within its stated bound (:mod:`elmo_fast.bilm.precision`).

``ELMO_FAST_SELFCHECK`` (read when :mod:`elmo_fast.bilm` is imported; :func:`enable` sets it later):
the first call of each op on each device runs that op's checks above on that device first (a few
milliseconds of small cases; benchmarks/bench_selfcheck.py measures it). On by default for CUDA ops, until a
GPU run has verified the kernels on the hardware; an op that fails its check gives ONE warning
(:class:`SelfCheckWarning`, naming the op, its error and the bound) and runs its reference twin
(:mod:`elmo_fast.bilm.fallback`: slower, right) on that device for the rest of the process.

* unset, ``1`` or ``cuda``: ops on CUDA tensors are checked (the default);
* ``all``: ops on CPU tensors too;
* ``strict`` (with ``all``: ``all,strict``): a failed check raises :class:`SelfCheckError`, one line
  naming the op and its error, at that call and every later one, instead of falling back;
* ``0`` (``off``): no check; an op call then pays one ``is None`` test.

When on, an op call on a device the mode does not check pays one Python call; on a checked device,
one set lookup after its first use. The checks themselves (and the doctor's) run the real kernels
whatever earlier checks decided, never a twin, and check nothing again on the way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from ..durable import scratch_dir
from . import fallback, ops
from .precision import FP32, PRECISIONS, Precision, tf32_switch
from .selfcheck_cases import OPS, Case, OpSpec
from .tolerances import GRAD_RTOL, GRADCHECK, TOL, max_abs_error, tolerance_ratio

ENV_VAR = "ELMO_FAST_SELFCHECK"


class SelfCheckError(RuntimeError):
    """A compiled op gave results outside its bound against its reference twin on this device."""


@dataclass
class Result:
    """One row of the report: an op (or the model), on a device, in a dtype, one kind of check."""

    op: str
    twin: str
    device: str
    dtype: str
    check: str
    #: "ok", "FAIL" (outside the bound), "error" (the op raised) or "skip" (cannot run here: see detail)
    status: str
    #: the largest error (max abs error; for a gradient, of the worst input's gradient)
    error: float | None = None
    #: the bound it was held to, as a formula or a number
    bound: str = ""
    #: error / allowed error where that is largest: <= 1 within the bound
    ratio: float | None = None
    #: the worst case's shape, the exception, or why the check was skipped
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "error")

    def one_line(self) -> str:
        """``char_cnn on cuda:0, float32 forward: max abs error 3.1e-01 > 1e-05 (N=7 L=9 ...)``."""
        where = f"{self.op} on {self.device}, {self.dtype} {self.check}"
        if self.status == "error":
            return f"{where}: raised {self.detail}"
        used = f" ({self.ratio:.3g}x its bound)" if self.ratio is not None else ""
        return f"{where}: max error {self.error:.3g} against the bound {self.bound}{used}, case {self.detail}"

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("error", "ratio"):  # JSON has no inf / nan
            if d[key] is not None and not (d[key] == d[key] and abs(d[key]) != float("inf")):
                d[key] = str(d[key])
        return d


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def fresh_seed() -> int:
    """A seed from the OS (the caller's torch RNG is neither read nor advanced)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


@contextmanager
def _cudnn_tf32_off(device: torch.device) -> Iterator[None]:
    """cuDNN's convolutions (the reference char CNN's on CUDA) in exact fp32."""
    with tf32_switch(False, "cudnn") if device.type == "cuda" else contextlib.nullcontext():
        yield


@contextmanager
def _exact_arithmetic(device: torch.device) -> Iterator[None]:
    """Autograd on (also inside the caller's inference_mode or no_grad), autocast off, TF32 off for
    GEMMs and convolutions: the bounds are those of fp32 arithmetic. The caller's settings come back
    after (TF32 is a process-wide flag: another thread's GEMMs see the change meanwhile)."""
    with (
        FP32.gemm_mode(device),
        _cudnn_tf32_off(device),
        torch.inference_mode(False),
        torch.enable_grad(),
        torch.autocast(device.type, enabled=False),
    ):
        yield


#: per thread: inside a check (check_op, check_model), ops run their real kernels, unchecked
_local = threading.local()


@contextmanager
def _real_kernels() -> Iterator[None]:
    """Ops called in this block (by this thread) run their kernels: neither checked nor fallen back."""
    before = getattr(_local, "bypass", False)
    _local.bypass = True
    try:
        yield
    finally:
        _local.bypass = before


# --- the three checks of an op ---------------------------------------------------------------------


def _tuple(out) -> tuple[Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _forward(case: Case, dtype: torch.dtype) -> tuple[float, float]:
    """(max abs error, ratio to TOL[dtype]) of every output against the twin in float64."""
    with torch.no_grad():
        got = _tuple(case.fast(*case.leaves))
        want = _tuple(case.reference(*[t.double() for t in case.leaves]))
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        raise SelfCheckError(
            f"output shapes {[tuple(g.shape) for g in got]} != the twin's {[tuple(w.shape) for w in want]}"
        )
    return (
        max(max_abs_error(g, w) for g, w in zip(got, want)),
        max(tolerance_ratio(g, w, dtype) for g, w in zip(got, want)),
    )


def _cotangents(outputs: Sequence[Tensor], gen: torch.Generator) -> list[Tensor]:
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device) for o in outputs]


def _grads(fn, leaves: list[Tensor], cotangents: list[Tensor]) -> list[Tensor]:
    leaves = [t.detach().requires_grad_() for t in leaves]
    out = _tuple(fn(*leaves))
    return list(
        torch.autograd.grad(out, leaves, [c.to(o.dtype) for c, o in zip(cotangents, out)], materialize_grads=True)
    )


def _grad(case: Case, gen: torch.Generator, dtype: torch.dtype) -> tuple[float, float, float, str]:
    """(error, bound, ratio, the worst input's name): each input's gradient, fast vs the twin in float64,
    bound GRAD_RTOL[dtype] of the twin's largest entry."""
    with torch.no_grad():
        shapes = _tuple(case.reference(*[t.double() for t in case.leaves]))
    cot = _cotangents(shapes, gen)
    fast = _grads(case.fast, case.leaves, cot)
    want = _grads(case.reference, [t.double() for t in case.leaves], cot)
    worst = (0.0, 0.0, 0.0, "")
    for name, g, w in zip(case.names, fast, want):
        diff = (g.double() - w).abs()
        err = float("inf") if bool(diff.isnan().any()) else diff.max().item() if diff.numel() else 0.0
        bound = GRAD_RTOL[dtype] * (w.abs().max().item() if w.numel() else 0.0)
        ratio = err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
        if ratio >= worst[2]:
            worst = (err, bound, ratio, name)
    return worst


def _gradcheck(case: Case, gen: torch.Generator, directions: int = 2) -> tuple[float, float, float]:
    """(error, bound, ratio) of u . J v from the op's backward against (f(x + eps v) - f(x - eps v)) . u
    / 2 eps from its forward, float64, along random directions v and cotangents u."""
    eps, atol, rtol = GRADCHECK["eps"], GRADCHECK["atol"], GRADCHECK["rtol"]
    leaves = [t.detach().double() for t in case.leaves]
    worst = (0.0, 0.0, 0.0)
    for _ in range(directions):
        v = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.device) for t in leaves]
        with torch.no_grad():
            out = _tuple(case.fast(*leaves))
        u = _cotangents(out, gen)
        analytic = sum((g * d).sum() for g, d in zip(_grads(case.fast, leaves, u), v)).item()
        with torch.no_grad():
            plus = _tuple(case.fast(*[t + eps * d for t, d in zip(leaves, v)]))
            minus = _tuple(case.fast(*[t - eps * d for t, d in zip(leaves, v)]))
        numeric = sum(((p - m) * c).sum() for p, m, c in zip(plus, minus, u)).item() / (2 * eps)
        err, bound = abs(analytic - numeric), atol + rtol * abs(numeric)
        if err != err:
            err = float("inf")
        if err / bound >= worst[2]:
            worst = (err, bound, err / bound)
    return worst


# --- one op on one device ----------------------------------------------------------------------------


def _skip_reason(spec: OpSpec, device: torch.device, check: str) -> str | None:
    if not ops.HAS_EXTENSION:
        return f"the extension is not loaded ({ops.EXTENSION_IMPORT_ERROR})"
    if device.type == "cuda":
        if not ops.HAS_CUDA_KERNELS and spec.name not in ("linear", "layer0_gates"):  # ATen's GEMMs on CUDA
            return "no CUDA kernels in this build"
        if check in spec.cuda_training and not ops.HAS_CUDA_BACKWARD:
            return "no CUDA training ops in this build"
    return None


def _row(spec: OpSpec, device: torch.device, dtype: torch.dtype, check: str) -> Result:
    return Result(spec.name, spec.twin, str(device), _dtype_name(dtype), check, "ok")


def check_op(
    name: str,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    checks: Sequence[str] = ("forward", "grad", "gradcheck"),
) -> list[Result]:
    """The rows of one op on one device: forward in each dtype the op takes there, then (if it is
    differentiable) grad in float32 and gradcheck in float64, each over every shape of its case,
    the worst shape reported. Fresh random inputs unless ``seed`` is given."""
    spec = OPS[name]
    device = torch.device(device)
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    plan: list[tuple[str, torch.dtype]] = []
    if "forward" in checks:
        plan += [("forward", dtype) for dtype in spec.forward.get(device.type, (torch.float32,))]
    if spec.differentiable:
        plan += [(c, d) for c, d in (("grad", torch.float32), ("gradcheck", torch.float64)) if c in checks]
    results = []
    with _exact_arithmetic(device), _real_kernels():
        for check, dtype in plan:
            row = _row(spec, device, dtype, check)
            results.append(row)
            reason = _skip_reason(spec, device, check)
            if reason is not None:
                row.status, row.detail = "skip", reason
                continue
            try:
                for shape in range(spec.shapes):
                    case = spec.build(gen, shape, device, dtype)
                    if check == "forward":
                        err, ratio = _forward(case, dtype)
                        tol = TOL[dtype]
                        bound = f"{tol['atol']:.0e}" + (f"+{tol['rtol']:.0e}|ref|" if tol["rtol"] else "")
                        what = case.what
                    elif check == "grad":
                        err, b, ratio, leaf = _grad(case, gen, dtype)
                        bound, what = f"{b:.1e}", f"{case.what}, d/d {leaf}"
                    else:
                        err, b, ratio = _gradcheck(case, gen)
                        bound, what = f"{b:.1e}", case.what
                    if row.ratio is None or ratio >= row.ratio:
                        row.error, row.bound, row.ratio, row.detail = err, bound, ratio, what
            except Exception as exc:  # noqa: BLE001  (an op that raises is a failed check, reported as such)
                row.status, row.detail = "error", _first_line(exc)
                continue
            if not row.ratio <= 1.0:  # NaN fails too
                row.status = "FAIL"
    return results


# --- the whole model ------------------------------------------------------------------------------


def _sentences(gen: torch.Generator, n: int = 5) -> list[list[str]]:
    """Random sentences: an empty one, a one-token one, a token longer than 50 characters, non-ASCII."""
    chars = "abcdefghijklmnopqrstuvwxyzäöü東京.,!?"

    def word() -> str:
        k = int(torch.randint(1, 9, (1,), generator=gen))
        return "".join(chars[int(i)] for i in torch.randint(0, len(chars), (k,), generator=gen))

    out = [[word() for _ in range(int(torch.randint(1, 14, (1,), generator=gen)))] for _ in range(n)]
    out[0] = ["x" * 60] + out[0]
    out[1] = [word()]
    out[-1] = []
    return out


def model_precisions(device: torch.device | str) -> list[Precision]:
    """The precisions whose numbers differ on ``device``: fp32 and bf16 everywhere; on CUDA also tf32
    (exactly fp32 on a CPU, which has no TF32) and fp16 (CUDA only)."""
    cuda = torch.device(device).type == "cuda"
    return [p for p in PRECISIONS.values() if cuda or (p.name != "tf32" and not p.cuda_only)]


def _bound_text(p: Precision) -> str:
    b = p.bound
    if not b.max_rel:
        return f"{b.max_abs:.0e}"
    return f"{100 * b.max_rel:g}% of max|ref|" + ("" if b.rms_rel is None else f", rms {100 * b.rms_rel:g}%")


def _layer_ratio(got: Tensor, want: Tensor, mask: Tensor, p: Precision) -> tuple[float, float]:
    """(max abs error, its ratio to the precision's bound) of one output layer over the unmasked positions:
    max |error| <= max_abs + max_rel * max |ref|, and RMS(error) <= rms_rel * RMS(ref) where stated."""
    g, w = got[mask].double().cpu(), want[mask].double().cpu()
    if w.numel() == 0:
        return 0.0, 0.0
    err = (g - w).abs()
    b = p.bound
    ratio = err.max().item() / (b.max_abs + b.max_rel * w.abs().max().item())
    if b.rms_rel is not None:
        ratio = max(ratio, (err.pow(2).mean().sqrt() / w.pow(2).mean().sqrt()).item() / b.rms_rel)
    return err.max().item(), (float("inf") if ratio != ratio else ratio)


def check_model(device: torch.device | str = "cpu", seed: int | None = None) -> list[Result]:
    """ElmoBiLm fast vs reference (fp32) on a few random sentences of a random 'tiny' model (clips
    exercised), in each of :func:`model_precisions`, per output layer within that precision's stated
    bound (:mod:`elmo_fast.bilm.precision`; fp32's is the tolerance table's 1e-5)."""
    from ..formats.random_models import random_model  # random weights written and read back as a user's model files
    from .char_ids import batch_to_ids
    from .model import ElmoBiLm

    device = torch.device(device)
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    precisions = model_precisions(device)
    rows = [
        Result("ElmoBiLm", "backend=reference", str(device), p.name, "model", "ok", bound=_bound_text(p))
        for p in precisions
    ]
    reason = _skip_reason(OPS["bilstm"], device, "forward")
    if reason is not None:
        for row in rows:
            row.status, row.detail = "skip", reason
        return rows
    sentences = _sentences(gen)
    what = f"'tiny' random model, {len(sentences)} sentences of {sorted(len(s) for s in sentences)} tokens"
    try:
        # fork_rng: building the modules draws their (then replaced) initial weights from torch's RNG
        with (
            scratch_dir("elmo-fast-selfcheck-") as tmp,
            _exact_arithmetic(device),
            _real_kernels(),
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        ):
            files = random_model(
                "tiny", tmp, seed=int(torch.randint(0, 2**31, (1,), generator=gen)), exercise_clips=True
            )
            ids = batch_to_ids(sentences).to(device)
            with torch.no_grad():
                want = ElmoBiLm(*files, backend="reference").to(device)(ids)
                got = [ElmoBiLm(*files, backend="fast", precision=p).to(device)(ids) for p in precisions]
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            row.status, row.detail = "error", _first_line(exc)
        return rows
    for row, p, out in zip(rows, precisions, got):
        row.error, row.ratio, row.detail = 0.0, 0.0, what
        for g, w in zip(out["activations"], want["activations"]):
            err, ratio = _layer_ratio(g, w, want["mask"], p)
            if ratio >= row.ratio:
                row.error, row.ratio = err, ratio
        if not row.ratio <= 1.0:
            row.status = "FAIL"
    return rows


# --- everything, everywhere --------------------------------------------------------------------------


def available_devices() -> list[torch.device]:
    """The CPU, then every CUDA device torch sees."""
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return devices


def run_all(
    devices: Sequence[torch.device | str] | None = None, seed: int | None = None, model: bool = True
) -> list[Result]:
    """Every op's rows on every device (default: :func:`available_devices`), then the model's. With
    ``seed``, op k on device j draws from ``seed + 1000 * j + k`` (to replay a failure); else fresh."""
    results = []
    for j, device in enumerate(available_devices() if devices is None else [torch.device(d) for d in devices]):
        for k, name in enumerate(OPS):
            results += check_op(name, device, None if seed is None else seed + 1000 * j + k)
        if model:
            results += check_model(device, None if seed is None else seed + 1000 * j + len(OPS))
    return results


# --- the first-use self-check (ELMO_FAST_SELFCHECK) -------------------------------------------------

#: the mode when the variable is unset: CUDA ops checked, a failure falls back (until a GPU run has
#: verified the kernels on the hardware)
DEFAULT_MODE = "cuda"


class SelfCheckWarning(RuntimeWarning):
    """An op failed its first-use self-check on a device and runs its reference twin there from now on."""


#: (op, device) pairs whose check has begun (and maybe ended)
_checked: set[tuple[str, str]] = set()
#: (op, device) pairs whose check passed: the hook's fast path
_passed: set[tuple[str, str]] = set()
#: (op, device) -> the one line saying what failed (raised in strict mode, warned once otherwise)
_failed: dict[tuple[str, str], str] = {}
_lock = threading.RLock()
#: None (off), "cuda" or "all": which devices are checked
_mode: str | None = None
_strict = False


def _failure_line(op: str, device: torch.device, results: list[Result], seconds: float) -> str:
    failed = [r for r in results if r.failed]
    setting = f"{ENV_VAR}={_mode}{',strict' if _strict else ''}"  # the mode in effect, however it was set
    then = (
        "raising, as strict asks"
        if _strict
        else f"elmo_fast.bilm.reference.{failed[0].twin} runs instead on {device} for the rest of this process "
        f"(right, slower; {ENV_VAR}=strict makes this an error, 0 turns the check off)"
    )
    return (
        f"elmo-fast self-check ({setting}): {op} gives wrong results on {device}: {failed[0].one_line()} "
        f"(against elmo_fast.bilm.reference.{failed[0].twin}; {len(failed)} of {len(results)} checks failed, "
        f"{seconds * 1e3:.0f} ms); {then}. Run `elmo-fast doctor` for every op, and report its output"
    )


def _on_first_use(op: str, tensor: Tensor) -> Callable[..., object] | None:
    """ops' hook, called before each op call with its main input: the first time an op runs on a
    device the mode checks, runs its checks there; returns None (run the kernel), or, for an op that
    failed them, the twin to call instead (strict: raises SelfCheckError)."""
    if tensor.is_cuda:
        if not ops.HAS_CUDA_KERNELS:  # nothing to check: the op says how to build them
            return None
    elif _mode != "all":
        return None
    device = tensor.device
    key = (op, str(device))
    if key in _passed or getattr(_local, "bypass", False) or device.type not in ("cpu", "cuda"):
        return None
    if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        # traced or captured: no check can run now (the eager calls are checked); a failed op falls back
        return _twin(op, key, tensor)
    with _lock:
        if key not in _checked:
            _checked.add(key)
            start = time.perf_counter()
            results = check_op(op, device)
            if any(r.failed for r in results):
                _failed[key] = _failure_line(op, device, results, time.perf_counter() - start)
                if not _strict:
                    warnings.warn(_failed[key], SelfCheckWarning, stacklevel=3)
            else:
                _passed.add(key)
    return _twin(op, key, tensor)


def _twin(op: str, key: tuple[str, str], tensor: Tensor) -> Callable[..., object] | None:
    if key not in _failed:
        return None
    if _strict:
        raise SelfCheckError(_failed[key])
    return functools.partial(fallback.call_twin, op, tensor)


def parse_mode(value: str | None) -> tuple[str | None, bool]:
    """(devices: None, "cuda" or "all"; strict) from a value of ELMO_FAST_SELFCHECK: 0/off, 1/cuda,
    all, strict, or all,strict. None or "" is off (the variable's default is applied by
    :func:`enable_from_environment`)."""
    words = {w for w in (value or "").strip().lower().replace("+", ",").replace(" ", ",").split(",") if w}
    if not words or words <= {"0", "off", "false", "no"}:
        return None, False
    strict = "strict" in words
    words.discard("strict")
    words = {"cuda" if w in ("1", "on", "true", "yes") else w for w in words} or {"cuda"}
    if len(words) != 1 or not words <= {"cuda", "all"}:
        raise ValueError(
            f"{ENV_VAR}={value!r}: expected 1 (or cuda): check each CUDA op on its first use and fall "
            "back to its plain-PyTorch reference if it fails; all: ops on every device; strict (or all,strict): "
            "a failed check is an error; 0: off"
        )
    return words.pop(), strict


def enable(mode: str | None) -> None:
    """Set the first-use self-check, as ELMO_FAST_SELFCHECK (:func:`parse_mode`); None, "" or "0":
    off. Ops already checked in this process are not checked again (:func:`forget_checked`)."""
    global _mode, _strict
    _mode, _strict = parse_mode(mode)
    ops.set_first_use_hook(None if _mode is None else _on_first_use)


def enable_from_environment() -> None:
    """:func:`enable` with ``$ELMO_FAST_SELFCHECK``, DEFAULT_MODE when it is unset (run when
    elmo_fast.bilm is imported); a value it does not know is said in a warning, and the default applies."""
    value = os.environ.get(ENV_VAR)
    try:
        enable(DEFAULT_MODE if value is None else value)
    except ValueError as exc:
        warnings.warn(f"{exc}; the default ({DEFAULT_MODE}) applies", RuntimeWarning, stacklevel=2)
        enable(DEFAULT_MODE)


def forget_checked() -> None:
    """Check every op again on its next use (for tests)."""
    with _lock:
        _checked.clear()
        _passed.clear()
        _failed.clear()
