// GEMMs against packed bf16 weights (csrc/packed_weight.h) through oneDNN's BRGeMM micro-kernel, as
// ATen exposes it (at::native::cpublas::brgemm): AMX tiles where the CPU has them, AVX512-BF16 dot
// products otherwise, with float accumulation and a float result. The weights are reordered once,
// when a model is loaded (op `pack_weight`), instead of by every call as ATen's bf16 matmul does.
// Whether this beats the other paths (oneDNN's matmul, gemv_nt) is measured on the user's machine
// (elmo_fast/bilm/calibration.py), which also checks its results before choosing it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace elmo_fast {
namespace cpu_gemm {

// w [N, K] (float32 or bfloat16, N a multiple of 16, K even) -> packed (rounded to bf16 once).
at::Tensor pack_bf16(const at::Tensor& w);

// out[n, N] (float, rows ldo apart) = a[n, K] (bf16, rows lda apart) @ w^T, w packed [N / nb, K / 2,
// nb, 2]; on the ATen threads (on the calling thread inside a parallel region).
void packed_mm(float* out, int64_t ldo, const c10::BFloat16* a, int64_t lda, int64_t n, const at::Tensor& packed);

}  // namespace cpu_gemm
}  // namespace elmo_fast
