// CUDA highway gate and its backward: one elementwise pass each, fp32 math for every storage type
// (fp64 for fp64). Each thread takes V consecutive columns of a row, loaded and stored as one 16-byte
// pack (device_utils.cuh) where the shapes and pointers allow it (V = kVec<T>), else one by one (V = 1).
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

// grid: x over H / V column packs in blocks of kThreads, y over rows (strided by gridDim.y).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) highway_gate_kernel(const HighwayGateParams p) {
  using A = math_t<T>;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (j >= p.h) {
    return;
  }
  const T* __restrict__ projected = static_cast<const T*>(p.projected);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.y; i < p.n; i += gridDim.y) {
    const T* row = projected + i * p.projected_row_stride;
    const Pack<T, V> t = load_pack<V>(row + j);
    const Pack<T, V> gate = load_pack<V>(row + p.h + j);
    const Pack<T, V> xv = load_pack<V>(x + i * p.x_row_stride + j);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A g = sigmoid_math(to_math(gate.v[k]));
      o.v[k] = from_math<T>(g * to_math(xv.v[k]) + (A(1) - g) * relu_math(to_math(t.v[k])));
    }
    store_pack<V>(out + i * p.h + j, o);
  }
}

// grid: x over H / V column packs in blocks of kThreads, y over rows (strided by gridDim.y).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) highway_gate_grad_kernel(const HighwayGateGradParams p) {
  using A = math_t<T>;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (j >= p.h) {
    return;
  }
  const T* __restrict__ grad = static_cast<const T*>(p.grad);
  const T* __restrict__ projected = static_cast<const T*>(p.projected);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ grad_projected = static_cast<T*>(p.grad_projected);
  T* __restrict__ grad_x = static_cast<T*>(p.grad_x);
  for (int64_t i = blockIdx.y; i < p.n; i += gridDim.y) {
    const T* row = projected + i * p.projected_row_stride;
    const Pack<T, V> gr = load_pack<V>(grad + i * p.grad_row_stride + j);
    const Pack<T, V> t = load_pack<V>(row + j);
    const Pack<T, V> gate = load_pack<V>(row + p.h + j);
    const Pack<T, V> xv = load_pack<V>(x + i * p.x_row_stride + j);
    Pack<T, V> d_t, d_gate, d_x;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A g_out = to_math(gr.v[k]);
      const A tk = to_math(t.v[k]);
      const A g = sigmoid_math(to_math(gate.v[k]));
      d_t.v[k] = from_math<T>(tk > A(0) ? g_out * (A(1) - g) : A(0));
      d_gate.v[k] = from_math<T>(g_out * (to_math(xv.v[k]) - relu_math(tk)) * g * (A(1) - g));
      d_x.v[k] = from_math<T>(g_out * g);
    }
    store_pack<V>(grad_projected + i * 2 * p.h + j, d_t);
    store_pack<V>(grad_projected + i * 2 * p.h + p.h + j, d_gate);
    store_pack<V>(grad_x + i * p.h + j, d_x);
  }
}

}  // namespace

void highway_gate_launch(const HighwayGateParams& params, cudaStream_t stream) {
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vectorized = vector_ok(kVec<T>, sizeof(T), params.h, {params.projected, params.x, params.out},
                                      {params.projected_row_stride, params.x_row_stride});
    launch_rows_vectorized<kThreads, T>(
        "highway_gate_kernel", [](auto v) { return highway_gate_kernel<T, decltype(v)::value>; }, params, vectorized,
        params.h, params.n, stream);
  });
}

void highway_gate_grad_launch(const HighwayGateGradParams& params, cudaStream_t stream) {
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vectorized = vector_ok(kVec<T>, sizeof(T), params.h,
                                      {params.grad, params.projected, params.x, params.grad_projected, params.grad_x},
                                      {params.grad_row_stride, params.projected_row_stride, params.x_row_stride});
    launch_rows_vectorized<kThreads, T>(
        "highway_gate_grad_kernel", [](auto v) { return highway_gate_grad_kernel<T, decltype(v)::value>; }, params,
        vectorized, params.h, params.n, stream);
  });
}

}  // namespace gpu
}  // namespace elmo_fast
