// A GEMM weight stored for the CPU's BRGeMM micro-kernels ("packed"), one rule for every binding that
// may receive one (the CPU ops take it, the CUDA ones refuse it by name):
//
//   a weight w [N, K] (out = x @ w^T) packed with column block nb, in its dtype, groups of g = 4 / its
//   element size (bfloat16: 2, float32: 1), is a tensor [N / nb, K / g, nb, g]:
//   packed[j, k / g, c, k % g] = w[j * nb + c, k]
//
// i.e. per block of nb output columns, w^T's rows in groups of g, interleaved: for bf16 the "VNNI"
// layout that AVX512-BF16's dot products and AMX tiles read, for float32 w^T's block as it is. N must
// be a multiple of 16 (and K even in bf16); the logical shape [N, K] follows from the packed one.
// csrc/cpu/packed_gemm.cpp packs and multiplies; Python makes packed weights once per model with
// elmo_fast.bilm.ops.pack_weight.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace elmo_fast {

inline bool is_packed_weight(const at::Tensor& w) {
  return w.dim() == 4 &&
         ((w.scalar_type() == at::kBFloat16 && w.size(3) == 2) || (w.scalar_type() == at::kFloat && w.size(3) == 1));
}

// The logical [N, K] of a packed weight; any other tensor's own sizes.
inline std::vector<int64_t> weight_sizes(const at::Tensor& w) {
  if (is_packed_weight(w)) {
    return {w.size(0) * w.size(2), w.size(1) * w.size(3)};
  }
  return w.sizes().vec();
}

}  // namespace elmo_fast
