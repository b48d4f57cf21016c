"""Cases of the LSTM tests: the inference biLSTM's inputs (`lstm_inputs`, `LSTM_CASES`), one trainable
layer's (`layer_case`, NaN at padding; `indexed_case`, its gates as rows picked by token_index) and the
training stack's (`stack_case`, with dropout masks)."""

import math

import torch
from layouts import transposed_storage


def lstm_inputs(L, B, T, P, C, lengths, dtype, seed, U=None, states=False, garbage_index=True):
    """xg0, token_index, lengths, weights (contractive: fp32 rounding differences must not grow
    over the steps), h0, c0; everything on the CPU in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    U = U if U is not None else max(1, B * T // 2)
    lengths = torch.tensor(lengths, dtype=torch.long)
    assert lengths.shape == (B,)
    xg0 = torch.randn(U, 2, 4 * C, generator=g, dtype=torch.float64)
    xg0[:, :, C : 2 * C] += 1.0  # forget gates lean open: cells integrate up to the clip
    token_index = torch.randint(0, max(U, 1), (B, T), generator=g)
    if garbage_index and B * T:  # past each row's length the index is ignored, even out of range
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        token_index[pad] = torch.randint(-7, U + 7, (int(pad.sum()),), generator=g)
    weights = []
    for _ in range(L):
        for _ in range(2):
            weights += [
                torch.randn(4 * C, P, generator=g, dtype=torch.float64) / math.sqrt(P),
                0.35 * torch.randn(4 * C, P, generator=g, dtype=torch.float64) / math.sqrt(P),
                0.1 * torch.randn(4 * C, generator=g, dtype=torch.float64),
                3.0 * torch.randn(P, C, generator=g, dtype=torch.float64) / math.sqrt(C),
            ]
    h0 = c0 = None
    if states:
        h0 = torch.randn(L, B, 2 * P, generator=g, dtype=torch.float64)
        c0 = 2 * torch.randn(L, B, 2 * C, generator=g, dtype=torch.float64)
    cast = lambda t: None if t is None else t.to(dtype)
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


def layer_case(B, T, P, C, dtype, seed, lengths=None, state=True, layout="contiguous", junk=float("nan")):
    """Fresh random inputs of lstm_layer: (xg, lengths, w_hh, w_proj, h0, c0).

    Scaled as test_lstm's cases, so that cells and projections reach clips around 1-3: forget gates
    lean open (+1.5), projections 3x unit gain, recurrent weights small (a contractive recurrence).
    Padding positions of xg hold `junk` (NaN by default): the op must never read them.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    if lengths is None:
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    xg = randn(2, B, T, 4 * C, std=2.0)
    xg[..., C : 2 * C] += 1.5
    xg[:, torch.arange(T)[None, :] >= lengths[:, None]] = junk
    w_hh = randn(2, 4 * C, P, std=0.35 * P**-0.5)
    w_proj = randn(2, P, C, std=3.0 * C**-0.5)
    h0 = randn(2, B, P, std=1.5) if state else None
    c0 = randn(2, B, C, std=2.0) if state else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    xg = cast(xg)
    if layout == "sliced":  # rows of a wider buffer, time-major: strides everywhere but the last dim
        buf = torch.randn(T, 2, B, 4 * C + 9, generator=gen, dtype=torch.float64).to(dtype)
        buf[..., 5 : 5 + 4 * C] = xg.permute(2, 0, 1, 3)
        xg = buf[..., 5 : 5 + 4 * C].permute(1, 2, 0, 3)
    elif layout == "feature_major":  # last dim not unit-stride: the op copies it once
        xg = transposed_storage(xg)
    elif layout != "contiguous":
        raise ValueError(layout)
    return xg, lengths, cast(w_hh), cast(w_proj), cast(h0), cast(c0)


def differentiable(case):
    xg, _, w_hh, w_proj, h0, c0 = case
    return [t for t in (xg, w_hh, w_proj, h0, c0) if t is not None]


GRADCHECK_CASES = [  # B, T, P, C, lengths
    (5, 6, 3, 5, [6, 0, 3, 1, 5]),  # unsorted, a 0 and a 1, odd sizes
    (1, 1, 2, 3, [1]),  # B = 1, T = 1
    (3, 4, 5, 2, [0, 0, 0]),  # nothing runs: the states pass through
    (2, 7, 9, 3, [7, 7]),  # P > C
]


def indexed_case(case, mode, seed):
    """case's gates as rows of xg [2, U, 4C] picked by token_index [B, T] (junk at padding positions):
    "packed" one row per real position, as bilstm_train passes them; "repeated" U = N / 2 random
    rows (positions share rows: their gradients add up); "spare" packed rows among as many unread ones."""
    xg, lengths, *rest = case
    gen = torch.Generator().manual_seed(seed)
    B, T = xg.shape[1], xg.shape[2]
    valid = torch.arange(T)[None, :] >= 0
    valid = valid & (torch.arange(T)[None, :] < lengths[:, None])
    N = int(valid.sum())
    if mode == "repeated":
        U = max(1, N // 2)
        rows = torch.randn(2, U, xg.shape[3], generator=gen, dtype=torch.float64).to(xg.dtype) * 2
        index = torch.randint(0, U, (B, T), generator=gen)
    else:
        U = N if mode == "packed" else 2 * N + 3
        slots = torch.randperm(U, generator=gen)[:N] if mode == "spare" else torch.arange(N)
        rows = torch.randn(2, U, xg.shape[3], generator=gen, dtype=torch.float64).to(xg.dtype)
        rows[:, slots] = xg[:, valid]
        index = torch.zeros(B, T, dtype=torch.long)
        index[valid] = slots
    junk = torch.tensor([-5, U, U + 1000])[torch.randint(0, 3, (int((~valid).sum()),), generator=gen)]
    index[~valid] = junk
    return rows, lengths, *rest, index


def stack_case(B, T, L, P, C, dtype, seed, lengths=None, dropout=0.1):
    """x [B, T, P], lengths, the flat weights (layer 0's w_ih and bias used), h0, c0, dropout masks."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    if lengths is None:
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    weights = []
    for _ in range(2 * L):
        bias = randn(4 * C, std=0.1)
        bias[C : 2 * C] += 1.5
        weights += [
            randn(4 * C, P, std=2.0 * P**-0.5),
            randn(4 * C, P, std=0.35 * P**-0.5),
            bias,
            randn(P, C, std=3.0 * C**-0.5),
        ]
    x = randn(B, T, P, std=1.5)
    h0, c0 = randn(L, B, 2 * P, std=1.5), randn(L, B, 2 * C, std=2.0)
    keep = 1 - dropout
    masks = [(torch.rand(2, B, T, P, generator=gen, dtype=torch.float64) < keep).double() / keep for _ in range(L)]
    cast = lambda ts: [t.to(dtype) for t in ts]  # noqa: E731
    return x.to(dtype), lengths, cast(weights), h0.to(dtype), c0.to(dtype), cast(masks)
