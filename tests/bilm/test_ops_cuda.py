"""Every CUDA op's binding on the targets: device errors naming the argument, 64-bit element offsets,
the emulation's schemas equal to the library's, the training ops under opcheck on a GPU.

Two targets run each test (tests/support/cuda_targets.py): "cuda", the kernels on a GPU (skips, saying
why, without one), and "emulated", the same kernels and bindings compiled for the CPU emulator (a default
subset; every case with ELMO_FAST_CUDA_EMULATION=1). Outputs come from a poisoned allocator; the backward
passes run with @poisoned (tests/support/grad_checks.py); TF32 is off (exact_fp32)."""

import pytest
import torch
from char_cnn_cases import TINY_FILTERS, char_cnn_inputs, elmo_ids, random_cnn
from cuda_targets import (
    Target,
    emulated_by_default,
    exact_fp32,  # noqa: F401  (autouse: TF32 off)
    needs_cpu_ops,
)
from grad_checks import poisoned
from highway_cases import gate_case
from lstm_cases import LSTM_CASES, layer_case, lstm_inputs

from elmo_fast.bilm import ops


def host_device(target: Target) -> torch.device:
    """A device that is not the target's GPU: the CPU for a GPU; `meta` for the emulator, whose GPU is
    the CPU (its device guard rejects meta as CUDA's rejects the CPU)."""
    return torch.device("cpu") if target.is_cuda else torch.device("meta")


@emulated_by_default()
def test_device_errors_name_the_argument(target):
    """An input that is not on the GPU gets the binding's message naming it, not the device guard's
    (the guard is made after the device checks: a CUDAGuard made from a CPU tensor says "Expected a
    CUDA device")."""
    dev, host = target.device, host_device(target)
    ids, emb, ws, bs = char_cnn_inputs(TINY_FILTERS, 4, torch.float32, seed=8)
    conv = ([w.to(dev) for w in ws], [b.to(dev) for b in bs], "relu")
    with pytest.raises(RuntimeError, match="char_cnn: char_ids must be a CUDA tensor"):
        target.op("char_cnn")(ids.to(host), emb.to(dev), *conv)
    out = target.op("char_cnn")(ids.to(dev), emb.to(dev), *conv)
    with pytest.raises(RuntimeError, match="char_cnn_backward: char_ids must be a CUDA tensor"):
        target.op("char_cnn_backward")(out, ids.to(host), emb.to(dev), *conv)
    with pytest.raises(RuntimeError, match="highway_gate: x must be a CUDA tensor"):
        target.op("highway_gate")(torch.randn(4, 8, device=host), torch.randn(4, 4, device=host))
    L, B, T, P, C, lengths = LSTM_CASES["sorted"]
    xg0, token_index, lengths, weights, _, _ = lstm_inputs(L, B, T, P, C, lengths, torch.float32, 5)
    with pytest.raises(RuntimeError, match="bilstm: xg0 must be a CUDA tensor"):
        target.op("bilstm")(
            xg0.to(host), token_index.to(dev), lengths, [w.to(dev) for w in weights], None, None, None, None
        )
    xg = torch.randn(2, B, T, 4 * C)
    with pytest.raises(RuntimeError, match="lstm_layer_forward: xg must be a CUDA tensor"):
        target.op("lstm_layer_forward")(
            xg.to(host),
            lengths,
            torch.randn(2, 4 * C, P, device=dev),
            torch.randn(2, P, C, device=dev),
            None,
            None,
            None,
            None,
        )


