// CUDA highway gate (oracle: elmo_fast.bilm.reference.highway_gate_ref):
//   out[N, H] = g * x + (1 - g) * relu(transform),  g = sigmoid(gate),  projected = [transform | gate].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dtype.h"

namespace elmo_fast {
namespace gpu {

// Rows may be a slice of a wider buffer (row strides in elements); within a row elements are
// contiguous, which the binding guarantees. All three tensors have element type `dtype`.
struct HighwayGateParams {
  const void* projected;         // [N, 2H]: [transform | gate]
  const void* x;                 // [N, H]
  void* out;                     // [N, H], contiguous
  int64_t n;                     // N rows
  int64_t h;                     // H features
  int64_t projected_row_stride;  // elements between rows of projected
  int64_t x_row_stride;          // elements between rows of x
  Dtype dtype;
};

// The gate's backward (oracle: autograd of highway_gate_ref; CPU twin: csrc/cpu/highway_cpu.cpp):
//   grad_transform = grad (1 - g) [t > 0],  grad_gate = grad (x - relu(t)) g (1 - g),  grad_x = grad g.
struct HighwayGateGradParams {
  const void* grad;              // [N, H]
  const void* projected;         // [N, 2H]: [transform | gate]
  const void* x;                 // [N, H]
  void* grad_projected;          // [N, 2H] out, contiguous
  void* grad_x;                  // [N, H] out, contiguous
  int64_t n;                     // N rows
  int64_t h;                     // H features
  int64_t grad_row_stride;       // elements between rows of grad
  int64_t projected_row_stride;  // elements between rows of projected
  int64_t x_row_stride;          // elements between rows of x
  Dtype dtype;
};

// Enqueue on `stream`; nothing when N or H is 0. The caller checks the launch.
void highway_gate_launch(const HighwayGateParams& params, cudaStream_t stream);
void highway_gate_grad_launch(const HighwayGateGradParams& params, cudaStream_t stream);

}  // namespace gpu
}  // namespace elmo_fast
