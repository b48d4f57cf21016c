// CUDA biLSTM step kernels: the two fused pointwise passes of one time step, both directions.
// Elementwise and memory-bound: the GEMMs between them are cuBLAS (through ATen, lstm_cuda.cpp).
//
// Included once, by lstm.cu (nvcc) or by the CPU emulator of the tests (tests/cuda_emulation, g++),
// which runs these very kernels and launchers on CPU tensors where no GPU is available.
#pragma once

#include "cuda/device_utils.cuh"
#include "cuda/lstm.h"

namespace elmo_fast {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// grid: x over C in blocks of kThreads, y over the 2 n (direction, row) pairs (strided by gridDim.y).
template <typename T>
__global__ void __launch_bounds__(kThreads) lstm_gates_kernel(const LstmGatesParams p) {
  using A = math_t<T>;
  const int64_t C = p.cell;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= C) {
    return;
  }
  const T* __restrict__ xg = static_cast<const T*>(p.xg);
  const T* __restrict__ rec_all = static_cast<const T*>(p.rec);
  A* __restrict__ c_all = static_cast<A*>(p.c);
  T* __restrict__ m_all = static_cast<T*>(p.m);
  const A clip = static_cast<A>(p.cell_clip);
  for (int64_t r = blockIdx.y; r < 2 * p.n; r += gridDim.y) {
    const int64_t d = r >= p.n ? 1 : 0;
    const int64_t i = r - d * p.n;
    const int64_t packed = d * p.total + p.offset + i;
    const T* xin = p.xg0_row != nullptr ? xg + (p.xg0_row[packed] * 2 + d) * 4 * C : xg + packed * 4 * C;
    const T* rec = rec_all + r * 4 * C;
    const A gi = to_math(xin[col]) + to_math(rec[col]);
    const A gf = to_math(xin[C + col]) + to_math(rec[C + col]);
    const A gg = to_math(xin[2 * C + col]) + to_math(rec[2 * C + col]);
    const A go = to_math(xin[3 * C + col]) + to_math(rec[3 * C + col]);
    A* c = c_all + (d * p.batch + i) * C + col;
    A cn = sigmoid_math(gi) * tanh_math(gg) + sigmoid_math(gf) * *c;
    if (p.cell_clip > 0) {
      cn = clamp_math(cn, -clip, clip);
    }
    *c = cn;
    m_all[r * C + col] = from_math<T>(sigmoid_math(go) * tanh_math(cn));
  }
}

// grid: x over P in blocks of kThreads, y over the 2 n (direction, row) pairs (strided by gridDim.y).
template <typename T>
__global__ void __launch_bounds__(kThreads) lstm_output_kernel(const LstmOutputParams p) {
  using A = math_t<T>;
  const int64_t P = p.proj;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= P) {
    return;
  }
  const T* __restrict__ hproj = static_cast<const T*>(p.hproj);
  T* __restrict__ h_all = static_cast<T*>(p.h);
  T* __restrict__ y_all = static_cast<T*>(p.y);
  T* __restrict__ out = static_cast<T*>(p.out);
  const A clip = static_cast<A>(p.proj_clip);
  for (int64_t r = blockIdx.y; r < 2 * p.n; r += gridDim.y) {
    const int64_t d = r >= p.n ? 1 : 0;
    const int64_t i = r - d * p.n;
    const int64_t packed = d * p.total + p.offset + i;
    A v = to_math(hproj[r * P + col]);
    if (p.proj_clip > 0) {
      v = clamp_math(v, -clip, clip);
    }
    // The state and the output are the value as stored (rounded once), as the reference keeps it.
    const T h = from_math<T>(v);
    h_all[(d * p.batch + i) * P + col] = h;
    T y = h;
    if (p.skip) {
      y = from_math<T>(to_math(h) + to_math(y_all[packed * P + col]));
    }
    if (p.write_y) {
      y_all[packed * P + col] = y;
    }
    out[p.out_row[packed] * 2 * P + d * P + col] = y;
  }
}

}  // namespace

void lstm_gates_launch(const LstmGatesParams& params, cudaStream_t stream) {
  if (params.n == 0 || params.cell == 0) {
    return;
  }
  const dim3 grid(ceil_div(params.cell, kThreads), grid_y(2 * params.n));
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    ELMO_KERNEL_LAUNCH(lstm_gates_kernel<T>, grid, kThreads, stream, params);
  });
}

void lstm_output_launch(const LstmOutputParams& params, cudaStream_t stream) {
  if (params.n == 0 || params.proj == 0) {
    return;
  }
  const dim3 grid(ceil_div(params.proj, kThreads), grid_y(2 * params.n));
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    ELMO_KERNEL_LAUNCH(lstm_output_kernel<T>, grid, kThreads, stream, params);
  });
}

}  // namespace gpu
}  // namespace elmo_fast
