// CUDA highway gate (oracle: elmo_fast.reference.highway_gate_ref):
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

// Enqueues the gate on `stream`; nothing when N or H is 0. The caller checks the launch.
void highway_gate_launch(const HighwayGateParams& params, cudaStream_t stream);

}  // namespace gpu
}  // namespace elmo_fast
