"""The inputs :mod:`elmo_fast.bilm.selfcheck` gives each compiled op and its reference twin.

One :class:`OpSpec` per public op of :mod:`elmo_fast.bilm.ops` that has a twin in
:mod:`elmo_fast.bilm.reference`, with the dtypes the op takes on each device type, whether it is
differentiable, and a builder of fresh random inputs for each of its shapes. Shapes are small and
awkward: one token of one character, odd sizes, rows of length 0 among long ones, inputs sliced
out of wider buffers (strides), padding holding junk the op must never read. Values are scaled as
a trained biLM's are (outputs of magnitude ~1) and so that the LSTM clips bind while the recurrence
stays contractive (a chaotic random LSTM would turn rounding into large differences).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import ops, reference

CLIP = 3.0


@dataclass
class Case:
    """One call: ``fast(*leaves)`` and ``reference(*leaves)`` give tuples of outputs; ``leaves`` are the
    floating-point inputs (the ones a gradient is taken of), the rest (ids, lengths) live in the closures."""

    fast: Callable[..., tuple[Tensor, ...]]
    reference: Callable[..., tuple[Tensor, ...]]
    leaves: list[Tensor]
    names: list[str]
    #: the shape, in a few words (shown with the worst case's error)
    what: str


#: A case's inputs, for (generator, shape index, device, dtype). bfloat16 for bilstm is the model's
#: bf16 on that device (see ONE_DTYPE_BILSTM_DEVICES).
Builder = Callable[[torch.Generator, int, torch.device, torch.dtype], Case]


@dataclass(frozen=True)
class OpSpec:
    name: str
    twin: str
    build: Builder
    #: how many shapes ``build`` knows (0 .. shapes - 1)
    shapes: int
    #: the dtypes the forward is checked in, per device type
    forward: dict[str, tuple[torch.dtype, ...]]
    #: whether gradients are checked (fp32 against the twin, float64 gradcheck)
    differentiable: bool = True
    #: on CUDA the op (or its backward) needs the CUDA training ops (ops.HAS_CUDA_BACKWARD)
    cuda_training: tuple[str, ...] = field(default=())


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


# --- char CNN ------------------------------------------------------------------------------------

_CHAR_SHAPES = [  # (N tokens, L characters, D, filters (width, count), activation)
    (1, 1, 3, ((1, 2),), "relu"),
    (7, 9, 5, ((1, 3), (2, 4), (3, 5), (9, 2)), "tanh"),
]


def _char_cnn(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    N, L, D, filters, activation = _CHAR_SHAPES[shape]
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

_GATE_SHAPES = [(1, 1), (7, 13)]  # (N, H)


def _highway_gate(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    N, H = _GATE_SHAPES[shape]
    projected, x = _randn(gen, N, 2 * H, std=1.5), _randn(gen, N, H)
    projected, x = _on(device, dtype, projected, x)
    if shape:
        projected = _sliced(projected, gen)
    return Case(
        lambda p, x: (ops.highway_gate(p, x),),
        lambda p, x: (reference.highway_gate_ref(p, x),),
        [projected, x],
        ["projected", "x"],
        f"N={N} H={H}{' sliced' if shape else ''}",
    )


_HIGHWAY_SHAPES = [(1, 3, 1, 2), (9, 17, 2, 5)]  # (N, F, layers, P)


def _highway(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    N, F, layers, P = _HIGHWAY_SHAPES[shape]
    x = _randn(gen, N, F)
    ws = [_randn(gen, 2 * F, F, std=F**-0.5) for _ in range(layers)]
    bs = []
    for _ in range(layers):
        b = _randn(gen, 2 * F, std=0.1)
        b[F:] += 1.0  # gates lean to carrying x, as trained ones do
        bs.append(b)
    pw, pb = _randn(gen, P, F, std=F**-0.5), _randn(gen, P, std=0.1)
    leaves = _on(device, dtype, x, *ws, *bs, pw, pb)
    if shape:
        leaves[0] = _sliced(leaves[0], gen)

    def split(x, *w):
        return x, list(w[:layers]), list(w[layers : 2 * layers]), w[-2], w[-1]

    return Case(
        lambda *a: (ops.highway(*split(*a)),),
        lambda *a: (reference.highway_ref(*split(*a)),),
        leaves,
        ["x"]
        + [f"highway_weights[{k}]" for k in range(layers)]
        + [f"highway_biases[{k}]" for k in range(layers)]
        + ["proj_weight", "proj_bias"],
        f"N={N} F={F} layers={layers} P={P}{' sliced' if shape else ''}",
    )


# --- linear and layer 0's gates ------------------------------------------------------------------

_LINEAR_SHAPES = [(1, 7, 5, True), (33, 64, 19, False)]  # (rows, K, N, bias): the GEMV and the GEMM


def _linear(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    n, K, N, bias = _LINEAR_SHAPES[shape]
    x, w = _on(device, dtype, _randn(gen, n, K), _randn(gen, N, K, std=K**-0.5))
    if shape:
        x = _sliced(x, gen)
    if bias:
        (b,) = _on(device, dtype, _randn(gen, N, std=0.1))
        return Case(
            lambda x, w, b: (ops.linear(x, w, b),),
            lambda x, w, b: (reference.linear_ref(x, w, b),),
            [x, w, b],
            ["x", "weight", "bias"],
            f"rows={n} K={K} N={N}",
        )
    return Case(
        lambda x, w: (ops.linear(x, w),),
        lambda x, w: (reference.linear_ref(x, w),),
        [x, w],
        ["x", "weight"],
        f"rows={n} K={K} N={N} no bias sliced",
    )


_GATES_SHAPES = [(1, 3, 2), (11, 16, 5)]  # (U, P, C)


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


def _layer0_gates(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    U, P, C = _GATES_SHAPES[shape]
    tokens = _randn(gen, U, P)
    leaves = _on(device, dtype, tokens, *_lstm_weights(gen, 1, P, C))
    return Case(
        lambda t, *w: (ops.layer0_gates(t, list(w)),),
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


_BILSTM_SHAPES = [(1, 1, 1, 3, 5), (5, 7, 2, 4, 6)]  # (B, T, layers, P, C)

#: Device types whose bilstm op takes one floating dtype for all its inputs: in bf16 there the input
#: gates and states are bf16 too, as the model passes them (the CPU op takes bf16 weights beside fp32
#: input gates, biases and states).
ONE_DTYPE_BILSTM_DEVICES = ("cuda",)


def _bilstm(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    B, T, layers, P, C = _BILSTM_SHAPES[shape]
    if dtype == torch.bfloat16:
        layers = 1  # bf16 errors add up across layers through the skip connections: one layer is held to TOL
    lengths = _lengths(gen, B, T)
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
    leaves = _on(device, act, xg0, h0, c0) + _on(device, dtype, *weights)
    index = token_index.to(device)
    # the fast op plans on the host (lengths on the CPU, no device sync); the reference reads them on the device
    lengths_dev = lengths.to(device)

    def fast(xg0, h0, c0, *w):
        return ops.bilstm(xg0, index, lengths, list(w), CLIP, CLIP, h0, c0)

    def ref(xg0, h0, c0, *w):
        return reference.bilstm_ref(xg0, index, lengths_dev, list(w), CLIP, CLIP, h0, c0)

    return Case(
        fast,
        ref,
        leaves,
        ["xg0", "h0", "c0"] + [f"weights[{k}]" for k in range(8 * layers)],
        f"B={B} T={T} layers={layers} P={P} C={C} lengths {lengths.tolist()}",
    )


_LAYER_SHAPES = [(1, 1, 2, 3), (4, 6, 3, 5)]  # (B, T, P, C)


def _lstm_layer(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    B, T, P, C = _LAYER_SHAPES[shape]
    lengths = _lengths(gen, B, T)
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
        return ops.lstm_layer(xg, lengths, w_hh, w_proj, CLIP, CLIP, h0, c0)

    def ref(xg, w_hh, w_proj, h0, c0):
        # the twin computes the padding's steps and drops them; their NaN would reach its gradients
        xg = torch.where(padding_dev[None, :, :, None], 0.0, xg)
        return reference.lstm_layer_pair_ref(xg, lengths_dev, w_hh, w_proj, CLIP, CLIP, h0, c0)

    return Case(
        fast, ref, leaves, ["xg", "w_hh", "w_proj", "h0", "c0"], f"B={B} T={T} P={P} C={C} lengths {lengths.tolist()}"
    )


_TRAIN_SHAPES = [(1, 1, 1, 2, 3), (3, 5, 2, 3, 4)]  # (B, T, layers, P, C)


def _bilstm_train(gen: torch.Generator, shape: int, device: torch.device, dtype: torch.dtype) -> Case:
    B, T, layers, P, C = _TRAIN_SHAPES[shape]
    lengths = _lengths(gen, B, T)
    x = _randn(gen, B, T, P)
    weights = _lstm_weights(gen, layers, P, C)
    h0, c0 = _randn(gen, layers, B, 2 * P, std=1.5), _randn(gen, layers, B, 2 * C, std=2.0)
    dropout = 0.25
    masks = [(torch.rand(2, B, T, P, generator=gen) >= dropout).double() / (1 - dropout) for _ in range(layers)]
    masks = [m.to(device=device, dtype=dtype) for m in masks]
    leaves = _on(device, dtype, x, h0, c0, *weights)
    lengths_dev = lengths.to(device)

    def fast(x, h0, c0, *w):
        return ops.bilstm_train(x, lengths, list(w), CLIP, CLIP, h0, c0, dropout, True, [m.to(x.dtype) for m in masks])

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


_F32, _BF16 = torch.float32, torch.bfloat16

#: every op of elmo_fast.bilm.ops with a reference twin, in the model's order
OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in [
        OpSpec(
            "char_cnn",
            "char_cnn_ref",
            _char_cnn,
            len(_CHAR_SHAPES),
            # the CPU kernel takes float32 and float64; the CUDA one bf16 and fp16 too
            {"cpu": (_F32,), "cuda": (_F32, _BF16)},
            cuda_training=("grad", "gradcheck"),
        ),
        OpSpec(
            "highway_gate",
            "highway_gate_ref",
            _highway_gate,
            len(_GATE_SHAPES),
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            cuda_training=("grad", "gradcheck"),
        ),
        OpSpec(
            "highway",
            "highway_ref",
            _highway,
            len(_HIGHWAY_SHAPES),
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            cuda_training=("grad", "gradcheck"),
        ),
        OpSpec("linear", "linear_ref", _linear, len(_LINEAR_SHAPES), {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)}),
        OpSpec(
            "layer0_gates",
            "layer0_gates_ref",
            _layer0_gates,
            len(_GATES_SHAPES),
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            differentiable=False,
        ),
        OpSpec(
            "bilstm",
            "bilstm_ref",
            _bilstm,
            len(_BILSTM_SHAPES),
            {"cpu": (_F32, _BF16), "cuda": (_F32, _BF16)},
            differentiable=False,
        ),
        OpSpec(
            "lstm_layer",
            "lstm_layer_pair_ref",
            _lstm_layer,
            len(_LAYER_SHAPES),
            {"cpu": (_F32,), "cuda": (_F32,)},
            cuda_training=("forward", "grad", "gradcheck"),
        ),
        OpSpec(
            "bilstm_train",
            "bilstm_train_ref",
            _bilstm_train,
            len(_TRAIN_SHAPES),
            {"cpu": (_F32,), "cuda": (_F32,)},
            cuda_training=("forward", "grad", "gradcheck"),
        ),
    ]
}
