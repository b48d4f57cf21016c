"""Precision: how much accuracy the biLM trades for speed, one concept with one name everywhere:
``precision="bf16"`` in the Python API (``ElmoBiLm``, ``ElmoEmbedder``, ``Elmo``, ``HubElmo``,
ELMoForManyLangs' ``Embedder``) and ``--precision bf16`` on every command (``embed``, ``train``,
``finetune``; :func:`~elmo_fast.cli.common.add_precision_flag`). ``dtype=torch.bfloat16`` (the
API's older name) and ``train --dtype`` are aliases.

======  ===========================================================  =====================================
mode    inference (the fast path)                                    bound against the fp32 reference
======  ===========================================================  =====================================
fp32    fp32 throughout; on CUDA, TF32 off during the forward        max abs error <= 1e-5 (outputs ~1)
tf32    CUDA: fp32 GEMMs on TF32 tensor cores (inputs rounded to a   max <= 1% of a layer's max |value|,
        10-bit mantissa, fp32 accumulation). CPU: exactly fp32       RMS <= 0.25% of its RMS
        (CPUs have no TF32)
bf16    GEMMs in bf16 with fp32 accumulation. CPU: char CNN, cell    max <= 5% of a layer's max |value|,
        state, gates and everything elementwise stay fp32 (the       RMS <= 1% of its RMS
        weights packed for oneDNN's BRGeMM kernel, fp32 results,
        where the calibration finds it faster); CUDA: the bilstm
        op takes one dtype, its gates and states are bf16
fp16    CUDA only (the CPU kernels have no fp16 GEMMs; a CPU model   max <= 1% of a layer's max |value|,
        refuses it in one line): as bf16 on CUDA, in fp16            RMS <= 0.25% of its RMS
======  ===========================================================  =====================================

Bounds hold per output layer (the token layer and each LSTM layer), over the unmasked positions;
parameters and outputs stay fp32 in every mode. fp32 and bf16 are tested on every machine
(tests/bilm/test_fast_model.py, tests/bilm/test_precision.py), tf32 and fp16 on a GPU (tests/bilm/test_bilm_cuda.py);
a CPU checks that tf32 gives fp32's numbers exactly and that fp16 is refused. Modes other than
fp32 need the fast backend: the reference path is the fp32 oracle.

Training (``elmo-fast train`` / ``finetune --precision``): fp32; tf32 (TF32 GEMMs on CUDA, fp32 on
a CPU); bf16 (the forward under ``torch.autocast`` to bf16; weights, gradients and the optimizer
stay fp32). fp16 is refused there: it needs loss scaling, which the trainer does not do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..errors import ElmoFastError, Param


@dataclass(frozen=True)
class ErrorBound:
    """Per output layer, against the fp32 reference on the same inputs and over the unmasked
    positions: max |error| <= max_abs + max_rel * max |reference|, and (when rms_rel is set)
    RMS(error) <= rms_rel * RMS(reference)."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    rms_rel: float | None = None

    def __str__(self) -> str:
        if self.max_rel == 0.0:
            return f"max abs error <= {self.max_abs:g}"
        rms = "" if self.rms_rel is None else f", RMS error <= {100 * self.rms_rel:g}% of its RMS"
        return f"max error <= {100 * self.max_rel:g}% of each layer's max |value|{rms}"


@dataclass(frozen=True)
class Precision:
    """One precision mode (see the module docstring): what it computes in, and its stated bound."""

    name: str
    #: the dtype of the fast path's GEMM operands (the weights' copies and their inputs)
    gemm_dtype: torch.dtype
    #: fp32 GEMMs may use TF32 tensor cores (CUDA; a CPU has none)
    tf32: bool
    #: training: the dtype the forward is autocast to (None: no autocast)
    autocast_dtype: torch.dtype | None
    bound: ErrorBound
    #: what it does to inference, with its bound, and to a training step: one line each, for --help
    summary: str
    training: str
    #: runs on CUDA only (the CPU kernels lack its GEMMs)
    cuda_only: bool = False
    #: why training refuses it (None: training takes it)
    no_training: str | None = None

    def __str__(self) -> str:
        return self.name

    @property
    def low_precision(self) -> bool:
        """Whether the fast path keeps low-precision copies of the GEMM weights (bf16, fp16)."""
        return self.gemm_dtype != torch.float32

    def check_backend(self, backend: str) -> None:
        if self.name != "fp32" and backend != "fast":
            raise ElmoFastError(
                Param("precision", self.name),
                " needs the fast backend (the reference path is the fp32 oracle); got ",
                Param("backend", backend),
            )

    def check_device(self, device: torch.device | str) -> None:
        """A one-line error where this mode cannot run on ``device`` (fp16 on a CPU)."""
        if self.cuda_only and torch.device(device).type != "cuda":
            raise ElmoFastError(
                Param("precision", self.name),
                f" runs on CUDA only (the CPU kernels have no "
                f"{self.name} GEMMs); on {torch.device(device)} use bf16 or fp32",
            )

    def check_training(self) -> None:
        if self.no_training is not None:
            raise ElmoFastError(Param("precision", self.name), f" is not supported for training: {self.no_training}")

    def gemm_mode(self, device: torch.device | str):
        """A context in which fp32 GEMMs on ``device`` run as this mode says: on CUDA, TF32 allowed
        (tf32) or not (every other mode, whatever the process set), restored on exit. It sets
        torch's process-wide flag for the duration: another thread's GEMMs see it too. Nothing
        to do on a CPU."""
        if torch.device(device).type != "cuda":
            return nullcontext()
        return tf32_switch(self.tf32)

    def autocast(self, device_type: str):
        """Training's forward: ``torch.autocast`` to :attr:`autocast_dtype` (off without one)."""
        return torch.autocast(
            device_type, dtype=self.autocast_dtype or torch.bfloat16, enabled=self.autocast_dtype is not None
        )


