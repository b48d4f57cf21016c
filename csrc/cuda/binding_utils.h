// Host-side helpers shared by the CUDA bindings (csrc/cuda/*.cpp): dtype mapping and checks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "checks.h"
#include "cuda/dtype.h"

namespace elmo_fast {
namespace gpu {

inline bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// The kernels' element type for a floating dtype the binding has already checked.
inline Dtype to_gpu_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return Dtype::kFloat32;
    case at::kDouble: return Dtype::kFloat64;
    case at::kBFloat16: return Dtype::kBFloat16;
    case at::kHalf: return Dtype::kFloat16;
    default: TORCH_CHECK(false, "elmo_fast: no CUDA kernel for dtype ", dtype_name(t));
  }
  return Dtype::kFloat32;  // unreachable
}

// float32 cell states etc.: the math type of an element type (float64 keeps float64).
inline at::ScalarType math_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The kernels want unit stride along the last dim and take any row stride; copy otherwise.
inline at::Tensor with_unit_col_stride(const at::Tensor& t) {
  return (t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

}  // namespace gpu
}  // namespace elmo_fast

#define ELMO_CHECK_CUDA_DTYPE(x)                                                                    \
  TORCH_CHECK(::elmo_fast::gpu::is_supported_dtype((x).scalar_type()), kOp, ": ", #x " has dtype ", \
              ::elmo_fast::dtype_name((x).scalar_type()), "; supported on CUDA: float32, float64, bfloat16, float16")
