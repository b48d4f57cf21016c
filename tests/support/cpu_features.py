"""What this CPU runs, for tests whose subject only exists on some CPUs: packed bfloat16 weights need
oneDNN's BRGeMM micro-kernel (AVX-512 with BF16, or AMX); an AVX2-only CPU refuses them in one line
(tests/tuning/test_packed_availability.py holds that refusal on every CPU)."""

from __future__ import annotations

import pytest
import torch

from elmo_fast.bilm import ops


def packed_bf16_available() -> bool:
    return ops.HAS_EXTENSION and ops.packed_gemm_available(torch.bfloat16)


needs_packed_bf16 = pytest.mark.skipif(
    not packed_bf16_available(),
    reason="this CPU cannot run packed bfloat16 weights (oneDNN's BRGeMM needs AVX-512 with BF16, or AMX)",
)


def packed_dtypes() -> list:
    """float32 and bfloat16 as parameters of a test of packed weights, bfloat16 skipped where it cannot run."""
    return [
        pytest.param(torch.bfloat16, marks=needs_packed_bf16, id="torch.bfloat16"),
        pytest.param(torch.float32, id="torch.float32"),
    ]
