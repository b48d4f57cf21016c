// Argument checks of the `char_cnn` / `char_cnn_backward` ops for their CUDA bindings, in the CPU
// op's words (csrc/cpu/char_cnn_cpu.cpp, check_char_cnn_args), so that every backend and the fake in
// elmo_fast/bilm/ops.py state one rule, in one message: char_ids [N, L] with any L >= 1, convolution
// widths 1 <= w_k <= L.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>

#include "checks.h"

namespace elmo_fast {

// char_ids: 2 dims, at least one id per token. Returns L.
inline int64_t check_char_ids_length(const char* kOp, const at::Tensor& char_ids) {
  ELMO_CHECK_DIM(char_ids, 2);
  const int64_t chars = char_ids.size(1);
  ELMO_CHECK(chars >= 1, "char_ids must have at least one character id per token (shape [N, L]), got shape ",
             char_ids.sizes());
  ELMO_CHECK(chars <= std::numeric_limits<int32_t>::max(), "char_ids has ", chars,
             " ids per token; at most 2^31 - 1 are supported");
  return chars;
}

// conv_weights[k] = w: [n_k, D, w_k] (3 dims checked by the caller) with 1 <= w_k <= L.
inline void check_conv_width(const char* kOp, size_t k, const at::Tensor& w, const at::Tensor& char_ids) {
  const int64_t chars = char_ids.size(1);
  ELMO_CHECK(w.size(2) >= 1 && w.size(2) <= chars, "conv_weights[", k, "] must have a width in 1..", chars,
             " (the characters per token of char_ids, ", char_ids.sizes(), "), got shape ", w.sizes());
}

}  // namespace elmo_fast
