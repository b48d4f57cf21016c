// CUDA highway gate: one elementwise pass, fp32 math for every storage type (fp64 for fp64).
//
// Included once, by highway.cu (nvcc) or by the CPU emulator of the tests (tests/cuda_emulation, g++),
// which runs these very kernels and launchers on CPU tensors where no GPU is available.
#pragma once

#include "cuda/device_utils.cuh"
#include "cuda/highway.h"

namespace elmo_fast {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// grid: x over H in blocks of kThreads columns, y over rows (strided by gridDim.y).
template <typename T>
__global__ void __launch_bounds__(kThreads) highway_gate_kernel(const HighwayGateParams p) {
  using A = math_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= p.h) {
    return;
  }
  const T* __restrict__ projected = static_cast<const T*>(p.projected);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.y; i < p.n; i += gridDim.y) {
    const T* row = projected + i * p.projected_row_stride;
    const A t = to_math(row[j]);
    const A g = sigmoid_math(to_math(row[p.h + j]));
    const A xv = to_math(x[i * p.x_row_stride + j]);
    out[i * p.h + j] = from_math<T>(g * xv + (A(1) - g) * relu_math(t));
  }
}

}  // namespace

void highway_gate_launch(const HighwayGateParams& params, cudaStream_t stream) {
  if (params.n == 0 || params.h == 0) {
    return;  // a zero-sized grid is a launch error
  }
  const dim3 grid(ceil_div(params.h, kThreads), grid_y(params.n));
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    ELMO_KERNEL_LAUNCH(highway_gate_kernel<T>, grid, kThreads, stream, params);
  });
}

}  // namespace gpu
}  // namespace elmo_fast
