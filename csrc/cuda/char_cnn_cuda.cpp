// CUDA bindings of the character CNN and its backward (kernels: char_cnn.cu; oracle:
// reference.char_cnn_ref, under autograd for the backward; CPU twin: csrc/cpu/char_cnn_cpu.cpp).
// Forward, per call: fold the embedding into each convolution's filters (one small kernel, tables in
// the math type), then one kernel for every width, the max over windows and the activation.
// Backward: the same tables and windows again, each column's gradient at its max window; per
// convolution a histogram hist_k[f][j][c] of those gradients by tap and character id (one thread
// per tap and chunk of tokens: deterministic); then GEMMs through ATen:
//   dW_k[f, :, j] = sum_c hist_k[f, j, c] E[c, :],  dE[c, :] = sum_{k, f, j} hist_k[f, j, c] W_k[f, :, j],
//   db_k[f] = sum_t dpre[t, f].
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "char_cnn_args.h"
#include "checks.h"
#include "cuda/backend.h"
#include "cuda/binding_utils.h"
#include "cuda/char_cnn.h"

namespace elmo_fast {
namespace {

// A checked call's kernel parameters and the tensors they point into.
struct CharCnnCall {
  gpu::CharCnnTableParams tp{};
  gpu::CharCnnParams p{};
  std::vector<at::Tensor> weights, biases;  // contiguous copies, alive as long as the call
  at::Tensor ids, embedding, table;
  int64_t cols = 0;                         // F = sum n_k
};

// char_ids: [N, W] int64 (any W >= 1; ELMo: 50); char_embedding: [V, D]; conv_weights: K x [n_k, D, w_k]
// (w_k <= W); conv_biases: K x [n_k]; activation "relu" | "tanh"; float32, float64, bfloat16 or float16
// (math in float32, float64 for float64). All on one CUDA device. Checks them (op name kOp), builds the
// parameters and enqueues the table kernel (the fold) when there are tokens.
CharCnnCall prepare(const char* kOp, const at::Tensor& char_ids, const at::Tensor& char_embedding,
                    at::TensorList conv_weights, at::TensorList conv_biases, c10::string_view activation) {
  const int64_t chars = check_char_ids_length(kOp, char_ids);  // L >= 1, as the CPU op (char_cnn_args.h)
  ELMO_CHECK_DTYPE(char_ids, at::kLong);
  ELMO_CHECK_GPU(char_ids);
  const int64_t n = char_ids.size(0);
  ELMO_CHECK_DIM(char_embedding, 2);
  ELMO_CHECK_SAME_DEVICE(char_embedding, char_ids);
  ELMO_CHECK_CUDA_DTYPE(char_embedding);
  const at::ScalarType dtype = char_embedding.scalar_type();
  const int64_t vocab = char_embedding.size(0);
  const int64_t dim = char_embedding.size(1);
  ELMO_CHECK(vocab <= std::numeric_limits<int32_t>::max(), "char_embedding has ", vocab,
             " rows; at most 2^31 - 1 are supported");
  ELMO_CHECK(activation == "relu" || activation == "tanh", "activation must be \"relu\" or \"tanh\", got \"",
             std::string(activation), "\"");
  ELMO_CHECK(!conv_weights.empty(), "conv_weights must hold at least one convolution, got none");
  ELMO_CHECK(conv_weights.size() == conv_biases.size(), "conv_weights and conv_biases must have the same length, got ",
             conv_weights.size(), " and ", conv_biases.size());
  ELMO_CHECK(conv_weights.size() <= static_cast<size_t>(gpu::kCharCnnMaxConvs), "at most ", gpu::kCharCnnMaxConvs,
             " convolutions are supported on CUDA, got ", conv_weights.size());
  const int num_convs = static_cast<int>(conv_weights.size());

  CharCnnCall call;
  call.weights.resize(num_convs);
  call.biases.resize(num_convs);
  gpu::CharCnnTableParams& tp = call.tp;
  gpu::CharCnnParams& p = call.p;
  int64_t table_size = 0;
  for (int k = 0; k < num_convs; ++k) {
    const at::Tensor& w = conv_weights[k];
    const at::Tensor& b = conv_biases[k];
    ELMO_CHECK(w.dim() == 3, "conv_weights[", k, "] must have 3 dims ([n, D, w]), got shape ", w.sizes());
    ELMO_CHECK(w.size(1) == dim, "conv_weights[", k, "] must have D = ", dim, " (char_embedding's width), got shape ",
               w.sizes());
    check_conv_width(kOp, k, w, char_ids);
    ELMO_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "conv_biases[", k, "] must have shape [", w.size(0),
               "], got ", b.sizes());
    ELMO_CHECK(w.scalar_type() == dtype, "conv_weights[", k, "] must have the dtype of char_embedding (",
               dtype_name(dtype), "), got ", dtype_name(w.scalar_type()));
    ELMO_CHECK(b.scalar_type() == dtype, "conv_biases[", k, "] must have the dtype of char_embedding (",
               dtype_name(dtype), "), got ", dtype_name(b.scalar_type()));
    ELMO_CHECK(w.device() == char_ids.device(), "conv_weights[", k, "] must be on char_ids' device ",
               char_ids.device(), ", got ", w.device());
    ELMO_CHECK(b.device() == char_ids.device(), "conv_biases[", k, "] must be on char_ids' device ",
               char_ids.device(), ", got ", b.device());
    call.weights[k] = w.contiguous();
    call.biases[k] = b.contiguous();
    const int64_t filters = w.size(0);
    const int64_t width = w.size(2);
    tp.weights[k] = call.weights[k].const_data_ptr();
    tp.widths[k] = p.widths[k] = static_cast<int>(width);
    tp.filters[k] = p.filters[k] = static_cast<int>(filters);
    tp.table_offset[k] = p.table_offset[k] = table_size;
    p.col_offset[k] = static_cast<int>(call.cols);
    p.biases[k] = call.biases[k].const_data_ptr();
    table_size += width * vocab * filters;
    call.cols += filters;
    ELMO_CHECK(call.cols <= std::numeric_limits<int32_t>::max(), "too many filters: ", call.cols);
  }
  tp.table_offset[num_convs] = p.table_offset[num_convs] = table_size;
  p.col_offset[num_convs] = static_cast<int>(call.cols);

