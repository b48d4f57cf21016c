"""Each CUDA op once on small awkward inputs, for compute-sanitizer (memcheck, racecheck, ...):

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitizer_case.py

Small on purpose (the sanitizer slows kernels a hundredfold): the tiny preset's shapes, lengths
with empty rows and one-token rows, a sliced input, a token with a bad id, all four dtypes.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.testing import PRESETS  # noqa: E402


def main() -> int:
    ops.require_cuda_kernels()
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    o = PRESETS["tiny"]
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        # highway_gate on a column slice, and the highway stack
        wide = torch.randn(5, 2 * 7 + 3, generator=g).to(dev, dtype)
        x = torch.randn(5, 7, generator=g).to(dev, dtype)
        out = ops.highway_gate(wide[:, 1:15], x)
        ws = [torch.randn(2 * 7, 7, generator=g).to(dev, dtype) for _ in range(2)]
        bs = [torch.randn(2 * 7, generator=g).to(dev, dtype) for _ in range(2)]
        out = ops.highway(x, ws, bs, torch.randn(3, 7, generator=g).to(dev, dtype), torch.randn(3).to(dev, dtype))
        # char_cnn: real-looking ids, an empty row, a full row, a bad id (NaN row by contract)
        ids = torch.randint(1, 262, (6, 50), generator=g)
        ids[0, 6:] = 261
        ids[1] = 0
        ids[5, 3] = 999
        emb = torch.randn(262, o.char_dim, generator=g).to(dev, dtype)
        cw = [torch.randn(n, o.char_dim, w, generator=g).to(dev, dtype) for w, n in o.filters]
        cb = [torch.randn(n, generator=g).to(dev, dtype) for _, n in o.filters]
        out = torch.ops.elmo_fast.char_cnn.default(ids.to(dev), emb, cw, cb, o.activation)
        assert out[:5].isfinite().all() and out[5].isnan().all()
        # bilstm: unsorted lengths with empty and one-token rows, states, clips, 2 layers
        B, T, P, C, L = 5, 7, o.projection_dim, o.cell_dim, o.n_layers
        lengths = torch.tensor([3, 0, 7, 1, 0])
        U = 9
        xg0 = torch.randn(U, 2, 4 * C, generator=g).to(dev, dtype)
        token_index = torch.randint(0, U, (B, T), generator=g).to(dev)
        weights = []
        for _ in range(2 * L):
            weights += [torch.randn(4 * C, P, generator=g) / P ** 0.5, torch.randn(4 * C, P, generator=g) / P ** 0.5,
                        torch.randn(4 * C, generator=g) * 0.1, torch.randn(P, C, generator=g) / C ** 0.5]
        weights = [w.to(dev, dtype) for w in weights]
        h0 = torch.randn(L, B, 2 * P, generator=g).to(dev, dtype)
        c0 = torch.randn(L, B, 2 * C, generator=g).to(dev, dtype)
        outs = torch.ops.elmo_fast.bilstm.default(xg0, token_index, lengths.to(dev), weights, 3.0, 3.0, h0, c0)
        outs = torch.ops.elmo_fast.bilstm.default(xg0, token_index, lengths, weights, None, None, None, None)
        torch.cuda.synchronize()
        assert all(t.isfinite().all() for t in outs), dtype
        print(f"sanitizer_case: {dtype} ok", flush=True)
    del out
    return 0


if __name__ == "__main__":
    sys.exit(main())
