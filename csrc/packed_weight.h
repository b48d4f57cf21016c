// A GEMM weight stored for the CPU's bf16 micro-kernels ("packed"), one rule for every binding that
// may receive one (the CPU ops take it, the CUDA ones refuse it by name):
//
//   a weight w [N, K] (out = x @ w^T) packed with block nb is a bfloat16 tensor [N / nb, K / 2, nb, 2]:
//   packed[j, k / 2, c, k % 2] = w[j * nb + c, k]
//
// i.e. per block of nb output columns, w^T's rows two by two, interleaved (the "VNNI" layout that
// AVX512-BF16's dot products and AMX tiles read). N must be a multiple of nb and K even; the logical
// shape [N, K] follows from the packed one. csrc/cpu/packed_gemm.cpp packs and multiplies; Python
// makes packed weights once per model with elmo_fast.bilm.ops.pack_weight.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace elmo_fast {

inline bool is_packed_weight(const at::Tensor& w) {
  return w.dim() == 4 && w.scalar_type() == at::kBFloat16 && w.size(3) == 2;
}

// The logical [N, K] of a packed weight; any other tensor's own sizes.
inline std::vector<int64_t> weight_sizes(const at::Tensor& w) {
  if (is_packed_weight(w)) {
    return {w.size(0) * w.size(2), 2 * w.size(1)};
  }
  return w.sizes().vec();
}

}  // namespace elmo_fast
