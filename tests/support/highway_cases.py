"""Cases of the highway tests: the stack + projection's inputs (`make`, char-CNN-like values) and the
gate's (`highway_inputs`: both sides of relu, saturating gates, four memory layouts), as the forward and
backward tests draw them."""

import torch
from layouts import wider


def make(n, f, p, layers, dtype=torch.float32, seed=0, sliced=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, f, generator=g, dtype=torch.float64) * 3  # char CNN output: relu'd, ~[0, 3]
    ws = [torch.randn(2 * f, f, generator=g, dtype=torch.float64) / f**0.5 for _ in range(layers)]
    bs = [torch.randn(2 * f, generator=g, dtype=torch.float64) for _ in range(layers)]
    pw = torch.randn(p, f, generator=g, dtype=torch.float64) / f**0.5
    pb = torch.randn(p, generator=g, dtype=torch.float64) * 0.1
    if sliced:  # x as columns of a wider buffer, the weights as every other row of taller ones
        x = torch.cat([torch.randn(n, 3, dtype=torch.float64), x, torch.randn(n, 2, dtype=torch.float64)], 1)[
            :, 3 : 3 + f
        ]
        ws = [torch.stack([w, torch.randn_like(w)], 1).reshape(4 * f, f)[::2] for w in ws]
    return [t.to(dtype) if isinstance(t, torch.Tensor) else [u.to(dtype) for u in t] for t in (x, ws, bs, pw, pb)]


def highway_inputs(n, h, dtype, seed, layout="contiguous"):
    """projected [N, 2H] and x [N, H] of fresh random values that exercise every branch.

    transform takes both signs (both sides of relu); gate ranges over ~[-12, 12] plus saturating
    entries (+-30, +-100: past the kernel's exp clamp) so g covers (0, 1) and both ends.
    layout "contiguous", "sliced" (columns of wider buffers: row stride > width), "strided_rows"
    (every other row) or "transposed" (x with column stride != 1: the kernel's copy path).
    """
    gen = torch.Generator().manual_seed(seed)
    transform = torch.randn(n, h, generator=gen, dtype=torch.float64) * 2
    gate = torch.randn(n, h, generator=gen, dtype=torch.float64) * 4
    if gate.numel():
        saturate = torch.rand(n, h, generator=gen) < 0.1
        big = torch.tensor([-100.0, -30.0, 30.0, 100.0], dtype=torch.float64)
        gate[saturate] = big[torch.randint(0, 4, (int(saturate.sum()),), generator=gen)]
    x = torch.randn(n, h, generator=gen, dtype=torch.float64) + 0.5
    projected = torch.cat([transform, gate], dim=1).to(dtype)
    x = x.to(dtype)

    def wider(t, left, right):  # t as a column slice of a buffer with other data around it
        buf = torch.randn(t.shape[0], left + t.shape[1] + right, generator=gen, dtype=torch.float64).to(dtype)
        buf[:, left : left + t.shape[1]] = t
        return buf[:, left : left + t.shape[1]]

    def every_other_row(t):
        buf = torch.randn(2 * t.shape[0], t.shape[1], generator=gen, dtype=torch.float64).to(dtype)
        buf[::2] = t
        return buf[::2]

    if layout == "sliced":
        projected, x = wider(projected, 3, 2), wider(x, 2, 5)
    elif layout == "strided_rows":
        projected, x = every_other_row(projected), every_other_row(x)
    elif layout == "transposed":
        projected, x = projected.t().contiguous().t(), x.t().contiguous().t()
    elif layout != "contiguous":
        raise ValueError(layout)
    return projected, x


def highway_case(n, f, p, layers, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=gen, dtype=torch.float64)
    hw = [torch.randn(2 * f, f, generator=gen, dtype=torch.float64) / f**0.5 for _ in range(layers)]
    hb = [torch.randn(2 * f, generator=gen, dtype=torch.float64) for _ in range(layers)]
    for b in hb:
        b[f:] -= 1.0  # gates lean to carrying x, as trained ones do; both sides of relu stay
    pw = torch.randn(p, f, generator=gen, dtype=torch.float64) / f**0.5
    pb = torch.randn(p, generator=gen, dtype=torch.float64)
    return [t.to(dtype) for t in (x, *hw, *hb, pw, pb)]


def gate_case(n, h, dtype, seed, layout="contiguous"):
    gen = torch.Generator().manual_seed(seed)
    projected = torch.randn(n, 2 * h, generator=gen, dtype=torch.float64) * 3
    x = torch.randn(n, h, generator=gen, dtype=torch.float64)
    projected, x = projected.to(dtype), x.to(dtype)
    if layout == "sliced":
        projected, x = wider(projected, 1, 2, 3, gen), wider(x, 1, 1, 4, gen)
    elif layout == "transposed":
        projected, x = projected.t().contiguous().t(), x.t().contiguous().t()
    return [projected, x]
