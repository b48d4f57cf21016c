// CUDA kernels of the trainable LSTM layer (see lstm_layer.h for the math and the layout): four
// elementwise passes per step, both directions in each launch. The GEMMs between them are cuBLAS
// through ATen (lstm_layer_cuda.cpp).
//
// Included once, by lstm_layer.cu (nvcc) or by the CPU emulator of the tests (tests/cuda_emulation,
// g++), which runs these very kernels and launchers on CPU tensors where no GPU is available.
#pragma once

#include "cuda/device_utils.cuh"
#include "cuda/lstm_layer.h"

namespace elmo_fast {
namespace gpu {
namespace {

constexpr int kLayerThreads = 256;

// Calls f(T{}) for the training kernels' element types (float32, float64: the op's dtypes).
template <typename F>
void dispatch_float_double(Dtype dtype, F&& f) {
  if (dtype == Dtype::kFloat64) {
    f(double{});
  } else {
    f(float{});
  }
}

// |x| <= clip, as the CPU twin (NaN: false).
template <typename A>
__device__ __forceinline__ bool within(A x, A clip) {
  return (x < A(0) ? -x : x) <= clip;
}

// grid: x over C in blocks of kLayerThreads, y over the 2 n (direction, row) pairs (strided by gridDim.y).
template <typename T>
__global__ void __launch_bounds__(kLayerThreads) lstm_cell_save_kernel(const LstmCellSaveParams p) {
  const int64_t C = p.cell;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLayerThreads + threadIdx.x;
  if (col >= C) {
    return;
  }
  const LstmSavedLayout lay = lstm_saved_layout(p.total, C, p.proj);
  const T* __restrict__ xg_all = static_cast<const T*>(p.xg);
  T* __restrict__ saved = static_cast<T*>(p.saved);
  T* __restrict__ c_all = static_cast<T*>(p.c);
  const T clip = static_cast<T>(p.cell_clip);
  for (int64_t r = blockIdx.y; r < 2 * p.n; r += gridDim.y) {
    const int64_t d = r >= p.n ? 1 : 0;
    const int64_t i = r - d * p.n;
    const int64_t packed = p.offset + i;  // within direction d
    const T* xin = xg_all + (d * p.rows + p.xg_row[d * p.total + packed]) * 4 * C;
    T* base = saved + d * lay.direction;
    T* act = base + lay.act + packed * 4 * C;
    const T gi = sigmoid_math(xin[col] + act[col]);
    const T gf = sigmoid_math(xin[C + col] + act[C + col]);
    const T gg = tanh_math(xin[2 * C + col] + act[2 * C + col]);
    const T go = sigmoid_math(xin[3 * C + col] + act[3 * C + col]);
    act[col] = gi;
    act[C + col] = gf;
    act[2 * C + col] = gg;
    act[3 * C + col] = go;
    T* c = c_all + (d * p.batch + i) * C + col;
    const T raw = gi * gg + gf * *c;
    base[lay.c_raw + packed * C + col] = raw;
    const T clipped = clamp_math(raw, -clip, clip);
    *c = clipped;
    base[lay.m + packed * C + col] = go * tanh_math(clipped);
  }
}

// grid: x over P in blocks of kLayerThreads, y over the 2 n pairs.
template <typename T>
__global__ void __launch_bounds__(kLayerThreads) lstm_proj_save_kernel(const LstmProjSaveParams p) {
  const int64_t P = p.proj;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLayerThreads + threadIdx.x;
  if (col >= P) {
    return;
  }
  const LstmSavedLayout lay = lstm_saved_layout(p.total, p.cell, P);
  const T* __restrict__ saved = static_cast<const T*>(p.saved);
  T* __restrict__ h = static_cast<T*>(p.h);
  T* __restrict__ y = static_cast<T*>(p.y);
  const T clip = static_cast<T>(p.proj_clip);
  for (int64_t r = blockIdx.y; r < 2 * p.n; r += gridDim.y) {
    const int64_t d = r >= p.n ? 1 : 0;
    const int64_t packed = p.offset + r - d * p.n;
    const T v = clamp_math(saved[d * lay.direction + lay.p_raw + packed * P + col], -clip, clip);
    h[(d * p.total + packed) * P + col] = v;
    y[p.y_offset[d * p.total + packed] + col] = v;
  }
}

// grid: x over P in blocks of kLayerThreads, y over the 2 n pairs.
template <typename T>
__global__ void __launch_bounds__(kLayerThreads) lstm_proj_grad_kernel(const LstmProjGradParams p) {
  const int64_t P = p.proj;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLayerThreads + threadIdx.x;
  if (col >= P) {
    return;
  }
  const LstmSavedLayout lay = lstm_saved_layout(p.total, p.cell, P);
  const T* __restrict__ saved = static_cast<const T*>(p.saved);
  const T* __restrict__ dh = static_cast<const T*>(p.dh);
  const T* __restrict__ grad_y = static_cast<const T*>(p.grad_y);
  T* __restrict__ dp = static_cast<T*>(p.dp);
  const T clip = static_cast<T>(p.proj_clip);
  for (int64_t r = blockIdx.y; r < 2 * p.n; r += gridDim.y) {
    const int64_t d = r >= p.n ? 1 : 0;
    const int64_t i = r - d * p.n;
    const int64_t packed = p.offset + i;
    T g = dh[(d * p.batch + i) * P + col];
    if (grad_y != nullptr) {
      g += grad_y[p.grad_y_offset[d * p.total + packed] + col];
    }
    const T raw = saved[d * lay.direction + lay.p_raw + packed * P + col];
    dp[(d * p.total + packed) * P + col] = within(raw, clip) ? g : T(0);
  }
}

// grid: x over C in blocks of kLayerThreads, y over the 2 n pairs.
template <typename T>
__global__ void __launch_bounds__(kLayerThreads) lstm_cell_grad_kernel(const LstmCellGradParams p) {
  const int64_t C = p.cell;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLayerThreads + threadIdx.x;
  if (col >= C) {
    return;
  }
  const LstmSavedLayout lay = lstm_saved_layout(p.total, C, p.proj);
  const T* __restrict__ saved = static_cast<const T*>(p.saved);
  const T* __restrict__ c0 = static_cast<const T*>(p.c0);
  const T* __restrict__ dm_all = static_cast<const T*>(p.dm);
  T* __restrict__ dc_all = static_cast<T*>(p.dc);
  T* __restrict__ dgates = static_cast<T*>(p.dgates);
  const T clip = static_cast<T>(p.cell_clip);
  for (int64_t r = blockIdx.y; r < 2 * p.n; r += gridDim.y) {
    const int64_t d = r >= p.n ? 1 : 0;
    const int64_t i = r - d * p.n;
    const int64_t packed = p.offset + i;
    const T* base = saved + d * lay.direction;
    const T* act = base + lay.act + packed * 4 * C;
    const T gi = act[col], gf = act[C + col], gg = act[2 * C + col], go = act[3 * C + col];
    const T raw = base[lay.c_raw + packed * C + col];
    const T tc = tanh_math(clamp_math(raw, -clip, clip));
    // c_prev: the previous step's cell (clipped, as the state was), or the initial cell as given.
    const T cp = p.prev_offset >= 0 ? clamp_math(base[lay.c_raw + (p.prev_offset + i) * C + col], -clip, clip)
                                    : c0[(d * p.batch + i) * C + col];
    const T dmk = dm_all[r * C + col];
    T* dc = dc_all + (d * p.batch + i) * C + col;
    const T dzo = dmk * tc * go * (T(1) - go);
    const T dct = *dc + dmk * go * (T(1) - tc * tc);
    const T dcr = within(raw, clip) ? dct : T(0);
    const T dzi = dcr * gg * gi * (T(1) - gi);
    const T dzf = dcr * cp * gf * (T(1) - gf);
    const T dzg = dcr * gi * (T(1) - gg * gg);
    *dc = dcr * gf;
    T* dg = dgates + (d * p.total + packed) * 4 * C;
    dg[col] = dzi;
    dg[C + col] = dzf;
    dg[2 * C + col] = dzg;
    dg[3 * C + col] = dzo;
  }
}

}  // namespace

// The launchers: one pass over the 2 n (direction, row) pairs of a step, `width` columns each, in the
// op's dtype; `kernels` maps the element type's tag to kernel<T>.
template <typename Params, typename Kernels>
void launch_layer_pass(const char* name, Kernels kernels, const Params& params, int64_t width, cudaStream_t stream) {
  dispatch_float_double(params.dtype, [&](auto tag) {
    launch_rows<kLayerThreads>(name, kernels(tag), params, width, 2 * params.n, stream);
  });
}

void lstm_cell_save_launch(const LstmCellSaveParams& params, cudaStream_t stream) {
  launch_layer_pass(
      "lstm_cell_save_kernel", [](auto tag) { return lstm_cell_save_kernel<decltype(tag)>; }, params, params.cell,
      stream);
}

void lstm_proj_save_launch(const LstmProjSaveParams& params, cudaStream_t stream) {
  launch_layer_pass(
      "lstm_proj_save_kernel", [](auto tag) { return lstm_proj_save_kernel<decltype(tag)>; }, params, params.proj,
      stream);
}

void lstm_proj_grad_launch(const LstmProjGradParams& params, cudaStream_t stream) {
  launch_layer_pass(
      "lstm_proj_grad_kernel", [](auto tag) { return lstm_proj_grad_kernel<decltype(tag)>; }, params, params.proj,
      stream);
}

void lstm_cell_grad_launch(const LstmCellGradParams& params, cudaStream_t stream) {
  launch_layer_pass(
      "lstm_cell_grad_kernel", [](auto tag) { return lstm_cell_grad_kernel<decltype(tag)>; }, params, params.cell,
      stream);
}

}  // namespace gpu
}  // namespace elmo_fast
