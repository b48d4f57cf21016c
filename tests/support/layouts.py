"""Tensors laid out awkwardly in memory, with the same values: the kernels must read strides, not assume them."""

import torch


def wider(t, dim, left, right, gen):
    """t as a slice along `dim` of a buffer with other (random) data around it."""
    shape = list(t.shape)
    shape[dim] += left + right
    buf = (
        torch.randint(0, 262, shape, generator=gen)
        if t.dtype == torch.long
        else torch.randn(shape, generator=gen, dtype=t.dtype)
    )
    index = [slice(None)] * t.dim()
    index[dim] = slice(left, left + t.shape[dim])
    buf[tuple(index)] = t
    return buf[tuple(index)]


def every_other(t, gen):
    """t as every other row of a buffer twice as long."""
    buf = (
        torch.randint(0, 262, (2 * t.shape[0], *t.shape[1:]), generator=gen)
        if t.dtype == torch.long
        else torch.randn(2 * t.shape[0], *t.shape[1:], generator=gen, dtype=t.dtype)
    )
    buf[::2] = t
    return buf[::2]


def transposed_storage(t):
    """Same values, reversed dim order in memory (no dim has unit stride unless size 1)."""
    return t.permute(*reversed(range(t.dim()))).contiguous().permute(*reversed(range(t.dim())))
