// The GEMMs of LSTM steps with few active rows: out[n, N] = a[n, K] @ w[N, K]^T, n small.
//
// With n <= ~8 such a product is a pass over w (the recurrent weights are 4C x P: 32 MB in fp32
// at ELMo 'original' shapes), so it runs at memory bandwidth or not at all. BLAS sgemm, given the
// row-major [N, K] weights that PyTorch holds, reads them far slower than that for n = 1..8
// (see benchmarks/bench_lstm.py). Here each weight row is streamed once, contiguously, and dotted
// with the n rows of `a`, which stay in L1. Weights in float or bfloat16 (raw bits; widened to
// float on load), activations and accumulation in float.
// Framework-independent: plain structs of raw pointers, no ATen types.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>
#include <cstring>

namespace elmo_fast {
namespace lstm {

C10_ALWAYS_INLINE float widen(float v) { return v; }
// bfloat16 is the top half of a float.
C10_ALWAYS_INLINE float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

template <typename w_t>
struct GemvParams {
  const float* a;  // [n, K], rows lda apart, K contiguous
  int64_t lda;
  const w_t* w;    // [N, K], rows ldw apart, K contiguous (float, or bfloat16 bits)
  int64_t ldw;
  float* out;      // [n, N], rows ldo apart
  int64_t ldo;
  int64_t n;       // rows of a (small)
  int64_t k;       // K
};

// Columns [g_begin, g_end) of out, four weight rows at a time (each read from memory once, then
// from L1 for the other rows of a).
template <typename w_t>
C10_ALWAYS_INLINE void gemv_nt(const GemvParams<w_t>& p, int64_t g_begin, int64_t g_end) {
  const int64_t K = p.k;
  int64_t g = g_begin;
  for (; g + 4 <= g_end; g += 4) {
    const w_t* w0 = p.w + g * p.ldw;
    const w_t* w1 = w0 + p.ldw;
    const w_t* w2 = w1 + p.ldw;
    const w_t* w3 = w2 + p.ldw;
    for (int64_t r = 0; r < p.n; ++r) {
      const float* a = p.a + r * p.lda;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t k = 0; k < K; ++k) {
        const float x = a[k];
        s0 += x * widen(w0[k]);
        s1 += x * widen(w1[k]);
        s2 += x * widen(w2[k]);
        s3 += x * widen(w3[k]);
      }
      float* o = p.out + r * p.ldo + g;
      o[0] = s0;
      o[1] = s1;
      o[2] = s2;
      o[3] = s3;
    }
  }
  for (; g < g_end; ++g) {
    const w_t* w0 = p.w + g * p.ldw;
    for (int64_t r = 0; r < p.n; ++r) {
      const float* a = p.a + r * p.lda;
      float s0 = 0.f;
#pragma omp simd reduction(+ : s0)
      for (int64_t k = 0; k < K; ++k) {
        s0 += a[k] * widen(w0[k]);
      }
      p.out[r * p.ldo + g] = s0;
    }
  }
}

}  // namespace lstm
}  // namespace elmo_fast
