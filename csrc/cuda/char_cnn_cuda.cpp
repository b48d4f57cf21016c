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
#include <cstdlib>
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
  int64_t cols = 0;  // F = sum n_k
};

// char_ids: [N, W] int64 (any W >= 1; ELMo: 50); char_embedding: [V, D]; conv_weights: K x [n_k, D, w_k]
// (w_k <= W); conv_biases: K x [n_k]; activation "relu" | "tanh"; float32, float64, bfloat16 or float16
// (math in float32, float64 for float64). All on one CUDA device. The CUDA op's own rules first (char_ids
// on a CUDA device: before a device guard is made from it; the dtypes and number of convolutions the
// kernels take), then the CPU op's (char_cnn_args.h).
CharCnnDims check_cuda_args(const char* kOp, const at::Tensor& char_ids, const at::Tensor& char_embedding,
                            at::TensorList conv_weights, at::TensorList conv_biases, c10::string_view activation) {
  ELMO_CHECK_GPU(char_ids);
  ELMO_CHECK_CUDA_DTYPE(char_embedding);
  ELMO_CHECK(conv_weights.size() <= static_cast<size_t>(gpu::kCharCnnMaxConvs), "at most ", gpu::kCharCnnMaxConvs,
             " convolutions are supported on CUDA, got ", conv_weights.size());
  return check_char_cnn_args(kOp, char_ids, char_embedding, conv_weights, conv_biases, activation);
}

// The kernels' parameters of a checked call (under the caller's device guard); enqueues the table kernel
// (the fold) when there are tokens.
CharCnnCall prepare(const CharCnnDims& dims, const at::Tensor& char_ids, const at::Tensor& char_embedding,
                    at::TensorList conv_weights, at::TensorList conv_biases, c10::string_view activation) {
  const at::ScalarType dtype = char_embedding.scalar_type();
  const int64_t n = dims.n, chars = dims.chars, vocab = dims.vocab, dim = dims.dim;
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
  const CharCnnDims dims = check_cuda_args("char_cnn", char_ids, char_embedding, conv_weights, conv_biases, activation);
  const gpu::DeviceGuard guard(char_ids.device());
  CharCnnCall call = prepare(dims, char_ids, char_embedding, conv_weights, conv_biases, activation);
  at::Tensor out =
      at::empty({char_ids.size(0), call.cols}, char_embedding.options().memory_format(at::MemoryFormat::Contiguous));
  call.p.out = out.mutable_data_ptr();
  gpu::char_cnn_launch(call.p, gpu::current_stream());
  ELMO_GPU_LAUNCH_CHECK();
  return out;
}

// The histogram pass's workspace: [chunks, taps x slice] values in the math type, token chunks (enough
// threads to fill the GPU; their sum is one ATen reduction) and a slice of the vocabulary per pass (ids
// [v0, v0 + slice)), both cut so that the workspace stays within the budget: one chunk of all
// taps x V values already takes 0.5 GB for ELMo's filters at V = 10k characters. Several slices walk the
// tokens again, each time for fewer ids.
struct HistPlan {
  int64_t slice;   // vocabulary ids per pass, 1..V
  int64_t chunks;  // token chunks, 1..65535
};

constexpr int64_t kHistChunkTokens = 64;
constexpr int64_t kHistBudgetBytes = int64_t{256} << 20;

// The budget in bytes: 256 MB, or ELMO_FAST_CHAR_CNN_HIST_BYTES (for tests of the slicing).
int64_t hist_budget_bytes() {
  const char* env = std::getenv("ELMO_FAST_CHAR_CNN_HIST_BYTES");
  return env != nullptr ? std::max<int64_t>(1, std::atoll(env)) : kHistBudgetBytes;
}

HistPlan plan_histograms(int64_t n, int64_t taps, int64_t vocab, int64_t elem_bytes, int64_t budget) {
  const int64_t per_id = std::max<int64_t>(1, taps * elem_bytes);  // one chunk's bytes per vocabulary id
  const int64_t slice = std::clamp<int64_t>(budget / per_id, 1, std::max<int64_t>(vocab, 1));
  const int64_t chunks =
      std::clamp<int64_t>(std::min((n + kHistChunkTokens - 1) / kHistChunkTokens, budget / (per_id * slice)), 1, 65535);
  return {slice, chunks};
}

