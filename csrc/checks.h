// Argument checks for op bindings. Every message starts with the op name and names the argument,
// so a user reading a Python traceback knows which tensor to fix:
//   "highway_gate: x must have 2 dims, got 3"
//   "highway_gate: projected expected shape [4, 32], got [4, 30]"
//
// Usage: a binding declares its op name once, then checks its arguments:
//   static constexpr char kOp[] = "highway_gate";
//   ELMO_CHECK_DIM(x, 2);
//   ELMO_CHECK_SHAPE(projected, n, 2 * h);
//
// Plain TORCH_CHECK underneath (a c10::Error, RuntimeError in Python); usable from .cpp and .cu.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <initializer_list>

namespace elmo_fast {

// Python-style dtype names ("float32"), as users spell them, rather than c10's "Float".
inline const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

}  // namespace elmo_fast

// Generic check with the op-name prefix: ELMO_CHECK(cond, "x must ...", value, ...).
#define ELMO_CHECK(cond, ...) TORCH_CHECK((cond), kOp, ": ", __VA_ARGS__)

#define ELMO_CHECK_DIM(x, n) TORCH_CHECK((x).dim() == (n), kOp, ": ", #x " must have ", (n), " dims, got ", (x).dim())

// The expected sizes are int64_t expressions: ELMO_CHECK_SHAPE(projected, n, 2 * h).
#define ELMO_CHECK_SHAPE(x, ...)                                                                             \
  TORCH_CHECK((x).sizes() == at::IntArrayRef(std::initializer_list<int64_t>{__VA_ARGS__}), kOp, ": ",        \
              #x " expected shape ", at::IntArrayRef(std::initializer_list<int64_t>{__VA_ARGS__}), ", got ", \
              (x).sizes())

#define ELMO_CHECK_DTYPE(x, dtype)                                                                             \
  TORCH_CHECK((x).scalar_type() == (dtype), kOp, ": ", #x " must have dtype ", ::elmo_fast::dtype_name(dtype), \
              ", got ", ::elmo_fast::dtype_name((x).scalar_type()))

#define ELMO_CHECK_SAME_DTYPE(x, y)                                                                               \
  TORCH_CHECK((x).scalar_type() == (y).scalar_type(), kOp, ": ", #x " and " #y " must have the same dtype, got ", \
              ::elmo_fast::dtype_name((x).scalar_type()), " and ", ::elmo_fast::dtype_name((y).scalar_type()))

#define ELMO_CHECK_SAME_DEVICE(x, y)                                                                      \
  TORCH_CHECK((x).device() == (y).device(), kOp, ": ", #x " and " #y " must be on the same device, got ", \
              (x).device(), " and ", (y).device())

#define ELMO_CHECK_CPU(x) TORCH_CHECK((x).device().is_cpu(), kOp, ": ", #x " must be a CPU tensor, got ", (x).device())

#define ELMO_CHECK_CUDA(x) \
  TORCH_CHECK((x).device().is_cuda(), kOp, ": ", #x " must be a CUDA tensor, got ", (x).device())

#define ELMO_CHECK_CONTIGUOUS(x) \
  TORCH_CHECK((x).is_contiguous(), kOp, ": ", #x " must be contiguous, got strides ", (x).strides())
