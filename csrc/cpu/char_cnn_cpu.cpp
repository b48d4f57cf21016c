// The CPU char_cnn and char_cnn_backward ops: argument checks, the kernels' view of the tensors, the
// backward's two GEMMs through ATen. The kernels and their algorithm: char_cnn_kernels.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "char_cnn_args.h"
#include "checks.h"
#include "cpu/vec_math.h"

#include "cpu/char_cnn_kernels.h"

namespace elmo_fast {
namespace {

using char_cnn::char_cnn_histograms;
using char_cnn::char_cnn_kernel;
using char_cnn::CharCnnParams;
using char_cnn::CharConv;

// Checks char_cnn's arguments (op name kOp) and returns the sizes they imply: the shared rules (char_cnn_args.h:
// char_ids [N, L] int64 with L >= 1, allennlp's and bilm-tf's L is 50, ELMoForManyLangs' its config's
// max_characters_per_token; char_embedding [V, D]; conv_weights[k] [n_k, D, w_k] with w_k <= L; conv_biases[k] [n_k];
// one dtype, one device), then the CPU op's own: CPU tensors, float32 or float64, and ids in [0, V).
CharCnnDims check_char_cnn_cpu_args(const char* kOp, const at::Tensor& char_ids, const at::Tensor& char_embedding,
                                    at::TensorList conv_weights, at::TensorList conv_biases,
                                    c10::string_view activation) {
  ELMO_CHECK_CPU(char_ids);
  const at::ScalarType dtype = char_embedding.scalar_type();
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kDouble, "char_embedding has dtype ", dtype_name(dtype),
             "; supported: float32, float64");
  const CharCnnDims dims = check_char_cnn_args(kOp, char_ids, char_embedding, conv_weights, conv_biases, activation);
  if (dims.n > 0) {
    const auto [lo, hi] = at::aminmax(char_ids);
    const int64_t min_id = lo.item<int64_t>(), max_id = hi.item<int64_t>();
    ELMO_CHECK(min_id >= 0 && max_id < dims.vocab, "char_ids must hold ids in [0, ", dims.vocab,
               ") (rows of char_embedding), got values in [", min_id, ", ", max_id, "]");
  }
  return dims;
}

// The kernel's view of checked arguments; `convs` holds the convolutions it points to.
template <typename scalar_t>
CharCnnParams<scalar_t> make_params(const at::Tensor& char_ids, const at::Tensor& char_embedding,
                                    at::TensorList conv_weights, at::TensorList conv_biases,
                                    c10::string_view activation, std::vector<CharConv<scalar_t>>& convs) {
  convs.resize(conv_weights.size());
  for (size_t k = 0; k < convs.size(); ++k) {
    const at::Tensor& w = conv_weights[k];
    const at::Tensor& b = conv_biases[k];
    convs[k].weight = w.const_data_ptr<scalar_t>();
    convs[k].bias = b.const_data_ptr<scalar_t>();
    convs[k].num = w.size(0);
    convs[k].width = w.size(2);
    for (int d = 0; d < 3; ++d) {
      convs[k].weight_stride[d] = w.stride(d);
    }
    convs[k].bias_stride = b.stride(0);
  }
  CharCnnParams<scalar_t> params;
  params.char_ids = char_ids.const_data_ptr<int64_t>();
  params.ids_stride[0] = char_ids.stride(0);
  params.ids_stride[1] = char_ids.stride(1);
  params.embedding = char_embedding.const_data_ptr<scalar_t>();
  params.embedding_stride[0] = char_embedding.stride(0);
  params.embedding_stride[1] = char_embedding.stride(1);
  params.convs = convs.data();
  params.num_convs = static_cast<int64_t>(convs.size());
  params.out = nullptr;
  params.n = char_ids.size(0);
  params.length = char_ids.size(1);
  params.vocab = char_embedding.size(0);
  params.dim = char_embedding.size(1);
  params.relu = activation == "relu";
  return params;
}

// char_ids [N, L] int64 (L >= 1), char_embedding [V, D], conv_weights[k] [n_k, D, w_k] (w_k <= L),
// conv_biases[k] [n_k] -> [N, sum n_k] (float32 or float64, all the same), on CPU.
at::Tensor char_cnn_cpu(const at::Tensor& char_ids, const at::Tensor& char_embedding, at::TensorList conv_weights,
                        at::TensorList conv_biases, c10::string_view activation) {
  const int64_t out_cols =
      check_char_cnn_cpu_args("char_cnn", char_ids, char_embedding, conv_weights, conv_biases, activation).cols;
  const int64_t n = char_ids.size(0);
  at::Tensor out = at::empty({n, out_cols}, char_embedding.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES(char_embedding.scalar_type(), "char_cnn", [&] {
    std::vector<CharConv<scalar_t>> convs;
    CharCnnParams<scalar_t> params =
        make_params<scalar_t>(char_ids, char_embedding, conv_weights, conv_biases, activation, convs);
    params.out = out.mutable_data_ptr<scalar_t>();
    char_cnn_kernel(params);
  });
  return out;
}

// The gradients of char_cnn from grad_out [N, sum n_k] (the other arguments: the forward's):
// grad_embedding [V, D] (0 in rows no token uses), grad_weights[k] [n_k, D, w_k], grad_biases[k] [n_k].
// Each filter's gradient goes to its argmax window (recomputed here, see slice_grad_impl); the
// histograms then make two small GEMMs per convolution over the U distinct ids:
//   dW_k[f, :, j] = sum_u hist_k[f, j, u] E[used[u], :],  dE[used[u], :] = sum_{k, f, j} hist_k[f, j, u] W_k[f, :, j].
std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> char_cnn_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& char_ids, const at::Tensor& char_embedding,
    at::TensorList conv_weights, at::TensorList conv_biases, c10::string_view activation) {
  static constexpr char kOp[] = "char_cnn_backward";
  const CharCnnDims dims =
      check_char_cnn_cpu_args(kOp, char_ids, char_embedding, conv_weights, conv_biases, activation);
  check_char_cnn_grad(kOp, dims, grad_out, char_ids, char_embedding);
  const int64_t out_cols = dims.cols;
  // Rows are read with unit column stride (an expanded gradient is materialized).
  const at::Tensor grad = (out_cols <= 1 || grad_out.stride(1) == 1) ? grad_out : grad_out.contiguous();
  const auto opts = char_embedding.options().memory_format(at::MemoryFormat::Contiguous);
  const size_t K = conv_weights.size();
  at::Tensor bias_grad = at::zeros({out_cols}, opts);
  std::vector<at::Tensor> hist(K);
  std::vector<int64_t> used;
  AT_DISPATCH_FLOATING_TYPES(char_embedding.scalar_type(), "char_cnn_backward", [&] {
    std::vector<CharConv<scalar_t>> convs;
    const CharCnnParams<scalar_t> params =
        make_params<scalar_t>(char_ids, char_embedding, conv_weights, conv_biases, activation, convs);
    used = char_cnn_histograms(params, grad.const_data_ptr<scalar_t>(), grad.stride(0), hist,
                               bias_grad.mutable_data_ptr<scalar_t>());
  });
  at::Tensor grad_embedding = at::zeros_like(char_embedding, opts);
  std::vector<at::Tensor> grad_weights(K), grad_biases(K);
  if (used.empty()) {  // no tokens
    for (size_t k = 0; k < K; ++k) {
      grad_weights[k] = at::zeros_like(conv_weights[k], opts);
      grad_biases[k] = at::zeros_like(conv_biases[k], opts);
    }
    return {grad_embedding, grad_weights, grad_biases};
  }
  const int64_t U = static_cast<int64_t>(used.size()), D = char_embedding.size(1);
  const at::Tensor used_t = at::tensor(used, at::TensorOptions().dtype(at::kLong));
  const at::Tensor e_used = char_embedding.index_select(0, used_t);  // [U, D]
  at::Tensor grad_e_used = at::zeros({U, D}, opts);
  int64_t col = 0;
  for (size_t k = 0; k < K; ++k) {
    const at::Tensor& w = conv_weights[k];
    const int64_t num = w.size(0), width = w.size(2);
    // [n, w, U] @ [U, D] -> [n, w, D], stored as W's [n, D, w]
    grad_weights[k] = at::matmul(hist[k], e_used).transpose(1, 2).contiguous();
    grad_e_used.addmm_(hist[k].view({num * width, U}).t(), w.transpose(1, 2).reshape({num * width, D}));
    grad_biases[k] = bias_grad.narrow(0, col, num).clone();
    col += num;
  }
  grad_embedding.index_copy_(0, used_t, grad_e_used);
  return {grad_embedding, grad_weights, grad_biases};
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(elmo_fast, CPU, m) {
  m.impl("char_cnn", &elmo_fast::char_cnn_cpu);
  m.impl("char_cnn_backward", &elmo_fast::char_cnn_backward_cpu);
}