  call.ids = char_ids.contiguous();
  call.embedding = gpu::with_unit_col_stride(char_embedding);
  call.table = at::empty({table_size}, char_embedding.options().dtype(gpu::math_dtype(dtype)));
  tp.embedding = call.embedding.const_data_ptr();
  tp.embedding_row_stride = call.embedding.stride(0);
  tp.num_convs = num_convs;
  tp.vocab = vocab;
  tp.dim = dim;
  tp.table = call.table.mutable_data_ptr();
  tp.dtype = gpu::to_gpu_dtype(dtype);
  if (n > 0) {  // the table is only read by tokens
    gpu::char_cnn_table_launch(tp, gpu::current_stream());
    ELMO_GPU_LAUNCH_CHECK();
  }

  p.char_ids = call.ids.const_data_ptr<int64_t>();
  p.table = call.table.const_data_ptr();
  p.n = n;
  p.chars = static_cast<int>(chars);
  p.vocab = vocab;
  p.num_convs = num_convs;
  p.tanh_activation = activation == "tanh";
  p.dtype = gpu::to_gpu_dtype(dtype);
  return call;
}

// -> [N, sum n_k] in the weights' dtype. An id outside [0, V) gives its token a row of NaN (checking on
// the host would cost a device sync per call).
at::Tensor char_cnn_cuda(const at::Tensor& char_ids, const at::Tensor& char_embedding, at::TensorList conv_weights,
                         at::TensorList conv_biases, c10::string_view activation) {
  const gpu::DeviceGuard guard(char_ids.device());
  CharCnnCall call = prepare("char_cnn", char_ids, char_embedding, conv_weights, conv_biases, activation);
  at::Tensor out = at::empty({char_ids.size(0), call.cols},
                             char_embedding.options().memory_format(at::MemoryFormat::Contiguous));
  call.p.out = out.mutable_data_ptr();
  gpu::char_cnn_launch(call.p, gpu::current_stream());
  ELMO_GPU_LAUNCH_CHECK();
  return out;
}

// Token chunks of the histogram pass: enough threads to fill the GPU, each chunk's histograms (taps x V
// in the math type) within a budget; their sum is one ATen reduction.
constexpr int64_t kHistChunkTokens = 64;
constexpr int64_t kHistBudgetBytes = int64_t{256} << 20;

// grad_out [N, sum n_k] (any strides; the dtype of the weights); the forward's arguments -> grad_embedding
// [V, D] (0 in rows no token uses), grad_weights K x [n_k, D, w_k], grad_biases K x [n_k]. An id outside
// [0, V) makes the gradients NaN (as the forward's row).
std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> char_cnn_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& char_ids, const at::Tensor& char_embedding,
    at::TensorList conv_weights, at::TensorList conv_biases, c10::string_view activation) {
  static constexpr char kOp[] = "char_cnn_backward";
  const gpu::DeviceGuard guard(char_ids.device());
  CharCnnCall call = prepare(kOp, char_ids, char_embedding, conv_weights, conv_biases, activation);
  const int64_t n = char_ids.size(0), F = call.cols, V = char_embedding.size(0), D = char_embedding.size(1);
  const int K = call.p.num_convs;
  ELMO_CHECK_SHAPE(grad_out, n, F);
  ELMO_CHECK_SAME_DTYPE(grad_out, char_embedding);
  ELMO_CHECK_SAME_DEVICE(grad_out, char_ids);
  const at::ScalarType dtype = char_embedding.scalar_type();
  const at::ScalarType math = gpu::math_dtype(dtype);
  const auto math_opts = char_embedding.options().dtype(math).memory_format(at::MemoryFormat::Contiguous);
  const at::Tensor grad = gpu::with_unit_col_stride(grad_out);  // an expanded gradient is materialized
  const cudaStream_t stream = gpu::current_stream();

  at::Tensor dpre = at::empty({n, F}, math_opts);
  at::Tensor window = at::empty({n, F}, math_opts.dtype(at::kInt));
  call.p.grad = grad.const_data_ptr();
  call.p.grad_row_stride = grad.stride(0);
  call.p.dpre = dpre.mutable_data_ptr();
  call.p.window = window.mutable_data_ptr<int32_t>();
  gpu::char_cnn_argmax_launch(call.p, stream);
  ELMO_GPU_LAUNCH_CHECK();

  gpu::CharCnnHistParams hp{};
  int64_t taps = 0;
  for (int k = 0; k < K; ++k) {
    hp.widths[k] = call.p.widths[k];
    hp.col_offset[k] = call.p.col_offset[k];
    hp.tap_offset[k] = taps;
    taps += static_cast<int64_t>(call.p.filters[k]) * call.p.widths[k];
  }
  hp.col_offset[K] = call.p.col_offset[K];
  hp.tap_offset[K] = taps;
  const int64_t per_chunk = std::max<int64_t>(int64_t{1}, taps * V * static_cast<int64_t>(c10::elementSize(math)));
  const int64_t chunks = std::max<int64_t>(
      1, std::min({(n + kHistChunkTokens - 1) / kHistChunkTokens, kHistBudgetBytes / per_chunk, int64_t{65535}}));
  at::Tensor hist_chunks = at::zeros({chunks, taps * V}, math_opts);
  hp.char_ids = call.ids.const_data_ptr<int64_t>();
  hp.dpre = dpre.const_data_ptr();
  hp.window = window.const_data_ptr<int32_t>();
  hp.hist = hist_chunks.mutable_data_ptr();
  hp.n = n;
  hp.chars = call.p.chars;
  hp.vocab = V;
  hp.num_convs = K;
  hp.chunks = chunks;
  hp.chunk_tokens = (n + chunks - 1) / chunks;
  hp.dtype = math == at::kDouble ? gpu::Dtype::kFloat64 : gpu::Dtype::kFloat32;
  gpu::char_cnn_hist_launch(hp, stream);
  ELMO_GPU_LAUNCH_CHECK();
  const at::Tensor hist = chunks > 1 ? hist_chunks.sum(0) : hist_chunks.select(0, 0);
  const at::Tensor bias_grad = dpre.sum(0);  // [F]

  const at::Tensor emb = call.embedding.to(math);  // [V, D]
  at::Tensor grad_emb = at::zeros({V, D}, math_opts);
  std::vector<at::Tensor> grad_weights(K), grad_biases(K);
  for (int k = 0; k < K; ++k) {
    const int64_t num = call.p.filters[k], width = call.p.widths[k];
    const at::Tensor hist_k = hist.narrow(0, hp.tap_offset[k] * V, num * width * V).view({num * width, V});
    // [n w, V] @ [V, D] -> [n, w, D], stored as W's [n, D, w]
    grad_weights[k] = at::matmul(hist_k, emb).view({num, width, D}).transpose(1, 2).contiguous().to(dtype);
    grad_emb.addmm_(hist_k.t(), call.weights[k].to(math).transpose(1, 2).reshape({num * width, D}));
    grad_biases[k] = bias_grad.narrow(0, call.p.col_offset[k], num).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  return {grad_emb.to(dtype), grad_weights, grad_biases};
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(ELMO_GPU_LIBRARY, ELMO_GPU_DISPATCH_KEY, m) {
  m.impl("char_cnn", &elmo_fast::char_cnn_cuda);
  m.impl("char_cnn_backward", &elmo_fast::char_cnn_backward_cuda);
}
