// CPU highway: the stack of highway layers and the projection (oracle: reference.highway_ref).
// The GEMMs go through ATen (MKL/oneDNN); each layer's gating is one fused pass (highway_gate):
//   out[N, H] = g * x + (1 - g) * relu(transform),  g = sigmoid(gate),
//   projected[N, 2H] = [transform | gate] = x W^T + b  (oracle: reference.highway_gate_ref).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>

#include "checks.h"
#include "cpu/lstm_common.h"  // linear_nt: the GEMV of few rows
#include "cpu/tuning.h"
#include "cpu/vec_math.h"
#include "highway_args.h"

namespace elmo_fast {
namespace {

// Rows are `*_row_stride` elements apart (a slice of a wider buffer needs no copy); within a row
// elements are contiguous, which the binding guarantees.
template <typename scalar_t>
struct HighwayGateParams {
  const scalar_t* projected;     // [N, 2H]: [transform | gate]
  const scalar_t* x;             // [N, H]
  scalar_t* out;                 // [N, H], contiguous
  int64_t n;                     // N rows
  int64_t h;                     // H features
  int64_t projected_row_stride;  // >= 2H unless N <= 1
  int64_t x_row_stride;          // >= H unless N <= 1
};

template <typename scalar_t>
void highway_gate_rows(const HighwayGateParams<scalar_t>& p, int64_t row_begin, int64_t row_end) {
  // bfloat16 is loaded into fp32, computed there and rounded once on the store.
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t h = p.h;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const scalar_t* C10_RESTRICT transform = p.projected + i * p.projected_row_stride;
    const scalar_t* C10_RESTRICT gate = transform + h;
    const scalar_t* C10_RESTRICT x = p.x + i * p.x_row_stride;
    scalar_t* C10_RESTRICT out = p.out + i * h;
    for (int64_t j = 0; j < h; ++j) {
      const acc_t t = static_cast<acc_t>(transform[j]);
      const acc_t g = acc_t(1) / (acc_t(1) + vec_math::exp(-static_cast<acc_t>(gate[j])));
      const acc_t relu = t < acc_t(0) ? acc_t(0) : t;  // this order keeps NaN, as F.relu does
      out[j] = static_cast<scalar_t>(g * static_cast<acc_t>(x[j]) + (acc_t(1) - g) * relu);
    }
  }
}

template <typename scalar_t>
void highway_gate_kernel(const HighwayGateParams<scalar_t>& p) {
  // At least ATen's GRAIN_SIZE (32768) elements per task: small inputs stay on one thread.
  constexpr int64_t kGrainElements = 32768;
  const int64_t grain_rows = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(p.h, 1));
  at::parallel_for(0, p.n, grain_rows, [&](int64_t begin, int64_t end) { highway_gate_rows(p, begin, end); });
}

// The kernel wants unit stride along the feature dim; any other layout is copied once here.
at::Tensor with_contiguous_rows(const at::Tensor& t) {
  return (t.size(1) <= 1 || t.stride(1) == 1) ? t : t.contiguous();
}

// projected: [N, 2H], x: [N, H] -> [N, H], same dtype (float32, float64, bfloat16), on CPU.
at::Tensor highway_gate_cpu(const at::Tensor& projected, const at::Tensor& x) {
  static constexpr char kOp[] = "highway_gate";
  ELMO_CHECK_CPU(x);
  check_highway_gate_args(projected, x);
  const int64_t n = x.size(0);
  const int64_t h = x.size(1);
  const at::ScalarType dtype = x.scalar_type();
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16, "x has dtype ", dtype_name(dtype),
             "; supported: float32, float64, bfloat16");

  const at::Tensor projected_c = with_contiguous_rows(projected);
  const at::Tensor x_c = with_contiguous_rows(x);
  at::Tensor out = at::empty({n, h}, x.options().memory_format(at::MemoryFormat::Contiguous));

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "highway_gate", [&] {
    HighwayGateParams<scalar_t> params;
    params.projected = projected_c.const_data_ptr<scalar_t>();
    params.x = x_c.const_data_ptr<scalar_t>();
    params.out = out.mutable_data_ptr<scalar_t>();
    params.n = n;
    params.h = h;
    params.projected_row_stride = projected_c.stride(0);
    params.x_row_stride = x_c.stride(0);
    highway_gate_kernel(params);
  });
  return out;
}

