// GEMMs against packed weights (csrc/packed_weight.h) through oneDNN's BRGeMM micro-kernel, as ATen
// exposes it (at::native::cpublas::brgemm), with a float result: bf16 weights on AMX tiles where the
// CPU has them, AVX512-BF16 dot products otherwise; float32 weights with AVX2 / AVX-512 FMAs. The
// weights are reordered once, when a model is loaded (op `pack_weight`), instead of by every call (as
// ATen's bf16 matmul does, and MKL's sgemm, which packs its operands on each call). Whether this beats
// the other paths (oneDNN's matmul, BLAS, gemv_nt) is measured on the user's machine
// (elmo_fast/tuning/calibration.py), which also checks its results against the reference before choosing
// it, and never offers packed weights that this CPU cannot run (packed_gemm_available).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace elmo_fast {
namespace cpu_gemm {

// Whether this CPU runs the packed GEMM of weights of this dtype now. float32: always (oneDNN's
// micro-kernel where its ISA is AVX2 or wider, else ATen's GEMM on each block, the same layout).
// bfloat16: oneDNN's micro-kernel only (AVX-512 with BF16 dot products or AMX tiles, as oneDNN sees the
// CPU: ONEDNN_MAX_CPU_ISA caps it), and only while torch.backends.mkldnn is enabled; found by running
// it once on a tiny block. Any other dtype: no.
bool packed_gemm_available(at::ScalarType dtype);

// w [N, K] (float32 or bfloat16; N a multiple of 16, K even in bfloat16) -> packed, in w's dtype. A
// bfloat16 weight on a CPU without the micro-kernel is refused (one line naming the cause).
at::Tensor pack_weight(const at::Tensor& w);

// out[n, N] (float, rows ldo apart) = a[n, K] (rows lda apart) @ w^T, w packed [N / nb, K / g, nb, g]
// of a's dtype (bf16: g = 2, float: g = 1); on the ATen threads (on the calling thread inside a
// parallel region). kOp names the calling op in its errors (a weight packed in another dtype, or
// bf16 weights where the micro-kernel is no longer available).
void packed_mm(const char* kOp, float* out, int64_t ldo, const c10::BFloat16* a, int64_t lda, int64_t n,
               const at::Tensor& packed);
void packed_mm(const char* kOp, float* out, int64_t ldo, const float* a, int64_t lda, int64_t n,
               const at::Tensor& packed);

}  // namespace cpu_gemm
}  // namespace elmo_fast
