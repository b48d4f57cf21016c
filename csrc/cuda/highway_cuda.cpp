// CUDA highway: the stack of highway layers and the projection (oracle: reference.highway_ref).
// The GEMMs are ATen's (cuBLAS through the dispatcher, on the current stream, honouring
// torch.backends.cuda.matmul.allow_tf32); each layer's gating is one fused kernel (highway.cu).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "cuda/backend.h"
#include "cuda/binding_utils.h"
#include "cuda/highway.h"
#include "highway_args.h"

namespace elmo_fast {
namespace {

// projected: [N, 2H], x: [N, H] -> [N, H] contiguous, same dtype (float32, float64, bfloat16,
// float16), on one CUDA device.
at::Tensor highway_gate_cuda(const at::Tensor& projected, const at::Tensor& x) {
  static constexpr char kOp[] = "highway_gate";
  ELMO_CHECK_GPU(x);
  check_highway_gate_args(projected, x);
  ELMO_CHECK_CUDA_DTYPE(x);
  const int64_t n = x.size(0);
  const int64_t h = x.size(1);

  const gpu::DeviceGuard guard(x.device());
  const at::Tensor projected_c = gpu::with_unit_col_stride(projected);
  const at::Tensor x_c = gpu::with_unit_col_stride(x);
  at::Tensor out = at::empty({n, h}, x.options().memory_format(at::MemoryFormat::Contiguous));

  gpu::HighwayGateParams params;
  params.projected = projected_c.const_data_ptr();
  params.x = x_c.const_data_ptr();
  params.out = out.mutable_data_ptr();
  params.n = n;
  params.h = h;
  params.projected_row_stride = projected_c.stride(0);
  params.x_row_stride = x_c.stride(0);
  params.dtype = gpu::to_gpu_dtype(x.scalar_type());
  gpu::highway_gate_launch(params, gpu::current_stream());
  ELMO_GPU_LAUNCH_CHECK();
  return out;
}

// grad: [N, H], projected: [N, 2H], x: [N, H] (rows may be slices of wider buffers) -> grad_projected
// [N, 2H], grad_x [N, H], contiguous; one dtype (float32, float64, bfloat16, float16), one CUDA device.
std::tuple<at::Tensor, at::Tensor> highway_gate_backward_cuda(const at::Tensor& grad, const at::Tensor& projected,
                                                              const at::Tensor& x) {
  static constexpr char kOp[] = "highway_gate_backward";
  ELMO_CHECK_GPU(x);
  check_highway_gate_backward_args(grad, projected, x);
  ELMO_CHECK_CUDA_DTYPE(x);
  const int64_t n = x.size(0);
  const int64_t h = x.size(1);

  const gpu::DeviceGuard guard(x.device());
  // Expanded gradients (stride 0) and column-major layouts are copied once.
  const at::Tensor grad_c = gpu::with_unit_col_stride(grad);
  const at::Tensor projected_c = gpu::with_unit_col_stride(projected);
  const at::Tensor x_c = gpu::with_unit_col_stride(x);
  const auto opts = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_projected = at::empty({n, 2 * h}, opts);
  at::Tensor grad_x = at::empty({n, h}, opts);

  gpu::HighwayGateGradParams params;
  params.grad = grad_c.const_data_ptr();
  params.projected = projected_c.const_data_ptr();
  params.x = x_c.const_data_ptr();
  params.grad_projected = grad_projected.mutable_data_ptr();
  params.grad_x = grad_x.mutable_data_ptr();
  params.n = n;
  params.h = h;
  params.grad_row_stride = grad_c.stride(0);
  params.projected_row_stride = projected_c.stride(0);
  params.x_row_stride = x_c.stride(0);
  params.dtype = gpu::to_gpu_dtype(x.scalar_type());
  gpu::highway_gate_grad_launch(params, gpu::current_stream());
  ELMO_GPU_LAUNCH_CHECK();
  return {grad_projected, grad_x};
}

// x: [N, F]; highway_weights: L x [2F, F]; highway_biases: L x [2F]; proj_weight: [P, F];
// proj_bias: [P] (gemv_max_rows: the CPU op's, ignored) -> [N, P]. One [N, 2F] buffer serves every
// layer's GEMM output.
at::Tensor highway_cuda(const at::Tensor& x, at::TensorList highway_weights, at::TensorList highway_biases,
                        const at::Tensor& proj_weight, const at::Tensor& proj_bias,
                        std::optional<int64_t> /*gemv_max_rows: the CPU op's*/) {
  static constexpr char kOp[] = "highway";
  ELMO_CHECK_DIM(x, 2);
  ELMO_CHECK_GPU(x);
  ELMO_CHECK_CUDA_DTYPE(x);
  check_highway_args(x, highway_weights, highway_biases, proj_weight, proj_bias);

  const gpu::DeviceGuard guard(x.device());
  return highway_stack(x, highway_weights, highway_biases, proj_weight, proj_bias, highway_gate_cuda);
}

}  // namespace
}  // namespace elmo_fast

ELMO_GPU_REGISTER(m) {
  m.impl("highway_gate", &elmo_fast::highway_gate_cuda);
  m.impl("highway_gate_backward", &elmo_fast::highway_gate_backward_cuda);
  m.impl("highway", &elmo_fast::highway_cuda);
}
