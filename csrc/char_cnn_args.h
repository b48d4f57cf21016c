// Argument checks of the `char_cnn` / `char_cnn_backward` ops, one set for the CPU op
// (csrc/cpu/char_cnn_cpu.cpp) and the CUDA bindings (csrc/cuda/char_cnn_cuda.cpp), so that every
// backend and the fake in elmo_fast/bilm/ops.py state one rule, in one message: char_ids [N, L] with
// any L >= 1, convolution widths 1 <= w_k <= L. Each binding first checks what is its own (char_ids'
// device type: before a CUDA device guard is made from it; the dtypes its kernels take), then
// check_char_cnn_args for everything else.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>

#include "checks.h"

namespace elmo_fast {

// The sizes a valid call implies.
struct CharCnnDims {
  int64_t n;      // N tokens
  int64_t chars;  // L character ids per token
  int64_t vocab;  // V rows of char_embedding
  int64_t dim;    // D
  int64_t cols;   // sum n_k, the output's columns
};

// char_ids: [N, L] int64, L >= 1; char_embedding: [V, D] on char_ids' device; conv_weights[k]:
// [n_k, D, w_k] with 1 <= w_k <= L and conv_biases[k]: [n_k], of char_embedding's dtype on char_ids'
// device; activation "relu" or "tanh". The values of char_ids are the binding's (the CPU op checks
// them; a CUDA kernel gives a token with an id outside [0, V) a NaN row instead of a device sync).
inline CharCnnDims check_char_cnn_args(const char* kOp, const at::Tensor& char_ids, const at::Tensor& char_embedding,
                                       at::TensorList conv_weights, at::TensorList conv_biases,
                                       c10::string_view activation) {
  ELMO_CHECK_DIM(char_ids, 2);
  const int64_t chars = char_ids.size(1);
  ELMO_CHECK(chars >= 1, "char_ids must have at least one character id per token (shape [N, L]), got shape ",
             char_ids.sizes());
  ELMO_CHECK(chars <= std::numeric_limits<int32_t>::max(), "char_ids has ", chars,
             " ids per token; at most 2^31 - 1 are supported");
  ELMO_CHECK_DTYPE(char_ids, at::kLong);
  ELMO_CHECK_DIM(char_embedding, 2);
  ELMO_CHECK_SAME_DEVICE(char_embedding, char_ids);
  const at::ScalarType dtype = char_embedding.scalar_type();
  const int64_t vocab = char_embedding.size(0), dim = char_embedding.size(1);
  ELMO_CHECK(vocab <= std::numeric_limits<int32_t>::max(), "char_embedding has ", vocab,
             " rows; at most 2^31 - 1 are supported");
  ELMO_CHECK(activation == "relu" || activation == "tanh", "activation must be \"relu\" or \"tanh\", got \"",
             std::string(activation), "\"");
  ELMO_CHECK(!conv_weights.empty(), "conv_weights must hold at least one convolution, got none");
  ELMO_CHECK(conv_weights.size() == conv_biases.size(),
             "conv_weights and conv_biases must have the same length (one bias per convolution), got ",
             conv_weights.size(), " and ", conv_biases.size());
  int64_t cols = 0;
  for (size_t k = 0; k < conv_weights.size(); ++k) {
    const at::Tensor& w = conv_weights[k];
    const at::Tensor& b = conv_biases[k];
    ELMO_CHECK(w.dim() == 3, "conv_weights[", k, "] must have 3 dims ([n, D, w]), got shape ", w.sizes());
    ELMO_CHECK(w.size(1) == dim, "conv_weights[", k, "] must have D = ", dim, " input channels (char_embedding is ",
               char_embedding.sizes(), "), got shape ", w.sizes());
    ELMO_CHECK(w.size(2) >= 1 && w.size(2) <= chars, "conv_weights[", k, "] must have a width in 1..", chars,
               " (the characters per token of char_ids, ", char_ids.sizes(), "), got shape ", w.sizes());
    ELMO_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "conv_biases[", k, "] must have shape [", w.size(0),
               "] (one bias per filter of conv_weights[", k, "]), got shape ", b.sizes());
    ELMO_CHECK(w.scalar_type() == dtype, "conv_weights[", k, "] must have the dtype of char_embedding (",
               dtype_name(dtype), "), got ", dtype_name(w.scalar_type()));
    ELMO_CHECK(b.scalar_type() == dtype, "conv_biases[", k, "] must have the dtype of char_embedding (",
               dtype_name(dtype), "), got ", dtype_name(b.scalar_type()));
    ELMO_CHECK(w.device() == char_ids.device(), "conv_weights[", k, "] must be on char_ids' device ", char_ids.device(),
               ", got ", w.device());
    ELMO_CHECK(b.device() == char_ids.device(), "conv_biases[", k, "] must be on char_ids' device ", char_ids.device(),
               ", got ", b.device());
    cols += w.size(0);
  }
  ELMO_CHECK(cols <= std::numeric_limits<int32_t>::max(), "conv_weights have ", cols,
             " filters in all; at most 2^31 - 1 are supported");
  return CharCnnDims{char_ids.size(0), chars, vocab, dim, cols};
}

// char_cnn_backward's grad_out: [N, sum n_k] of char_embedding's dtype, on char_ids' device.
inline void check_char_cnn_grad(const char* kOp, const CharCnnDims& dims, const at::Tensor& grad_out,
                                const at::Tensor& char_ids, const at::Tensor& char_embedding) {
  ELMO_CHECK_SHAPE(grad_out, dims.n, dims.cols);
  ELMO_CHECK_SAME_DTYPE(grad_out, char_embedding);
  ELMO_CHECK_SAME_DEVICE(grad_out, char_ids);
}

}  // namespace elmo_fast
