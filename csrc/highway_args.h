// Argument checks of the `highway_gate`, `highway_gate_backward` and `highway` ops and the host loop of
// `highway`, shared by the CPU and CUDA bindings (each checks x's device type first and the dtypes it
// supports after, and brings its gate kernel).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>

#include "checks.h"

namespace elmo_fast {

// projected: [N, 2H] ([transform | gate]), x: [N, H], of one dtype on one device: the `highway_gate`
// op's arguments.
inline void check_highway_gate_args(const at::Tensor& projected, const at::Tensor& x) {
  static constexpr char kOp[] = "highway_gate";
  ELMO_CHECK_DIM(projected, 2);
  ELMO_CHECK_DIM(x, 2);
  ELMO_CHECK(projected.size(0) == x.size(0), "projected and x must have the same number of rows N, got ",
             projected.size(0), " and ", x.size(0));
  ELMO_CHECK(projected.size(1) == 2 * x.size(1), "projected must have 2 * H = ", 2 * x.size(1),
             " columns ([transform | gate]) for x of shape ", x.sizes(), ", got ", projected.size(1));
  ELMO_CHECK_SAME_DEVICE(projected, x);
  ELMO_CHECK_SAME_DTYPE(projected, x);
}

// grad: [N, H], projected: [N, 2H], x: [N, H], of one dtype on one device: `highway_gate_backward`'s.
inline void check_highway_gate_backward_args(const at::Tensor& grad, const at::Tensor& projected, const at::Tensor& x) {
  static constexpr char kOp[] = "highway_gate_backward";
  ELMO_CHECK_DIM(projected, 2);
  ELMO_CHECK_DIM(x, 2);
  const int64_t n = x.size(0);
  const int64_t h = x.size(1);
  ELMO_CHECK_SHAPE(projected, n, 2 * h);
  ELMO_CHECK_SHAPE(grad, n, h);
  ELMO_CHECK_SAME_DEVICE(projected, x);
  ELMO_CHECK_SAME_DEVICE(grad, x);
  ELMO_CHECK_SAME_DTYPE(projected, x);
  ELMO_CHECK_SAME_DTYPE(grad, x);
}

// x: [N, F]; highway_weights: L x [2F, F]; highway_biases: L x [2F]; proj_weight: [P, F];
// proj_bias: [P]; every tensor of x's dtype and device.
inline void check_highway_args(const at::Tensor& x, at::TensorList highway_weights, at::TensorList highway_biases,
                               const at::Tensor& proj_weight, const at::Tensor& proj_bias) {
  static constexpr char kOp[] = "highway";
  const int64_t f = x.size(1);
  ELMO_CHECK(highway_weights.size() == highway_biases.size(),
             "highway_weights and highway_biases must have the "
             "same length, got ",
             highway_weights.size(), " and ", highway_biases.size());
  for (size_t k = 0; k < highway_weights.size(); ++k) {
    ELMO_CHECK(highway_weights[k].dim() == 2 && highway_weights[k].size(0) == 2 * f && highway_weights[k].size(1) == f,
               "highway_weights[", k, "] must have shape [", 2 * f, ", ", f, "], got ", highway_weights[k].sizes());
    ELMO_CHECK(highway_biases[k].dim() == 1 && highway_biases[k].size(0) == 2 * f, "highway_biases[", k,
               "] must have shape [", 2 * f, "], got ", highway_biases[k].sizes());
    ELMO_CHECK(
        highway_weights[k].scalar_type() == x.scalar_type() && highway_biases[k].scalar_type() == x.scalar_type(),
        "highway_weights[", k, "] and highway_biases[", k, "] must have x's dtype ", dtype_name(x.scalar_type()));
    ELMO_CHECK(highway_weights[k].device() == x.device() && highway_biases[k].device() == x.device(),
               "highway_weights[", k, "] and highway_biases[", k, "] must be on x's device ", x.device());
  }
  ELMO_CHECK_DIM(proj_weight, 2);
  ELMO_CHECK(proj_weight.size(1) == f, "proj_weight must have shape [P, ", f, "], got ", proj_weight.sizes());
  ELMO_CHECK(proj_bias.dim() == 1 && proj_bias.size(0) == proj_weight.size(0), "proj_bias must have shape [",
             proj_weight.size(0), "], got ", proj_bias.sizes());
  ELMO_CHECK_SAME_DTYPE(proj_weight, x);
  ELMO_CHECK_SAME_DTYPE(proj_bias, x);
  ELMO_CHECK_SAME_DEVICE(proj_weight, x);
  ELMO_CHECK_SAME_DEVICE(proj_bias, x);
}

// The highway stack then the projection: per layer one GEMM into [transform | gate] and the
// backend's fused gate pass, gate(projected [N, 2F], x [N, F]) -> [N, F]; arguments as above. The
// GEMMs: affine(out, bias, x, w) writes x w^T + b into out (default: ATen's addmm).
template <typename Gate, typename Affine>
at::Tensor highway_stack(const at::Tensor& x, at::TensorList highway_weights, at::TensorList highway_biases,
                         const at::Tensor& proj_weight, const at::Tensor& proj_bias, Gate&& gate, Affine&& affine) {
  at::Tensor cur = x;
  at::Tensor projected;
  if (!highway_weights.empty()) {
    projected = at::empty({x.size(0), 2 * x.size(1)}, x.options().memory_format(at::MemoryFormat::Contiguous));
  }
  for (size_t k = 0; k < highway_weights.size(); ++k) {
    affine(projected, highway_biases[k], cur, highway_weights[k]);
    cur = gate(projected, cur);
  }
  at::Tensor out = at::empty({x.size(0), proj_weight.size(0)}, x.options().memory_format(at::MemoryFormat::Contiguous));
  affine(out, proj_bias, cur, proj_weight);
  return out;
}

template <typename Gate>
at::Tensor highway_stack(const at::Tensor& x, at::TensorList highway_weights, at::TensorList highway_biases,
                         const at::Tensor& proj_weight, const at::Tensor& proj_bias, Gate&& gate) {
  return highway_stack(x, highway_weights, highway_biases, proj_weight, proj_bias, gate,
                       [](at::Tensor& out, const at::Tensor& bias, const at::Tensor& in, const at::Tensor& w) {
                         at::addmm_out(out, bias, in, w.t());
                       });
}

}  // namespace elmo_fast
