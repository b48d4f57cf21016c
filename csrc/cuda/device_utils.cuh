// Helpers for the kernels in csrc/cuda/*.cu: the math type of each element type, conversions,
// the transcendental functions the references use, and the dtype switch of the launchers.
// CUDA headers only: nothing here may pull in torch (nvcc compile time).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "cuda/dtype.h"

namespace elmo_fast {
namespace gpu {

// float for float/bfloat16/half, double for double: as at::opmath_type.
template <typename T>
struct MathType {
  using type = float;
};
template <>
struct MathType<double> {
  using type = double;
};
template <typename T>
using math_t = typename MathType<T>::type;

__device__ __forceinline__ float to_math(float x) { return x; }
__device__ __forceinline__ double to_math(double x) { return x; }
__device__ __forceinline__ float to_math(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_math(__half x) { return __half2float(x); }

// Round to nearest even, NaN stays NaN: what c10::BFloat16 / c10::Half do.
template <typename T>
__device__ __forceinline__ T from_math(math_t<T> x);
template <>
__device__ __forceinline__ float from_math<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double from_math<double>(double x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_math<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_math<__half>(float x) {
  return __float2half_rn(x);
}

// The accurate libdevice functions (no --use_fast_math anywhere): the fp32 bar is 1e-5.
__device__ __forceinline__ float exp_math(float x) { return expf(x); }
__device__ __forceinline__ double exp_math(double x) { return exp(x); }
__device__ __forceinline__ float tanh_math(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_math(double x) { return tanh(x); }

// torch.sigmoid's formula: 1 / (1 + exp(-x)); saturates to exactly 0 and 1, NaN stays NaN.
template <typename A>
__device__ __forceinline__ A sigmoid_math(A x) {
  return A(1) / (A(1) + exp_math(-x));
}

// torch.clamp(x, lo, hi): max with lo first, then min with hi; NaN passes through.
template <typename A>
__device__ __forceinline__ A clamp_math(A x, A lo, A hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

// relu as F.relu: NaN passes through.
template <typename A>
__device__ __forceinline__ A relu_math(A x) {
  return x < A(0) ? A(0) : x;
}

// V consecutive elements as one aligned access (16 bytes: 8 bf16 / fp16, 4 fp32, 2 fp64): the
// elementwise kernels' loads and stores, one ld/st.global.v4 instead of V scalar (2-byte for bf16 /
// fp16) accesses. The launchers pick V with vector_width (else V = 1).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// A plain word type of each pack size: the accesses go through it, so that nvcc emits one vector
// access (copying a Pack of bf16 / fp16 objects it splits the stores element by element).
template <int Bytes>
struct RawWord;
template <>
struct RawWord<2> {
  using type = unsigned short;
};
template <>
struct RawWord<4> {
  using type = unsigned int;
};
template <>
struct RawWord<8> {
  using type = uint2;
};
template <>
struct RawWord<16> {
  using type = uint4;
};
template <>
struct RawWord<32> {  // 8 fp32 cell states beside 8 bf16 gates: two 16-byte accesses
  struct alignas(32) type {
    uint4 lo, hi;
  };
};

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  using R = typename RawWord<sizeof(Pack<T, V>)>::type;
  const R raw = *reinterpret_cast<const R*>(p);
  Pack<T, V> x;
  memcpy(&x, &raw, sizeof(x));
  return x;
}

// One store of a word. nvcc splits a plain store of a word built from a pack into element stores;
// __stwb (st.global.wb) keeps it one vector store.
template <typename R>
__device__ __forceinline__ void store_word(R* p, const R& r) {
#ifdef __CUDA_ARCH__
  __stwb(p, r);
#else
  *p = r;  // the CPU emulator of the tests
#endif
}

__device__ __forceinline__ void store_word(RawWord<32>::type* p, const RawWord<32>::type& r) {
  store_word(&p->lo, r.lo);
  store_word(&p->hi, r.hi);
}

template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& x) {
  using R = typename RawWord<sizeof(Pack<T, V>)>::type;
  R raw;
  memcpy(&raw, &x, sizeof(raw));
  store_word(reinterpret_cast<R*>(p), raw);
}

// The vector width of type T (16 bytes' worth).
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));

// Whether kernels may access every row in packs of V elements of `elem_size` bytes: `cols` (the
// row width) and every row stride (elements) multiples of V, every base pointer V-aligned.
inline bool vector_ok(int V, size_t elem_size, int64_t cols, std::initializer_list<const void*> pointers,
                      std::initializer_list<int64_t> strides) {
  if (V <= 1 || cols % V != 0) {
    return V == 1;
  }
  for (const void* p : pointers) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % (V * elem_size) != 0) {
      return false;
    }
  }
  for (const int64_t s : strides) {
    if (s % V != 0) {
      return false;
    }
  }
  return true;
}

