// CUDA binding of the character CNN (kernels: char_cnn.cu; oracle: reference.char_cnn_ref).
// Per call: fold the embedding into each convolution's filters (one small kernel, tables in the
// math type), then one kernel for every width, the max over windows and the activation.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "char_cnn_args.h"
#include "checks.h"
#include "cuda/backend.h"
#include "cuda/binding_utils.h"
#include "cuda/char_cnn.h"

namespace elmo_fast {
namespace {

// char_ids: [N, W] int64 (1 <= W <= 64; ELMo: 50); char_embedding: [V, D]; conv_weights: K x [n_k, D, w_k]
// (w_k <= W); conv_biases: K x [n_k]; activation "relu" | "tanh" -> [N, sum n_k] in the weights' dtype
// (float32, float64, bfloat16, float16; math in float32, float64 for float64). All on one CUDA
// device. An id outside [0, V) gives its token a row of NaN (checking on the host would cost a
// device sync per call).
at::Tensor char_cnn_cuda(const at::Tensor& char_ids, const at::Tensor& char_embedding, at::TensorList conv_weights,
                         at::TensorList conv_biases, c10::string_view activation) {
  static constexpr char kOp[] = "char_cnn";
  const int64_t chars = check_char_ids_length(kOp, char_ids);  // 1 <= L <= 64 (char_cnn_args.h)
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

  const gpu::DeviceGuard guard(char_ids.device());
  std::vector<at::Tensor> weights(num_convs), biases(num_convs);  // keep the contiguous copies alive
  gpu::CharCnnTableParams tp{};
  gpu::CharCnnParams p{};
  int64_t cols = 0;
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
    weights[k] = w.contiguous();
    biases[k] = b.contiguous();
    const int64_t filters = w.size(0);
    const int64_t width = w.size(2);
    tp.weights[k] = weights[k].const_data_ptr();
    tp.widths[k] = p.widths[k] = static_cast<int>(width);
    tp.filters[k] = p.filters[k] = static_cast<int>(filters);
    tp.table_offset[k] = p.table_offset[k] = table_size;
    p.col_offset[k] = static_cast<int>(cols);
    p.biases[k] = biases[k].const_data_ptr();
    table_size += width * vocab * filters;
    cols += filters;
    ELMO_CHECK(cols <= std::numeric_limits<int32_t>::max(), "too many filters: ", cols);
  }
  tp.table_offset[num_convs] = p.table_offset[num_convs] = table_size;
  p.col_offset[num_convs] = static_cast<int>(cols);

  const at::Tensor ids = char_ids.contiguous();
  const at::Tensor embedding = gpu::with_unit_col_stride(char_embedding);
  at::Tensor table = at::empty({table_size}, char_embedding.options().dtype(gpu::math_dtype(dtype)));
  at::Tensor out = at::empty({n, cols}, char_embedding.options().memory_format(at::MemoryFormat::Contiguous));
  const cudaStream_t stream = gpu::current_stream();

  tp.embedding = embedding.const_data_ptr();
  tp.embedding_row_stride = embedding.stride(0);
  tp.num_convs = num_convs;
  tp.vocab = vocab;
  tp.dim = dim;
  tp.table = table.mutable_data_ptr();
  tp.dtype = gpu::to_gpu_dtype(dtype);
  if (n > 0) {  // the table is only read by tokens
    gpu::char_cnn_table_launch(tp, stream);
    ELMO_GPU_LAUNCH_CHECK();
  }

  p.char_ids = ids.const_data_ptr<int64_t>();
  p.table = table.const_data_ptr();
  p.out = out.mutable_data_ptr();
  p.n = n;
  p.chars = static_cast<int>(chars);
  p.vocab = vocab;
  p.num_convs = num_convs;
  p.tanh_activation = activation == "tanh";
  p.dtype = gpu::to_gpu_dtype(dtype);
  gpu::char_cnn_launch(p, stream);
  ELMO_GPU_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(ELMO_GPU_LIBRARY, ELMO_GPU_DISPATCH_KEY, m) {
  m.impl("char_cnn", &elmo_fast::char_cnn_cuda);
}
