"""Each CUDA op once on small awkward inputs, for compute-sanitizer (memcheck, racecheck, synccheck):

    compute-sanitizer --tool memcheck --error-exitcode 1 python .ci/sanitizer_case.py

Small on purpose (the sanitizer slows kernels a hundredfold): the tiny preset's shapes, lengths
with empty rows and one-token rows, a sliced input, a token with a bad id, all four dtypes; widths
that are multiples of 8 and aligned (the kernels' 16-byte vector accesses) beside odd ones (their
element-wise fallback); the training ops (char_cnn_backward, highway_gate_backward,
lstm_layer_forward / lstm_layer_backward) in float32 and float64.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.formats.random_models import PRESETS  # noqa: E402


def forward_ops(dev, dtype, g) -> None:
    o = PRESETS["tiny"]
    # highway_gate on a column slice (element-wise path) and on aligned rows of 16 (vector path), the stack
    for h in (7, 16):
        wide = torch.randn(5, 2 * h + 3, generator=g).to(dev, dtype)
        x = torch.randn(5, h, generator=g).to(dev, dtype)
        ops.highway_gate(wide[:, 1 : 2 * h + 1], x)
        ops.highway_gate(torch.randn(5, 2 * h, generator=g).to(dev, dtype), x)
    x = torch.randn(5, 7, generator=g).to(dev, dtype)
    ws = [torch.randn(2 * 7, 7, generator=g).to(dev, dtype) for _ in range(2)]
    bs = [torch.randn(2 * 7, generator=g).to(dev, dtype) for _ in range(2)]
    ops.highway(x, ws, bs, torch.randn(3, 7, generator=g).to(dev, dtype), torch.randn(3).to(dev, dtype))
    # char_cnn: real-looking ids, an empty row, a full row, a bad id (NaN row by contract); rows of 64
    ids = torch.randint(1, 262, (6, 50), generator=g)
    ids[0, 6:] = 261
    ids[1] = 0
    ids[5, 3] = 999
    emb = torch.randn(262, o.char_dim, generator=g).to(dev, dtype)
    cw = [torch.randn(n, o.char_dim, w, generator=g).to(dev, dtype) for w, n in o.filters]
    cb = [torch.randn(n, generator=g).to(dev, dtype) for _, n in o.filters]
    out = torch.ops.elmo_fast.char_cnn.default(ids.to(dev), emb, cw, cb, o.activation)
    assert out[:5].isfinite().all() and out[5].isnan().all()
    torch.ops.elmo_fast.char_cnn.default(torch.randint(0, 262, (3, 64), generator=g).to(dev), emb, cw, cb, "tanh")
    # bilstm: unsorted lengths with empty and one-token rows, states, clips, 2 layers; C, P of the
    # preset (tiny: multiples of 8, the vector path) and odd ones (the element-wise path)
    for P, C in ((o.projection_dim, o.cell_dim), (5, 7)):
        B, T, L = 5, 7, o.n_layers
        lengths = torch.tensor([3, 0, 7, 1, 0])
        U = 9
        xg0 = torch.randn(U, 2, 4 * C, generator=g).to(dev, dtype)
        token_index = torch.randint(0, U, (B, T), generator=g).to(dev)
        weights = []
        for _ in range(2 * L):
            weights += [
                torch.randn(4 * C, P, generator=g) / P**0.5,
                torch.randn(4 * C, P, generator=g) / P**0.5,
                torch.randn(4 * C, generator=g) * 0.1,
                torch.randn(P, C, generator=g) / C**0.5,
            ]
        weights = [w.to(dev, dtype) for w in weights]
        h0 = torch.randn(L, B, 2 * P, generator=g).to(dev, dtype)
        c0 = torch.randn(L, B, 2 * C, generator=g).to(dev, dtype)
        torch.ops.elmo_fast.bilstm.default(xg0, token_index, lengths.to(dev), weights, 3.0, 3.0, h0, c0)
        outs = torch.ops.elmo_fast.bilstm.default(xg0, token_index, lengths, weights, None, None, None, None)
        torch.cuda.synchronize()
        assert all(t.isfinite().all() for t in outs), dtype


def training_ops(dev, dtype, g) -> None:
    o = PRESETS["tiny"]
    # highway_gate_backward, element-wise and vector paths
    for h in (7, 16):
        projected = torch.randn(6, 2 * h, generator=g).to(dev, dtype)
        x = torch.randn(6, h, generator=g).to(dev, dtype)
        torch.ops.elmo_fast.highway_gate_backward.default(torch.randn(6, h, generator=g).to(dev, dtype), projected, x)
    if dtype not in (torch.float32, torch.float64):
        return
    # char_cnn_backward with an empty row and a bad id (NaN gradients by contract)
    ids = torch.randint(1, 262, (7, 50), generator=g)
    ids[0, 6:] = 261
    ids[1] = 0
    emb = torch.randn(262, o.char_dim, generator=g).to(dev, dtype)
    cw = [torch.randn(n, o.char_dim, w, generator=g).to(dev, dtype) for w, n in o.filters]
    cb = [torch.randn(n, generator=g).to(dev, dtype) for _, n in o.filters]
    grad = torch.randn(7, sum(n for _, n in o.filters), generator=g).to(dev, dtype)
    e, _, _ = torch.ops.elmo_fast.char_cnn_backward.default(grad, ids.to(dev), emb, cw, cb, "relu")
    assert e.isfinite().all()
    ids[4, 2] = 300
    torch.ops.elmo_fast.char_cnn_backward.default(grad, ids.to(dev), emb, cw, cb, "tanh")
    # lstm_layer_forward / _backward: dense and indexed gates, rows repeated, lengths with 0 and 1
    B, T, P, C = 5, 6, 4, 6
    lengths = torch.tensor([6, 0, 3, 1, 5])
    xg = torch.randn(2, B, T, 4 * C, generator=g).to(dev, dtype)
    w_hh = (0.3 * torch.randn(2, 4 * C, P, generator=g)).to(dev, dtype)
    w_proj = torch.randn(2, P, C, generator=g).to(dev, dtype)
    h0 = torch.randn(2, B, P, generator=g).to(dev, dtype)
    c0 = torch.randn(2, B, C, generator=g).to(dev, dtype)
    y, h, c, saved = torch.ops.elmo_fast.lstm_layer_forward.default(xg, lengths, w_hh, w_proj, 1.0, 0.7, h0, c0)
    torch.ops.elmo_fast.lstm_layer_backward.default(
        torch.randn_like(y),
        torch.randn_like(h),
        torch.randn_like(c),
        saved,
        lengths,
        None,
        list(xg.shape),
        w_hh,
        w_proj,
        1.0,
        0.7,
        h0,
        c0,
    )
    index = torch.randint(0, 4, (B, T), generator=g)
    rows = torch.randn(2, 4, 4 * C, generator=g).to(dev, dtype)
    y, h, c, saved = torch.ops.elmo_fast.lstm_layer_forward.default(
        rows, lengths, w_hh, w_proj, None, None, None, None, index
    )
    grads = torch.ops.elmo_fast.lstm_layer_backward.default(
        torch.randn_like(y), None, None, saved, lengths, index, list(rows.shape), w_hh, w_proj, None, None, None, None
    )
    torch.cuda.synchronize()
    assert all(t.isfinite().all() for t in grads), dtype


def main() -> int:
    ops.require_cuda_kernels()
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        forward_ops(dev, dtype, g)
        if ops.HAS_CUDA_BACKWARD:
            training_ops(dev, dtype, g)
        torch.cuda.synchronize()
        print(f"sanitizer_case: {dtype} ok", flush=True)
    if not ops.HAS_CUDA_BACKWARD:
        print("sanitizer_case: this build has no CUDA training ops (ops.HAS_CUDA_BACKWARD); they were not run")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