// The gate's backward, one fused pass: from grad [N, H] of out = g x + (1 - g) relu(t),
//   grad_transform = grad (1 - g) [t > 0],  grad_gate = grad (x - relu(t)) g (1 - g),  grad_x = grad g.
template <typename scalar_t>
struct HighwayGateGradParams {
  const scalar_t* grad;       // [N, H], rows grad_row_stride apart
  const scalar_t* projected;  // [N, 2H]: [transform | gate], rows projected_row_stride apart
  const scalar_t* x;          // [N, H], rows x_row_stride apart
  scalar_t* grad_projected;   // [N, 2H] out, contiguous
  scalar_t* grad_x;           // [N, H] out, contiguous
  int64_t n;                  // N rows
  int64_t h;                  // H features
  int64_t grad_row_stride;
  int64_t projected_row_stride;
  int64_t x_row_stride;
};

// One row. Restrict parameters, not restrict locals: with the latter GCC still wanted run-time alias
// checks between the six arrays, more than it allows, and did not vectorize.
template <typename scalar_t>
C10_ALWAYS_INLINE void highway_gate_grad_row(const scalar_t* C10_RESTRICT grad, const scalar_t* C10_RESTRICT transform,
                                             const scalar_t* C10_RESTRICT gate, const scalar_t* C10_RESTRICT x,
                                             scalar_t* C10_RESTRICT grad_transform, scalar_t* C10_RESTRICT grad_gate,
                                             scalar_t* C10_RESTRICT grad_x, int64_t h) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t j = 0; j < h; ++j) {
    const acc_t gr = static_cast<acc_t>(grad[j]);
    const acc_t t = static_cast<acc_t>(transform[j]);
    const acc_t g = acc_t(1) / (acc_t(1) + vec_math::exp(-static_cast<acc_t>(gate[j])));
    const acc_t relu = t > acc_t(0) ? t : acc_t(0);
    grad_transform[j] = static_cast<scalar_t>(t > acc_t(0) ? gr * (acc_t(1) - g) : acc_t(0));
    grad_gate[j] = static_cast<scalar_t>(gr * (static_cast<acc_t>(x[j]) - relu) * g * (acc_t(1) - g));
    grad_x[j] = static_cast<scalar_t>(gr * g);
  }
}

template <typename scalar_t>
void highway_gate_grad_rows(const HighwayGateGradParams<scalar_t>& p, int64_t row_begin, int64_t row_end) {
  const int64_t h = p.h;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const scalar_t* transform = p.projected + i * p.projected_row_stride;
    scalar_t* grad_transform = p.grad_projected + i * 2 * h;
    highway_gate_grad_row(p.grad + i * p.grad_row_stride, transform, transform + h, p.x + i * p.x_row_stride,
                          grad_transform, grad_transform + h, p.grad_x + i * h, h);
  }
}

