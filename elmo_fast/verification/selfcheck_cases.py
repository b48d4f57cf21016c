"""The inputs :mod:`elmo_fast.verification.selfcheck` gives each compiled op and its reference twin.

One :class:`OpSpec` per public op of :mod:`elmo_fast.bilm.ops` that has a twin in
:mod:`elmo_fast.bilm.reference`, with the dtypes the op takes on each device type, whether it is
differentiable, and a builder of fresh random inputs for each of its shapes. Shapes are small and
awkward: one token of one character, odd sizes, rows of length 0 among long ones, inputs sliced
out of wider buffers (strides), padding holding junk the op must never read. Values are scaled as
a trained biLM's are (outputs of magnitude ~1) and so that the LSTM clips bind while the recurrence
stays contractive (a chaotic random LSTM would turn rounding into large differences).

A :class:`Schedule` is how a call runs besides its values: GEMM weights packed for the CPU's BRGeMM
(:func:`~elmo_fast.bilm.ops.pack_weight`), the GEMV threshold (``gemv_max_rows``), the LSTM's
``tuning``: what the calibration chooses and the model passes. With one, an op's cases take it, in
shapes that run on both sides of each of its thresholds (row counts passing through them) and that
packing takes (widths multiples of 16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..bilm import ops, reference

CLIP = 3.0
#: a row count no call reaches: "always" for a GEMV threshold, as the calibration writes it
ALWAYS = 2**31 - 1
#: the most rows a schedule's cases run (thresholds above it are "always")
MAX_ROWS = 65


@dataclass
class Case:
    """One call: ``fast(*leaves)`` and ``reference(*leaves)`` give tuples of outputs; ``leaves`` are the
    floating-point inputs (the ones a gradient is taken of), the rest (ids, lengths, packed weights)
    live in the closures."""

    fast: Callable[..., tuple[Tensor, ...]]
    reference: Callable[..., tuple[Tensor, ...]]
    leaves: list[Tensor]
    names: list[str]
    #: the shape, in a few words (shown with the worst case's error)
    what: str


@dataclass(frozen=True)
class Schedule:
    """How a call runs besides its values (None in a field: the kernel's default).

    packed:    the GEMM weights packed (:func:`~elmo_fast.bilm.ops.pack_weight`) in this dtype
    gemv_rows: ``gemv_max_rows`` of linear, layer0_gates, highway
    tuning:    ``tuning`` of bilstm, lstm_layer, bilstm_train: [gemv_rows_in_turn, gemv_rows_concurrent,
               concurrent_min_rows] (csrc/cpu/tuning.h)
    """

    packed: torch.dtype | None = None
    gemv_rows: int | None = None
    tuning: tuple[int, ...] | None = None

    @classmethod
    def of_call(cls, key: tuple | None) -> Schedule | None:
        """From what an op tells the first-use hook: None, or (packed dtype, gemv rows, tuning)."""
        return None if key is None else cls(*key)

    def text(self) -> str:
        """``packed bfloat16, gemv <= 64, tuning 16,4,64`` (the fields that are set)."""
        parts = []
        if self.packed is not None:
            parts.append(f"packed {str(self.packed).replace('torch.', '')}")
        if self.gemv_rows is not None:
            parts.append(f"gemv <= {'always' if self.gemv_rows >= ALWAYS else self.gemv_rows}")
        if self.tuning is not None:
            parts.append("tuning " + ",".join("always" if v >= ALWAYS else str(v) for v in self.tuning))
        return ", ".join(parts) or "default"


class CaseUnavailable(RuntimeError):
    """A case cannot be built on this machine (weights this CPU cannot pack): its check is skipped."""


#: A case's inputs, for (generator, shape, device, dtype, schedule). bfloat16 for bilstm is the model's
#: bf16 on that device (see ONE_DTYPE_BILSTM_DEVICES).
Builder = Callable[[torch.Generator, tuple, torch.device, torch.dtype, "Schedule | None"], Case]


@dataclass(frozen=True)
class OpSpec:
    name: str
    twin: str
    build: Builder
    #: the shapes ``build`` takes, for a schedule (None: the kernel's defaults)
    shapes: Callable[[Schedule | None], list[tuple]]
    #: the dtypes the forward is checked in, per device type
    forward: dict[str, tuple[torch.dtype, ...]]
    #: whether gradients are checked (fp32 against the twin, float64 gradcheck)
    differentiable: bool = True
    #: on CUDA the op (or its backward) needs the CUDA training ops (ops.HAS_CUDA_BACKWARD)
    cuda_training: tuple[str, ...] = field(default=())
    #: the Schedule fields the op takes ("packed", "gemv_rows", "tuning")
    takes: frozenset[str] = frozenset()

    def dtypes(self, device_type: str, schedule: Schedule | None = None) -> tuple[torch.dtype, ...]:
        """The dtypes its forward is checked in: packed weights' own, else those the op takes there."""
        if schedule is not None and schedule.packed is not None:
            return (schedule.packed,)
        return self.forward.get(device_type, (torch.float32,))

    def differentiable_with(self, schedule: Schedule | None) -> bool:
        """Gradients are checked unless the weights are packed (inference only)."""
        return self.differentiable and (schedule is None or schedule.packed is None)


def _randn(gen: torch.Generator, *shape: int, std: float = 1.0, mean: float = 0.0) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean


def _sliced(t: Tensor, gen: torch.Generator) -> Tensor:
    """t's values as a view into a wider buffer (its last dim not at offset 0, rows further apart)."""
    buf = _randn(gen, *t.shape[:-1], t.shape[-1] + 5).to(t.dtype)
    view = buf[..., 3 : 3 + t.shape[-1]]
    view.copy_(t)
    return view


def _on(device: torch.device, dtype: torch.dtype, *ts: Tensor) -> list[Tensor]:
    return [t.to(device=device, dtype=dtype) for t in ts]


def _pack(w: Tensor) -> Tensor:
    """ops.pack_weight, or CaseUnavailable where this CPU does not run weights packed in w's dtype."""
    if w.device.type == "cpu" and not ops.packed_gemm_available(w.dtype):
        raise CaseUnavailable(f"packed {str(w.dtype).replace('torch.', '')} weights: this CPU does not run them")
    try:
        return ops.pack_weight(w)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CaseUnavailable(f"packed weights: {type(exc).__name__}: {first}") from exc


def _rows_around(threshold: int | None) -> list[int]:
    """Row counts on both sides of a GEMV threshold (none where it is the default, never or always)."""
    if threshold is None or not 0 < threshold < MAX_ROWS:
        return []
    return [threshold, threshold + 1]


def _gemv(schedule: Schedule | None) -> int | None:
    return None if schedule is None else schedule.gemv_rows


def _tuning(schedule: Schedule | None) -> list[int] | None:
    return None if schedule is None or schedule.tuning is None else list(schedule.tuning)


def _packed(schedule: Schedule | None) -> torch.dtype | None:
    return None if schedule is None else schedule.packed


def tuning_counts(tuning: tuple[int, ...] | None) -> list[list[int]]:
    """Batches whose rows still running at each step (descending) pass through the tuning's thresholds:
    a first step on each side of ``concurrent_min_rows`` (the directions concurrent or in turn), then
    counts on each side of both GEMV thresholds. [] for no tuning."""
    if tuning is None:
        return []
    gemv_turn, gemv_conc, conc_min = (list(tuning) + [-1, -1, -1])[:3]
    finite = [v for v in (gemv_turn, gemv_conc) if 0 < v < MAX_ROWS]
    firsts = {max([v + 1 for v in finite] or [17])}
    if 1 < conc_min <= MAX_ROWS:
        firsts |= {conc_min - 1, conc_min}
    out = []
    for first in sorted(firsts):
        counts = {first, 1} | {c for v in finite for c in (v, v + 1) if c <= first}
        out.append(sorted(counts, reverse=True))
    return out


def _lengths_through(gen: torch.Generator, counts: list[int]) -> Tensor:
    """[B = counts[0]] lengths, shuffled, such that counts[t] rows run at step t."""
    B = counts[0]
    lengths = torch.tensor([sum(1 for c in counts if c > i) for i in range(B)])
    return lengths[torch.randperm(B, generator=gen)]


# --- char CNN ------------------------------------------------------------------------------------

_CHAR_SHAPES = [  # (N tokens, L characters, D, filters (width, count), activation)
    (1, 1, 3, ((1, 2),), "relu"),
    (7, 9, 5, ((1, 3), (2, 4), (3, 5), (9, 2)), "tanh"),
]


def _char_cnn(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    N, L, D, filters, activation = shape
    V = 23
    ids = torch.randint(1, V, (N, L), generator=gen)
    if L > 1:
        for row in range(N):  # words of 1..L characters, then padding (id 0), and one row of "no token"
            ids[row, int(torch.randint(1, L + 1, (1,), generator=gen)) :] = 0
        ids[N // 2] = 0
    ids = torch.stack([ids, ids], 2).reshape(N, 2 * L)[:, ::2].to(device)  # column stride 2
    emb = _randn(gen, V, D)
    emb[0] = 0.0
    weights = [_randn(gen, n, D, w, std=(w * D) ** -0.5) for w, n in filters]
    biases = [_randn(gen, n, std=0.1) for _, n in filters]
    K = len(filters)

    def fast(e, *convs):
        return (ops.char_cnn(ids, e, list(convs[:K]), list(convs[K:]), activation),)

    def ref(e, *convs):
        return (reference.char_cnn_ref(ids, e, list(convs[:K]), list(convs[K:]), activation),)

    return Case(
        fast,
        ref,
        _on(device, dtype, emb, *weights, *biases),
        ["char_embedding"] + [f"conv_weights[{k}]" for k in range(K)] + [f"conv_biases[{k}]" for k in range(K)],
        f"N={N} L={L} widths {','.join(str(w) for w, _ in filters)} {activation}",
    )


# --- highway ---------------------------------------------------------------------------------------

_GATE_SHAPES = [(1, 1, False), (7, 13, True)]  # (N, H, sliced)


def _highway_gate(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    N, H, sliced = shape
    projected, x = _randn(gen, N, 2 * H, std=1.5), _randn(gen, N, H)
    projected, x = _on(device, dtype, projected, x)
    if sliced:
        projected = _sliced(projected, gen)
    return Case(
        lambda p, x: (ops.highway_gate(p, x),),
        lambda p, x: (reference.highway_gate_ref(p, x),),
        [projected, x],
        ["projected", "x"],
        f"N={N} H={H}{' sliced' if sliced else ''}",
    )


_HIGHWAY_SHAPES = [(1, 3, 1, 2, False), (9, 17, 2, 5, True)]  # (N, F, layers, P, sliced)


def _highway_shapes(schedule: Schedule | None) -> list[tuple]:
    return _HIGHWAY_SHAPES + [(n, 17, 2, 5, True) for n in _rows_around(_gemv(schedule))]


def _highway(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    N, F, layers, P, sliced = shape
    gemv = _gemv(schedule)
    x = _randn(gen, N, F)
    ws = [_randn(gen, 2 * F, F, std=F**-0.5) for _ in range(layers)]
    bs = []
    for _ in range(layers):
        b = _randn(gen, 2 * F, std=0.1)
        b[F:] += 1.0  # gates lean to carrying x, as trained ones do
        bs.append(b)
    pw, pb = _randn(gen, P, F, std=F**-0.5), _randn(gen, P, std=0.1)
    leaves = _on(device, dtype, x, *ws, *bs, pw, pb)
    if sliced:
        leaves[0] = _sliced(leaves[0], gen)

    def split(x, *w):
        return x, list(w[:layers]), list(w[layers : 2 * layers]), w[-2], w[-1]

    return Case(
        lambda *a: (ops.highway(*split(*a), gemv),),
        lambda *a: (reference.highway_ref(*split(*a)),),
        leaves,
        ["x"]
        + [f"highway_weights[{k}]" for k in range(layers)]
        + [f"highway_biases[{k}]" for k in range(layers)]
        + ["proj_weight", "proj_bias"],
        f"N={N} F={F} layers={layers} P={P}{' sliced' if sliced else ''}",
    )


# --- linear and layer 0's gates ------------------------------------------------------------------

#: (rows, K, N, bias, sliced): the GEMV and the GEMM
_LINEAR_SHAPES = [(1, 7, 5, True, False), (33, 64, 19, False, True)]


def _linear_shapes(schedule: Schedule | None) -> list[tuple]:
    around = _rows_around(_gemv(schedule))
    if _packed(schedule) is not None:  # packable: N a multiple of 16, K even; with a bias, as the model calls it
        return [(n, 32, 48, True, True) for n in sorted({1, 33, *around})]
    return _LINEAR_SHAPES + [(n, 64, 19, True, True) for n in around]


def _linear(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    n, K, N, bias, sliced = shape
    gemv, packed = _gemv(schedule), _packed(schedule)
    if packed is not None:  # float32 x and bias, the weight packed in its dtype (the twin: the same rounded weight)
        x, b = _on(device, torch.float32, _randn(gen, n, K), _randn(gen, N, std=0.1))
        w = _randn(gen, N, K, std=K**-0.5).to(device=device, dtype=packed)
        w_packed, w_ref = _pack(w), w.double()
        if sliced:
            x = _sliced(x, gen)
        return Case(
            lambda x, b: (ops.linear(x, w_packed, b, gemv),),
            lambda x, b: (reference.linear_ref(x, w_ref.to(x.dtype), b),),
            [x, b],
            ["x", "bias"],
            f"rows={n} K={K} N={N} weight packed",
        )
    x, w = _on(device, dtype, _randn(gen, n, K), _randn(gen, N, K, std=K**-0.5))
    if sliced:
        x = _sliced(x, gen)
    if bias:
        (b,) = _on(device, dtype, _randn(gen, N, std=0.1))
        return Case(
            lambda x, w, b: (ops.linear(x, w, b, gemv),),
            lambda x, w, b: (reference.linear_ref(x, w, b),),
            [x, w, b],
            ["x", "weight", "bias"],
            f"rows={n} K={K} N={N}{' sliced' if sliced else ''}",
        )
    return Case(
        lambda x, w: (ops.linear(x, w, None, gemv),),
        lambda x, w: (reference.linear_ref(x, w),),
        [x, w],
        ["x", "weight"],
        f"rows={n} K={K} N={N} no bias{' sliced' if sliced else ''}",
    )


_GATES_SHAPES = [(1, 3, 2), (11, 16, 5)]  # (U, P, C)


def _gates_shapes(schedule: Schedule | None) -> list[tuple]:
    return _GATES_SHAPES + [(n, 16, 5) for n in _rows_around(_gemv(schedule))]


def _lstm_weights(gen: torch.Generator, layers: int, P: int, C: int) -> list[Tensor]:
    """8 * layers tensors, as bilstm_ref takes them; forget gates lean open, projections 3x unit gain
    (so both clips bind), recurrent weights small (a contractive recurrence)."""
    weights = []
    for _ in range(2 * layers):
        bias = _randn(gen, 4 * C, std=0.1)
        bias[C : 2 * C] += 1.5
        weights += [
            _randn(gen, 4 * C, P, std=P**-0.5),
            _randn(gen, 4 * C, P, std=0.35 * P**-0.5),
            bias,
            _randn(gen, P, C, std=3.0 * C**-0.5),
        ]
    return weights


def _layer0_gates(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    U, P, C = shape
    gemv = _gemv(schedule)
    tokens = _randn(gen, U, P)
    leaves = _on(device, dtype, tokens, *_lstm_weights(gen, 1, P, C))
    return Case(
        lambda t, *w: (ops.layer0_gates(t, list(w), gemv),),
        lambda t, *w: (reference.layer0_gates_ref(t, list(w)),),
        leaves,
        ["tokens"] + [f"weights[{k}]" for k in range(8)],
        f"U={U} P={P} C={C}",
    )


# --- LSTMs -----------------------------------------------------------------------------------------


def _lengths(gen: torch.Generator, B: int, T: int) -> Tensor:
    """[B] lengths, unsorted: one of T (the longest), one of 0 and one of 1 where B allows, the rest random."""
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[B // 2] = T
    if B > 2:
        lengths[0] = 0
    if B > 3:
        lengths[-1] = 1
    return lengths


def _lengths_of(gen: torch.Generator, B: int, T: int, counts: list[int] | None) -> Tensor:
    return _lengths(gen, B, T) if counts is None else _lengths_through(gen, counts)


#: (B, T, layers, P, C, counts): counts None for random lengths (see _lengths), else the rows running
#: at each step (see tuning_counts)
_BILSTM_SHAPES = [(1, 1, 1, 3, 5, None), (5, 7, 2, 4, 6, None)]
#: packable widths: w_ih, w_hh [4C, P] and w_proj [P, C] with 4C and P multiples of 16, P and C even
_BILSTM_PACKED_SHAPES = [(1, 1, 1, 16, 8, None), (5, 7, 2, 16, 8, None)]


def _bilstm_shapes(schedule: Schedule | None) -> list[tuple]:
    base = _BILSTM_SHAPES if _packed(schedule) is None else _BILSTM_PACKED_SHAPES
    P, C = base[-1][3:5]
    extra = [(c[0], len(c), 2, P, C, c) for c in tuning_counts(None if schedule is None else schedule.tuning)]
    return base + extra


#: Device types whose bilstm op takes one floating dtype for all its inputs: in bf16 there the input
#: gates and states are bf16 too, as the model passes them (the CPU op takes bf16 weights beside fp32
#: input gates, biases and states).
ONE_DTYPE_BILSTM_DEVICES = ("cuda",)


def _bilstm(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    B, T, layers, P, C, counts = shape
    tuning, packed = _tuning(schedule), _packed(schedule)
    if dtype == torch.bfloat16:
        layers = 1  # bf16 errors add up across layers through the skip connections: one layer is held to TOL
    lengths = _lengths_of(gen, B, T, counts)
    U = max(1, (B * T) // 2)
    xg0 = _randn(gen, U, 2, 4 * C, std=2.0)
    xg0[:, :, C : 2 * C] += 1.5
    token_index = torch.randint(0, U, (B, T), generator=gen)
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    token_index[padding] = U + 1000  # never read
    h0, c0 = _randn(gen, layers, B, 2 * P, std=1.5), _randn(gen, layers, B, 2 * C, std=2.0)
    weights = _lstm_weights(gen, layers, P, C)
    one_dtype = device.type in ONE_DTYPE_BILSTM_DEVICES
    act = torch.float32 if dtype == torch.bfloat16 and not one_dtype else dtype  # CPU bf16: the weights only
    if packed is not None:
        # as the model passes them (elmo_fast.bilm.derived_weights): every GEMM weight packed in its
        # dtype, the biases float32; the twin reads the same rounded weights unpacked
        leaves = _on(device, torch.float32, xg0, h0, c0) + [
            w.to(device=device, dtype=torch.float32 if k % 4 == 2 else packed) for k, w in enumerate(weights)
        ]
        op_weights = [w if k % 4 == 2 else _pack(w) for k, w in enumerate(leaves[3:])]
    else:
        leaves = _on(device, act, xg0, h0, c0) + _on(device, dtype, *weights)
        op_weights = None
    index = token_index.to(device)
    # the fast op plans on the host (lengths on the CPU, no device sync); the reference reads them on the device
    lengths_dev = lengths.to(device)

    def fast(xg0, h0, c0, *w):
        return ops.bilstm(
            xg0, index, lengths, list(w) if op_weights is None else op_weights, CLIP, CLIP, h0, c0, tuning
        )

    def ref(xg0, h0, c0, *w):
        return reference.bilstm_ref(xg0, index, lengths_dev, list(w), CLIP, CLIP, h0, c0)

    return Case(
        fast,
        ref,
        leaves,
        ["xg0", "h0", "c0"] + [f"weights[{k}]" for k in range(8 * layers)],
        f"B={B} T={T} layers={layers} P={P} C={C} lengths {lengths.tolist()}"
        + (" weights packed" if packed is not None else ""),
    )


_LAYER_SHAPES = [(1, 1, 2, 3, None), (4, 6, 3, 5, None)]  # (B, T, P, C, counts)


def _layer_shapes(schedule: Schedule | None) -> list[tuple]:
    return _LAYER_SHAPES + [
        (c[0], len(c), 3, 5, c) for c in tuning_counts(None if schedule is None else schedule.tuning)
    ]


def _lstm_layer(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    B, T, P, C, counts = shape
    tuning = _tuning(schedule)
    lengths = _lengths_of(gen, B, T, counts)
    xg = _randn(gen, 2, B, T, 4 * C, std=2.0)
    xg[..., C : 2 * C] += 1.5
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    xg[:, padding] = float("nan")  # never read by the op
    w = _lstm_weights(gen, 1, P, C)
    w_hh, w_proj = torch.stack([w[1], w[5]]), torch.stack([w[3], w[7]])
    h0, c0 = _randn(gen, 2, B, P, std=1.5), _randn(gen, 2, B, C, std=2.0)
    leaves = _on(device, dtype, xg, w_hh, w_proj, h0, c0)
    lengths_dev, padding_dev = lengths.to(device), padding.to(device)

    def fast(xg, w_hh, w_proj, h0, c0):
        return ops.lstm_layer(xg, lengths, w_hh, w_proj, CLIP, CLIP, h0, c0, None, tuning)

    def ref(xg, w_hh, w_proj, h0, c0):
        # the twin computes the padding's steps and drops them; their NaN would reach its gradients
        xg = torch.where(padding_dev[None, :, :, None], 0.0, xg)
        return reference.lstm_layer_pair_ref(xg, lengths_dev, w_hh, w_proj, CLIP, CLIP, h0, c0)

    return Case(
        fast, ref, leaves, ["xg", "w_hh", "w_proj", "h0", "c0"], f"B={B} T={T} P={P} C={C} lengths {lengths.tolist()}"
    )


_TRAIN_SHAPES = [(1, 1, 1, 2, 3, None), (3, 5, 2, 3, 4, None)]  # (B, T, layers, P, C, counts)


def _train_shapes(schedule: Schedule | None) -> list[tuple]:
    extra = tuning_counts(None if schedule is None else schedule.tuning)
    return _TRAIN_SHAPES + [(c[0], len(c), 2, 3, 4, c) for c in extra]


def _bilstm_train(gen: torch.Generator, shape: tuple, device: torch.device, dtype: torch.dtype, schedule=None) -> Case:
    B, T, layers, P, C, counts = shape
    tuning = _tuning(schedule)
    lengths = _lengths_of(gen, B, T, counts)
    x = _randn(gen, B, T, P)
    weights = _lstm_weights(gen, layers, P, C)
    h0, c0 = _randn(gen, layers, B, 2 * P, std=1.5), _randn(gen, layers, B, 2 * C, std=2.0)
    dropout = 0.25
    masks = [(torch.rand(2, B, T, P, generator=gen) >= dropout).double() / (1 - dropout) for _ in range(layers)]
    masks = [m.to(device=device, dtype=dtype) for m in masks]
    leaves = _on(device, dtype, x, h0, c0, *weights)
    lengths_dev = lengths.to(device)

    def fast(x, h0, c0, *w):
        return ops.bilstm_train(
            x, lengths, list(w), CLIP, CLIP, h0, c0, dropout, True, [m.to(x.dtype) for m in masks], tuning
        )

    def ref(x, h0, c0, *w):
        return reference.bilstm_train_ref(
            x, lengths_dev, list(w), CLIP, CLIP, h0, c0, dropout, True, [m.to(x.dtype) for m in masks]
        )

    return Case(
        fast,
        ref,
        leaves,
        ["x", "h0", "c0"] + [f"weights[{k}]" for k in range(8 * layers)],
        f"B={B} T={T} layers={layers} P={P} C={C} dropout masks, lengths {lengths.tolist()}",
    )


def _fixed(shapes: list[tuple]) -> Callable[[Schedule | None], list[tuple]]:
    return lambda schedule: shapes


_F32, _BF16 = torch.float32, torch.bfloat16
_GEMV, _TUNING, _PACKED = frozenset({"gemv_rows"}), frozenset({"tuning"}), frozenset({"packed", "tuning"})

#: every op of elmo_fast.bilm.ops with a reference twin, in the model's order
OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in [
        OpSpec(
            "char_cnn",
            "char_cnn_ref",
            _char_cnn,
            _fixed(_CHAR_SHAPES),
            # the CPU kernel takes float32 and float64; the CUDA one bf16 and fp16 too
            {"cpu": (_F32,), "cuda": (_F32, _BF16)},
            cuda_training=("grad", "gradcheck"),
        ),
        OpSpec(
            "highway_gate",
            "highway_gate_ref",
            _highway_gate,
            _fixed(_GATE_SHAPES),
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            cuda_training=("grad", "gradcheck"),
        ),
        OpSpec(
            "highway",
            "highway_ref",
            _highway,
            _highway_shapes,
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            cuda_training=("grad", "gradcheck"),
            takes=_GEMV,
        ),
        OpSpec(
            "linear",
            "linear_ref",
            _linear,
            _linear_shapes,
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            takes=_GEMV | {"packed"},
        ),
        OpSpec(
            "layer0_gates",
            "layer0_gates_ref",
            _layer0_gates,
            _gates_shapes,
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            differentiable=False,
            takes=_GEMV,
        ),
        OpSpec(
            "bilstm",
            "bilstm_ref",
            _bilstm,
            _bilstm_shapes,
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            differentiable=False,
            takes=_PACKED,
        ),
        OpSpec(
            "lstm_layer",
            "lstm_layer_pair_ref",
            _lstm_layer,
            _layer_shapes,
            {"cpu": (_F32,), "cuda": (_F32,)},
            cuda_training=("forward", "grad", "gradcheck"),
            takes=_TUNING,
        ),
        OpSpec(
            "bilstm_train",
            "bilstm_train_ref",
            _bilstm_train,
            _train_shapes,
            {"cpu": (_F32,), "cuda": (_F32,)},
            cuda_training=("forward", "grad", "gradcheck"),
            takes=_TUNING,
        ),
    ]
}

#: The schedules ``elmo-fast doctor`` checks each op in on the CPU, besides the defaults: every way the
#: calibration can choose to run it (the GEMV never and always, the LSTM's directions in turn and
#: concurrently with either, the weights packed in float32 and bfloat16)
DOCTOR_SCHEDULES: tuple[Schedule, ...] = (
    Schedule(gemv_rows=0),
    Schedule(gemv_rows=ALWAYS),
    *(Schedule(tuning=t) for t in ((0, 0, 0), (ALWAYS, ALWAYS, 0), (0, 0, 1), (ALWAYS, ALWAYS, 1))),
    Schedule(packed=_F32),
    Schedule(packed=_BF16),
)


def doctor_schedules(name: str, device: torch.device) -> list[Schedule]:
    """The schedules of :data:`DOCTOR_SCHEDULES` op ``name`` takes on ``device`` (the CPU's only: the
    CUDA kernels take none of them)."""
    if device.type != "cpu":
        return []
    takes = OPS[name].takes
    return [
        s
        for s in DOCTOR_SCHEDULES
        if (s.packed is None or "packed" in takes)
        and (s.gemv_rows is None or "gemv_rows" in takes)
        and (s.tuning is None or "tuning" in takes)
    ]