_LOWP_BOUND = ErrorBound(max_rel=0.01, rms_rel=0.0025)

FP32 = Precision(
    "fp32",
    torch.float32,
    tf32=False,
    autocast_dtype=None,
    bound=ErrorBound(max_abs=1e-5),
    summary="fp32 throughout (max abs error <= 1e-5 against the reference)",
    training="fp32 throughout",
)
TF32 = Precision(
    "tf32",
    torch.float32,
    tf32=True,
    autocast_dtype=None,
    bound=_LOWP_BOUND,
    summary="CUDA: fp32 GEMMs on TF32 tensor cores (max error <= 1% of a layer's max |value|, RMS "
    "<= 0.25%); a CPU: exactly fp32",
    training="CUDA: TF32 GEMMs; a CPU: fp32",
)
BF16 = Precision(
    "bf16",
    torch.bfloat16,
    tf32=False,
    autocast_dtype=torch.bfloat16,
    bound=ErrorBound(max_rel=0.05, rms_rel=0.01),
    summary="GEMMs in bf16 with fp32 accumulation (max error <= 5% of a layer's max |value|, RMS <= 1%)",
    training="the forward autocast to bf16; weights, gradients and optimizer fp32",
)
FP16 = Precision(
    "fp16",
    torch.float16,
    tf32=False,
    autocast_dtype=torch.float16,
    bound=_LOWP_BOUND,
    summary="CUDA only: GEMMs in fp16 (max error <= 1% of a layer's max |value|, RMS <= 0.25%)",
    training="refused (needs loss scaling)",
    cuda_only=True,
    no_training="fp16 needs loss scaling, which the trainer does not do; use bf16",
)

#: every mode, by name, in the order the flags list them
PRECISIONS: dict[str, Precision] = {p.name: p for p in (FP32, TF32, BF16, FP16)}
_BY_DTYPE = {torch.float32: FP32, torch.bfloat16: BF16, torch.float16: FP16}


def resolve_precision(precision: str | Precision | None = None, dtype: torch.dtype | str | None = None) -> Precision:
    """The mode a caller asked for: ``precision`` (a name or a :class:`Precision`), or ``dtype``, its
    older name (torch.float32, torch.bfloat16, torch.float16, or a mode's name); fp32 when neither
    is given. Both may be given only when they agree."""
    chosen = None if precision is None else _by_name(precision, "precision")
    if dtype is not None:
        if isinstance(dtype, torch.dtype):
            alias = _BY_DTYPE.get(dtype)
            if alias is None:
                raise ElmoFastError(
                    Param("dtype"),
                    " must be torch.float32, torch.bfloat16 or torch.float16 (or give ",
                    Param("precision"),
                    f": {', '.join(PRECISIONS)}), got {dtype}",
                )
        else:
            alias = _by_name(dtype, "dtype")
        if chosen is not None and alias is not chosen:
            raise ElmoFastError(
                "give ",
                Param("precision"),
                " or ",
                Param("dtype"),
                f" (its older name), not both (got {chosen.name} and {dtype})",
            )
        chosen = alias
    return FP32 if chosen is None else chosen


def _by_name(value: str | Precision, param: str) -> Precision:
    if isinstance(value, Precision):
        return value
    found = PRECISIONS.get(value) if isinstance(value, str) else None
    if found is None:
        raise ElmoFastError(Param(param), f" must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return found


@contextmanager
def tf32_switch(allowed: bool, library: str = "matmul") -> Iterator[None]:
    """TF32 allowed (or not) within the block for cuBLAS's fp32 GEMMs (``library="matmul"``) or
    cuDNN's fp32 convolutions (``"cudnn"``), through whichever of torch's two APIs for the flag the
    process used (reading the legacy one raises after the newer one, fp32_precision, was set); the
    setting before the block comes back after it."""
    if library == "matmul":
        legacy_owner, new_owner = torch.backends.cuda.matmul, torch.backends.cuda.matmul
    elif library == "cudnn":
        legacy_owner, new_owner = torch.backends.cudnn, torch.backends.cudnn.conv
    else:
        raise ValueError(f"library must be 'matmul' or 'cudnn', not {library!r}")
    try:
        old: object = legacy_owner.allow_tf32
        legacy = True
    except RuntimeError:  # the process set TF32 with torch's newer API (fp32_precision), which forbids mixing
        old, legacy = new_owner.fp32_precision, False
    if legacy:
        legacy_owner.allow_tf32 = allowed
    else:
        new_owner.fp32_precision = "tf32" if allowed else "ieee"
    try:
        yield
    finally:
        if legacy:
            legacy_owner.allow_tf32 = old
        else:
            new_owner.fp32_precision = old
