// CUDA biLSTM step kernels: the two fused pointwise passes of one time step, both directions.
// Elementwise and memory-bound: the GEMMs between them are cuBLAS (through ATen, lstm_cuda.cpp). Each
// thread takes V consecutive columns, loaded and stored as 16-byte packs (V = kVec<T>: 8 bf16 / fp16,
// 4 fp32, 2 fp64) where the widths and pointers allow, else one by one (V = 1).
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

// grid: x over C / V column packs in blocks of kThreads, y over the 2 n (direction, row) pairs (strided
// by gridDim.y). V consecutive columns per thread, as 16-byte packs where shapes and pointers allow.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) lstm_gates_kernel(const LstmGatesParams p) {
  using A = math_t<T>;
  const int64_t C = p.cell;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
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
    const Pack<T, V> xi = load_pack<V>(xin + col), xf = load_pack<V>(xin + C + col),
                     xgg = load_pack<V>(xin + 2 * C + col), xo = load_pack<V>(xin + 3 * C + col);
    const Pack<T, V> ri = load_pack<V>(rec + col), rf = load_pack<V>(rec + C + col),
                     rg = load_pack<V>(rec + 2 * C + col), ro = load_pack<V>(rec + 3 * C + col);
    A* c = c_all + (d * p.batch + i) * C + col;
    Pack<A, V> cs = load_pack<V>(c);
    Pack<T, V> m;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A gi = to_math(xi.v[k]) + to_math(ri.v[k]);
      const A gf = to_math(xf.v[k]) + to_math(rf.v[k]);
      const A gg = to_math(xgg.v[k]) + to_math(rg.v[k]);
      const A go = to_math(xo.v[k]) + to_math(ro.v[k]);
      A cn = sigmoid_math(gi) * tanh_math(gg) + sigmoid_math(gf) * cs.v[k];
      if (p.cell_clip > 0) {
        cn = clamp_math(cn, -clip, clip);
      }
      cs.v[k] = cn;
      m.v[k] = from_math<T>(sigmoid_math(go) * tanh_math(cn));
    }
    store_pack<V>(c, cs);
    store_pack<V>(m_all + r * C + col, m);
  }
}

// grid: x over P / V column packs in blocks of kThreads, y over the 2 n (direction, row) pairs.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) lstm_output_kernel(const LstmOutputParams p) {
  using A = math_t<T>;
  const int64_t P = p.proj;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
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
    const Pack<T, V> hp = load_pack<V>(hproj + r * P + col);
    Pack<T, V> h, y;
    if (p.skip) {
      y = load_pack<V>(y_all + packed * P + col);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A v = to_math(hp.v[k]);
      if (p.proj_clip > 0) {
        v = clamp_math(v, -clip, clip);
      }
      // The state and the output are the value as stored (rounded once), as the reference keeps it.
      h.v[k] = from_math<T>(v);
      y.v[k] = p.skip ? from_math<T>(to_math(h.v[k]) + to_math(y.v[k])) : h.v[k];
    }
    store_pack<V>(h_all + (d * p.batch + i) * P + col, h);
    if (p.write_y) {
      store_pack<V>(y_all + packed * P + col, y);
    }
    store_pack<V>(out + p.out_row[packed] * 2 * P + d * P + col, y);
  }
}

}  // namespace

void lstm_gates_launch(const LstmGatesParams& params, cudaStream_t stream) {
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = math_t<T>;
    // Rows of xg and rec are 4C apart, of c and m C apart: C % V covers every row start.
    const bool vectorized = vector_ok(kVec<T>, sizeof(T), params.cell, {params.xg, params.rec, params.m}, {}) &&
                            vector_ok(kVec<T>, sizeof(A), params.cell, {params.c}, {});
    launch_rows_vectorized<kThreads, T>(
        "lstm_gates_kernel", [](auto v) { return lstm_gates_kernel<T, decltype(v)::value>; }, params, vectorized,
        params.cell, 2 * params.n, stream);
  });
}

void lstm_output_launch(const LstmOutputParams& params, cudaStream_t stream) {
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Rows are P apart (out: 2P, and each direction's half at P): P % V covers every row start.
    const bool vectorized =
        vector_ok(kVec<T>, sizeof(T), params.proj, {params.hproj, params.h, params.y, params.out}, {});
    launch_rows_vectorized<kThreads, T>(
        "lstm_output_kernel", [](auto v) { return lstm_output_kernel<T, decltype(v)::value>; }, params, vectorized,
        params.proj, 2 * params.n, stream);
  });
}

}  // namespace gpu
}  // namespace elmo_fast