@emulated_by_default()
def test_element_offsets_past_2_31(target):
    """Rows more than 2^31 elements apart (views of one bf16 buffer of 2^31 + a few rows, of which only
    those rows are ever written: virtual memory on the CPU): the kernels' and bindings' offsets are 64-bit.
    highway_gate and its backward read rows by their stride; the char CNN's table kernel reads the
    embedding's rows by theirs."""
    far = 2**31 + 64  # elements between two rows
    try:
        buf = torch.empty(far + 256, dtype=torch.bfloat16, device=target.device)
    except (RuntimeError, MemoryError) as exc:  # a small machine refuses 4 GB of address space
        pytest.skip(f"cannot reserve a 4.3 GB buffer here: {exc}")
    g = torch.Generator().manual_seed(0)

    def rows(offset, cols):  # [2, cols]: at `offset` and `far` elements after it, random values
        view = buf.as_strided(  # noqa: F821  (bound above; pytest.skip raises otherwise)
            (2, cols), (far, 1), offset
        )
        view.copy_(torch.randn(2, cols, generator=g).to(torch.bfloat16))
        return view

    projected, x, grad = rows(0, 32), rows(32, 16), rows(48, 16)
    dense = [t.contiguous() for t in (projected, x, grad)]
    got = target.op("highway_gate")(projected, x)
    assert torch.equal(got, target.op("highway_gate")(*dense[:2]))
    strided = target.op("highway_gate_backward")(grad, projected, x)
    for a, b in zip(strided, target.op("highway_gate_backward")(dense[2], dense[0], dense[1])):
        assert torch.equal(a, b)
    emb = rows(64, 4)  # a vocabulary of 2 characters, rows 2^31 + 64 elements apart
    ids = torch.tensor([[0, 1, 1, 0, 1]], device=target.device)
    w = [torch.randn(3, 4, 2, generator=g).to(target.device, torch.bfloat16)]
    b = [torch.randn(3, generator=g).to(target.device, torch.bfloat16)]
    assert torch.equal(
        target.op("char_cnn")(ids, emb, w, b, "relu"), target.op("char_cnn")(ids, emb.contiguous(), w, b, "relu")
    )
    del buf


def test_emulation_schemas_match_the_library(emulated_target):
    if not ops.HAS_EXTENSION:
        pytest.skip("elmo_fast._C not built")
    for name in ("highway_gate", "highway", "char_cnn", "bilstm"):
        real = getattr(torch.ops.elmo_fast, name, None)
        if real is None:
            continue
        emu = getattr(torch.ops.elmo_fast_emu, name).default._schema
        assert str(emu).replace("elmo_fast_emu::", "elmo_fast::") == str(real.default._schema), name


# --- the training ops -----------------------------------------------------------------------------


@needs_cpu_ops
@poisoned
def test_training_ops_opcheck_on_cuda(cuda_target):
    """The CUDA kernels against the ops' fakes and autograd formulas (torch.library.opcheck)."""
    dev = cuda_target.device
    grad_leaf = lambda t: t.detach().to(dev).requires_grad_()
    xg, lengths, w_hh, w_proj, h0, c0 = layer_case(
        5, 7, 3, 5, torch.float32, seed=12, lengths=[7, 0, 3, 1, 5], junk=0.0
    )
    args = [grad_leaf(xg), lengths, grad_leaf(w_hh), grad_leaf(w_proj), 1.0, 1.0, grad_leaf(h0), grad_leaf(c0)]
    torch.library.opcheck(torch.ops.elmo_fast.lstm_layer_forward.default, args)
    y, h, c, saved = torch.ops.elmo_fast.lstm_layer_forward.default(
        *[a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    )
    torch.library.opcheck(
        torch.ops.elmo_fast.lstm_layer_backward.default,
        (
            torch.randn_like(y),
            torch.randn_like(h),
            None,
            saved,
            lengths,
            None,
            list(xg.shape),
            w_hh.to(dev),
            w_proj.to(dev),
            1.0,
            1.0,
            h0.to(dev),
            None,
        ),
    )
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=1)
    ids = elmo_ids(9, seed=1).to(dev)
    torch.library.opcheck(
        torch.ops.elmo_fast.char_cnn.default,
        (ids, grad_leaf(emb), [grad_leaf(w) for w in ws], [grad_leaf(b) for b in bs], "tanh"),
    )
    out = ops.char_cnn(ids, emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "tanh")
    torch.library.opcheck(
        torch.ops.elmo_fast.char_cnn_backward.default,
        (torch.randn_like(out), ids, emb.to(dev), [w.to(dev) for w in ws], [b.to(dev) for b in bs], "tanh"),
    )
    projected, x = gate_case(5, 16, torch.float32, seed=3, layout="sliced")
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (grad_leaf(projected), grad_leaf(x)))
    torch.library.opcheck(
        torch.ops.elmo_fast.highway_gate_backward.default,
        (torch.randn(5, 16, device=dev), projected.to(dev), x.to(dev)),
    )


@needs_cpu_ops
@poisoned
def test_emulation_has_every_training_op(emulated_target):
    for name in ops.TRAINING_OPS:
        emu = getattr(torch.ops.elmo_fast_emu, name).default._schema
        real = getattr(torch.ops.elmo_fast, name).default._schema
        assert str(emu).replace("elmo_fast_emu::", "elmo_fast::") == str(real), name