// grad_out [N, sum n_k] (any strides; the dtype of the weights); the forward's arguments -> grad_embedding
// [V, D] (0 in rows no token uses), grad_weights K x [n_k, D, w_k], grad_biases K x [n_k]. An id outside
// [0, V) makes the gradients NaN (as the forward's row).
std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> char_cnn_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& char_ids, const at::Tensor& char_embedding,
    at::TensorList conv_weights, at::TensorList conv_biases, c10::string_view activation) {
  static constexpr char kOp[] = "char_cnn_backward";
  const CharCnnDims dims = check_cuda_args(kOp, char_ids, char_embedding, conv_weights, conv_biases, activation);
  check_char_cnn_grad(kOp, dims, grad_out, char_ids, char_embedding);
  const gpu::DeviceGuard guard(char_ids.device());
  CharCnnCall call = prepare(dims, char_ids, char_embedding, conv_weights, conv_biases, activation);
  const int64_t n = dims.n, F = dims.cols, V = dims.vocab, D = dims.dim;
  const int K = call.p.num_convs;
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
  const HistPlan plan = plan_histograms(n, taps, V, static_cast<int64_t>(c10::elementSize(math)), hist_budget_bytes());
  hp.char_ids = call.ids.const_data_ptr<int64_t>();
  hp.dpre = dpre.const_data_ptr();
  hp.window = window.const_data_ptr<int32_t>();
  hp.n = n;
  hp.chars = call.p.chars;
  hp.num_convs = K;
  hp.chunks = plan.chunks;
  hp.chunk_tokens = (n + plan.chunks - 1) / plan.chunks;
  hp.dtype = math == at::kDouble ? gpu::Dtype::kFloat64 : gpu::Dtype::kFloat32;

  const at::Tensor emb = call.embedding.to(math);  // [V, D]
  at::Tensor grad_emb = at::zeros({V, D}, math_opts);
  std::vector<at::Tensor> grad_w(K);  // [n_k, w_k, D] in the math type, summed over the slices
  for (int k = 0; k < K; ++k) {
    grad_w[k] = at::zeros({call.p.filters[k], call.p.widths[k], D}, math_opts);
  }
  at::Tensor hist_chunks = at::empty({plan.chunks, taps * plan.slice}, math_opts);
  for (int64_t v0 = 0; v0 < V; v0 += plan.slice) {
    const int64_t count = std::min(plan.slice, V - v0);
    at::Tensor chunks = hist_chunks.narrow(1, 0, taps * count);
    chunks.zero_();
    hp.hist = chunks.mutable_data_ptr();
    hp.vocab_begin = v0;
    hp.vocab_count = count;
    gpu::char_cnn_hist_launch(hp, stream);
    ELMO_GPU_LAUNCH_CHECK();
    const at::Tensor hist = plan.chunks > 1 ? chunks.sum(0) : chunks.select(0, 0);
    const at::Tensor emb_slice = emb.narrow(0, v0, count);  // [count, D]
    at::Tensor grad_emb_slice = grad_emb.narrow(0, v0, count);
    for (int k = 0; k < K; ++k) {
      const int64_t num = call.p.filters[k], width = call.p.widths[k];
      const at::Tensor hist_k =
          hist.narrow(0, hp.tap_offset[k] * count, num * width * count).view({num * width, count});
      // [n w, count] @ [count, D] -> [n, w, D]
      grad_w[k].view({num * width, D}).addmm_(hist_k, emb_slice);
      grad_emb_slice.addmm_(hist_k.t(), call.weights[k].to(math).transpose(1, 2).reshape({num * width, D}));
    }
  }
  const at::Tensor bias_grad = dpre.sum(0);  // [F]
  std::vector<at::Tensor> grad_weights(K), grad_biases(K);
  for (int k = 0; k < K; ++k) {
    grad_weights[k] = grad_w[k].transpose(1, 2).contiguous().to(dtype);  // stored as W's [n, D, w]
    grad_biases[k] = bias_grad.narrow(0, call.p.col_offset[k], call.p.filters[k])
                         .to(dtype, /*non_blocking=*/false,
                             /*copy=*/true);
  }
  return {grad_emb.to(dtype), grad_weights, grad_biases};
}

}  // namespace
}  // namespace elmo_fast

ELMO_GPU_REGISTER(m) {
  m.impl("char_cnn", &elmo_fast::char_cnn_cuda);
  m.impl("char_cnn_backward", &elmo_fast::char_cnn_backward_cuda);
}
