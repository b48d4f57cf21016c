"""Every compiled op against its reference twin on this machine's devices: what ``elmo-fast doctor``
runs, and what the first-use self-check (:mod:`elmo_fast.verification.first_use`, ``ELMO_FAST_SELFCHECK``)
runs for an op the first time a process calls it.

Each op of :mod:`elmo_fast.bilm.ops` that has a twin in :mod:`elmo_fast.bilm.reference` gets fresh
random inputs of small, awkward shapes (:mod:`elmo_fast.verification.selfcheck_cases`) and is held to
the project's bounds (:mod:`elmo_fast.verification.tolerances`), the twin computing in float64 on the
same (already rounded) inputs:

* ``forward``    every output, elementwise within ``TOL[dtype]``: float32, and bfloat16 where the
                 op takes it on that device;
* ``grad``       the gradients of a random projection of the outputs, float32, fast vs twin,
                 within ``GRAD_RTOL[float32]`` of each gradient's largest entry;
* ``gradcheck``  float64: the op's backward against central differences of its own forward along
                 random directions (torch.autograd.gradcheck's fast mode and default bounds);
* ``model``      :class:`~elmo_fast.bilm.model.ElmoBiLm` fast vs reference on a few sentences of a
                 small random model, in each precision (fp32, bf16; on CUDA also tf32 and fp16)
                 within its stated bound (:mod:`elmo_fast.bilm.precision`).

An op's checks run in a :class:`~elmo_fast.verification.selfcheck_cases.Schedule` (the defaults, or
packed weights, a GEMV threshold, an LSTM tuning): the doctor adds, on the CPU, every schedule the
calibration can choose; the first-use check, the one the call itself takes.

The checks run the real kernels whatever earlier first-use checks decided, never a twin, and check
nothing again on the way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from ..bilm import ops
from ..bilm.precision import FP32, PRECISIONS, Precision, tf32_switch
from ..durable import scratch_dir
from .selfcheck_cases import OPS, Case, CaseUnavailable, OpSpec, Schedule, doctor_schedules
from .tolerances import GRAD_RTOL, GRADCHECK, TOL, max_abs_error, tolerance_ratio


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
    #: how the op ran besides its values (Schedule.text(): "default", "packed bfloat16", "tuning 0,0,1" ...)
    schedule: str = "default"

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "error")

    def one_line(self) -> str:
        """``char_cnn on cuda:0, float32 forward: max abs error 3.1e-01 > 1e-05 (N=7 L=9 ...)``."""
        scheduled = "" if self.schedule == "default" else f" ({self.schedule})"
        where = f"{self.op} on {self.device}, {self.dtype} {self.check}{scheduled}"
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
#: (``bypass``; the first-use hook reads it)
local = threading.local()


@contextmanager
def _real_kernels() -> Iterator[None]:
    """Ops called in this block (by this thread) run their kernels: neither checked nor fallen back."""
    before = getattr(local, "bypass", False)
    local.bypass = True
    try:
        yield
    finally:
        local.bypass = before


# --- the three checks of an op ---------------------------------------------------------------------


def _tuple(out) -> tuple[Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _forward(case: Case, dtype: torch.dtype) -> tuple[float, float, str]:
    """(max abs error, ratio to TOL[dtype], what) of every output against the twin in float64; outputs
    of other shapes than the twin's are wrong results too (an infinite error, their shapes said)."""
    with torch.no_grad():
        got = _tuple(case.fast(*case.leaves))
        want = _tuple(case.reference(*[t.double() for t in case.leaves]))
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        shapes = f"output shapes {[tuple(g.shape) for g in got]} != the twin's {[tuple(w.shape) for w in want]}"
        return float("inf"), float("inf"), f"{case.what}: {shapes}"
    return (
        max(max_abs_error(g, w) for g, w in zip(got, want)),
        max(tolerance_ratio(g, w, dtype) for g, w in zip(got, want)),
        case.what,
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

        def numeric_at(step: float) -> float:
            with torch.no_grad():
                plus = _tuple(case.fast(*[t + step * d for t, d in zip(leaves, v)]))
                minus = _tuple(case.fast(*[t - step * d for t, d in zip(leaves, v)]))
            return sum(((p - m) * c).sum() for p, m, c in zip(plus, minus, u)).item() / (2 * step)

        numeric = numeric_at(eps)
        err, bound = abs(analytic - numeric), atol + rtol * abs(numeric)
        if not err <= bound:
            # A difference across a kink (ReLU's 0: the highway's, one case in ~3,000) is wrong at eps and
            # right at eps / 100; a wrong gradient stays wrong. The smaller error is the op's.
            fine = numeric_at(eps / 100)
            if abs(analytic - fine) < err:
                numeric = fine
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


def _row(spec: OpSpec, device: torch.device, dtype: torch.dtype, check: str, schedule: Schedule | None) -> Result:
    text = "default" if schedule is None else schedule.text()
    return Result(spec.name, spec.twin, str(device), _dtype_name(dtype), check, "ok", schedule=text)


def check_op(
    name: str,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    checks: Sequence[str] = ("forward", "grad", "gradcheck"),
    schedule: Schedule | None = None,
    errors: str = "report",
) -> list[Result]:
    """The rows of one op on one device: forward in each dtype the op takes there, then (if it is
    differentiable) grad in float32 and gradcheck in float64, each over every shape of its case,
    the worst shape reported. Fresh random inputs unless ``seed`` is given. ``schedule``: how the op
    runs (packed weights, GEMV threshold, LSTM tuning), in shapes that exercise it (forward, and grad
    unless the weights are packed).

    ``errors``: what an exception raised by the op (or by anything on the way: out of memory, an
    earlier CUDA error) becomes: "report" (the doctor), a row of status "error" naming it; "raise"
    (the first-use check), the exception itself, unchanged, and the first FAIL ends the checks. Only a
    result outside its bound is FAIL."""
    if errors not in ("report", "raise"):
        raise ValueError(f"errors={errors!r}: expected 'report' or 'raise'")
    spec = OPS[name]
    device = torch.device(device)
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    plan: list[tuple[str, torch.dtype]] = []
    if "forward" in checks:
        plan += [("forward", dtype) for dtype in spec.dtypes(device.type, schedule)]
    if spec.differentiable_with(schedule):
        # in a schedule, the gradients against the twin's (the backward in that schedule); gradcheck (the
        # backward against the op's own forward, float64) is the defaults' alone
        grads = (("grad", torch.float32),) + ((("gradcheck", torch.float64),) if schedule is None else ())
        plan += [(c, d) for c, d in grads if c in checks]
    results = []
    with _exact_arithmetic(device), _real_kernels():
        for check, dtype in plan:
            row = _row(spec, device, dtype, check, schedule)
            results.append(row)
            reason = _skip_reason(spec, device, check)
            if reason is not None:
                row.status, row.detail = "skip", reason
                continue
            try:
                for shape in spec.shapes(schedule):
                    case = spec.build(gen, shape, device, dtype, schedule)
                    if check == "forward":
                        err, ratio, what = _forward(case, dtype)
                        tol = TOL[dtype]
                        bound = f"{tol['atol']:.0e}" + (f"+{tol['rtol']:.0e}|ref|" if tol["rtol"] else "")
                    elif check == "grad":
                        err, b, ratio, leaf = _grad(case, gen, dtype)
                        bound, what = f"{b:.1e}", f"{case.what}, d/d {leaf}"
                    else:
                        err, b, ratio = _gradcheck(case, gen)
                        bound, what = f"{b:.1e}", case.what
                    if row.ratio is None or ratio >= row.ratio:
                        row.error, row.bound, row.ratio, row.detail = err, bound, ratio, what
            except CaseUnavailable as exc:  # weights this CPU cannot pack: nothing to check here
                if errors == "raise":  # the packing's own error, as the call would meet it
                    raise (exc.__cause__ or exc) from None
                row.status, row.detail, row.error, row.ratio = "skip", str(exc), None, None
                continue
            except Exception as exc:
                if errors == "raise":
                    raise
                row.status, row.detail = "error", _first_line(exc)  # the doctor's row: the op raised
                continue
            if not row.ratio <= 1.0:  # NaN fails too
                row.status = "FAIL"
                if errors == "raise":  # the first use needs one wrong result, and its later checks may
                    break  # trip over it (a gradient of a wrongly shaped output)
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
    from ..bilm.char_ids import batch_to_ids
    from ..bilm.model import ElmoBiLm
    from ..formats.random_models import random_model  # random weights written and read back as a user's model files

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
    """Every op's rows on every device (default: :func:`available_devices`), in its defaults and then in
    each schedule the calibration can choose there (forward; :func:`~.selfcheck_cases.doctor_schedules`),
    then the model's. With ``seed``, op k on device j draws from ``seed + 1000 * j + k`` (schedule s:
    ``+ 100 * s``; to replay a failure); else fresh."""
    results = []
    for j, device in enumerate(available_devices() if devices is None else [torch.device(d) for d in devices]):
        for k, name in enumerate(OPS):
            results += check_op(name, device, None if seed is None else seed + 1000 * j + k)
            for s, schedule in enumerate(doctor_schedules(name, device), start=1):
                replay = None if seed is None else seed + 1000 * j + k + 100 * s
                results += check_op(name, device, replay, checks=("forward",), schedule=schedule)
        if model:
            results += check_model(device, None if seed is None else seed + 1000 * j + len(OPS))
    return results