// grad: [N, H], projected: [N, 2H], x: [N, H] (the forward's inputs) -> grad_projected [N, 2H],
// grad_x [N, H]; same dtype (float32, float64, bfloat16), on CPU.
std::tuple<at::Tensor, at::Tensor> highway_gate_backward_cpu(const at::Tensor& grad, const at::Tensor& projected,
                                                             const at::Tensor& x) {
  static constexpr char kOp[] = "highway_gate_backward";
  ELMO_CHECK_CPU(x);
  check_highway_gate_backward_args(grad, projected, x);
  const int64_t n = x.size(0);
  const int64_t h = x.size(1);
  const at::ScalarType dtype = x.scalar_type();
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16, "x has dtype ", dtype_name(dtype),
             "; supported: float32, float64, bfloat16");
  // Expanded gradients (stride 0) and column-major layouts are copied once.
  const at::Tensor grad_c = with_contiguous_rows(grad);
  const at::Tensor projected_c = with_contiguous_rows(projected);
  const at::Tensor x_c = with_contiguous_rows(x);
  const auto opts = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_projected = at::empty({n, 2 * h}, opts);
  at::Tensor grad_x = at::empty({n, h}, opts);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "highway_gate_backward", [&] {
    HighwayGateGradParams<scalar_t> p;
    p.grad = grad_c.const_data_ptr<scalar_t>();
    p.projected = projected_c.const_data_ptr<scalar_t>();
    p.x = x_c.const_data_ptr<scalar_t>();
    p.grad_projected = grad_projected.mutable_data_ptr<scalar_t>();
    p.grad_x = grad_x.mutable_data_ptr<scalar_t>();
    p.n = n;
    p.h = h;
    p.grad_row_stride = grad_c.stride(0);
    p.projected_row_stride = projected_c.stride(0);
    p.x_row_stride = x_c.stride(0);
    constexpr int64_t kGrainElements = 32768;
    at::parallel_for(0, n, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(h, 1)),
                     [&](int64_t begin, int64_t end) { highway_gate_grad_rows(p, begin, end); });
  });
  return {grad_projected, grad_x};
}

// out = x w^T + bias. Few float rows (one sentence's distinct tokens) against large weights take the
// LSTM steps' GEMV, which streams w once where MKL's sgemm reads it several times slower (27 rows,
// 'original': 2 x 33.5 MB of highway weights), up to gemv_max_rows rows (the caller's measured choice;
// None: the default for w's size); the rest ATen's addmm.
void affine_cpu(at::Tensor& out, const at::Tensor& bias, const at::Tensor& x, const at::Tensor& w,
                std::optional<int64_t> gemv_max_rows) {
  static constexpr char kOp[] = "highway";
  const int64_t n = x.size(0);
  const int64_t gemv_rows =
      lstm_cpu::linear_gemv_rows(kOp, gemv_max_rows, w.numel() * static_cast<int64_t>(w.element_size()));
  if (x.scalar_type() == at::kFloat && n > 0 && n <= gemv_rows && w.is_contiguous() && x.stride(1) == 1) {
    lstm_cpu::linear_nt(out, x, lstm_cpu::Weight{w, w.t()}, n);
    out.add_(bias);
  } else {
    at::addmm_out(out, bias, x, w.t());
  }
}

// x: [N, F]; highway_weights: L x [2F, F]; highway_biases: L x [2F]; proj_weight: [P, F];
// proj_bias: [P] -> [N, P]. One [N, 2F] buffer serves every layer's GEMM output.
// gemv_max_rows: for every GEMM; None: each GEMM's default for its weight's size.
at::Tensor highway_cpu(const at::Tensor& x, at::TensorList highway_weights, at::TensorList highway_biases,
                       const at::Tensor& proj_weight, const at::Tensor& proj_bias,
                       std::optional<int64_t> gemv_max_rows) {
  static constexpr char kOp[] = "highway";
  ELMO_CHECK_DIM(x, 2);
  ELMO_CHECK_CPU(x);
  check_highway_args(x, highway_weights, highway_biases, proj_weight, proj_bias);
  const auto affine = [gemv_max_rows](at::Tensor& out, const at::Tensor& bias, const at::Tensor& xs,
                                      const at::Tensor& w) { affine_cpu(out, bias, xs, w, gemv_max_rows); };
  return highway_stack(x, highway_weights, highway_biases, proj_weight, proj_bias, highway_gate_cpu, affine);
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(elmo_fast, CPU, m) {
  m.impl("highway_gate", &elmo_fast::highway_gate_cpu);
  m.impl("highway_gate_backward", &elmo_fast::highway_gate_backward_cpu);
  m.impl("highway", &elmo_fast::highway_cpu);
}