// kernel<<<grid, block, 0, stream>>>(args...). Macros so that the CPU emulator of the tests
// (tests/cuda_emulation), which compiles the *_kernels.cuh files with g++, can run the same
// launchers with its own definition; `name` names the kernel in the emulator's errors (`kernel` may be
// a pointer to a __global__ function).
#ifndef ELMO_KERNEL_LAUNCH_NAMED
#define ELMO_KERNEL_LAUNCH_NAMED(name, kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
#ifndef ELMO_KERNEL_LAUNCH
#define ELMO_KERNEL_LAUNCH(kernel, grid, block, stream, ...) \
  ELMO_KERNEL_LAUNCH_NAMED(#kernel, kernel, grid, block, stream, __VA_ARGS__)
#endif

// A block's shared array: ELMO_SHARED(int, s_ids, 512); declares `s_ids`. A macro so that the CPU
// emulator can fill the array with garbage at every block's start, as a GPU leaves it holding whatever
// an earlier block wrote (bare __shared__ does not compile there).
#ifndef ELMO_SHARED
#define ELMO_SHARED(type, name, count) __shared__ __align__(16) type name[count]
#endif

// Grid dims y and z are limited to 65535: kernels loop over rows with a stride of gridDim.y.
constexpr int64_t kMaxGridY = 65535;

inline unsigned grid_y(int64_t rows) { return static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY); }

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// An elementwise pass over `rows` rows of `units` units each (columns, or packs of V columns), the launch
// of every row kernel here: grid x over the units in blocks of Threads threads, y over the rows (the
// kernels stride by gridDim.y beyond 65535); nothing for empty work.
template <int Threads, typename Params>
void launch_rows(const char* name, void (*kernel)(Params), const Params& params, int64_t units, int64_t rows,
                 cudaStream_t stream) {
  if (units == 0 || rows == 0) {
    return;  // a zero-sized grid is a launch error
  }
  const dim3 grid(ceil_div(units, Threads), grid_y(rows));
  ELMO_KERNEL_LAUNCH_NAMED(name, kernel, grid, Threads, stream, params);
}

// The same pass over rows of `cols` columns by kernel<T, V>: V = kVec<T> columns per thread as 16-byte packs
// where `vectorized` (vector_ok: widths and pointers allow it), else one column per thread. `kernels`
// maps an std::integral_constant<int, V> to kernel<T, V>.
template <int Threads, typename T, typename Params, typename Kernels>
void launch_rows_vectorized(const char* name, Kernels kernels, const Params& params, bool vectorized, int64_t cols,
                            int64_t rows, cudaStream_t stream) {
  if (vectorized) {
    launch_rows<Threads>(name, kernels(std::integral_constant<int, kVec<T>>{}), params, cols / kVec<T>, rows, stream);
  } else {
    launch_rows<Threads>(name, kernels(std::integral_constant<int, 1>{}), params, cols, rows, stream);
  }
}

// Calls f(T{}) with T the element type of `dtype`; the launchers' switch over element types.
template <typename F>
void dispatch_dtype(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat32: f(float{}); return;
    case Dtype::kFloat64: f(double{}); return;
    case Dtype::kBFloat16: f(__nv_bfloat16{}); return;
    case Dtype::kFloat16: f(__half{}); return;
  }
}

}  // namespace gpu
}  // namespace elmo_fast
