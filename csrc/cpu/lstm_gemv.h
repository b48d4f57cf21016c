// The recurrent and projection GEMMs of LSTM steps with few rows: out[n, N] = a[n, K] @ w[N, K]^T.
//
// With few rows such a product is a pass over w (the recurrent weights are 4C x P: 32 MB in fp32
// at ELMo 'original' shapes), so it should run at memory bandwidth; MKL sgemm, given the row-major
// [N, K] weights PyTorch holds, read them 2-3x slower than that for n = 1..8 on the Zen 4 this was
// tuned on. Here each weight row is streamed once, contiguously, and dotted with the n rows of `a`
// (in L1) in 4 x 4 blocks (8 loads per 16 FMAs), which kept it ahead of MKL up to n = 128 there.
// Weights in float or bfloat16 (raw bits, widened on load); activations and accumulation in float.
//
// bfloat16 weights with K even take gemv_nt_pairs instead: each 32-bit word of a weight row holds
// two weights, k = 2j (low half) and 2j + 1 (high half), widened exactly by one shift (word << 16)
// and one mask (word & 0xFFFF0000) against the even and odd elements of a, which the caller split
// into two halves once per call (even_odd_split). That is one full-width load per two lanes of
// weights where gemv_nt's per-element widening costs a zero-extending load (a shuffle) per lane:
// at batch 1 the bf16 step is then bound by reading its weights, not by widening them. Same sums
// up to the order of the additions (fp32 accumulation of exact products).
// Framework-independent: plain structs of raw pointers, no ATen types.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>
#include <cstring>

#include "cpu/lstm_pointwise.h"  // widen()

namespace elmo_fast {
namespace lstm {

template <typename w_t>
struct GemvParams {
  const float* a;  // [n, K], rows lda apart, K contiguous
  int64_t lda;
  const w_t* w;  // [N, K], rows ldw apart, K contiguous (float, or bfloat16 bits)
  int64_t ldw;
  float* out;  // [n, N], rows ldo apart
  int64_t ldo;
  int64_t n;  // rows of a (small)
  int64_t k;  // K
};

// out[r0:r0+4, g:g+4]: four weight rows against four rows of a, 16 sums (8 loads per 16 FMAs).
template <typename w_t>
C10_ALWAYS_INLINE void gemv_block4x4(const GemvParams<w_t>& p, int64_t r0, int64_t g) {
  const int64_t K = p.k;
  const w_t* w0 = p.w + g * p.ldw;
  const w_t* w1 = w0 + p.ldw;
  const w_t* w2 = w1 + p.ldw;
  const w_t* w3 = w2 + p.ldw;
  const float* a0 = p.a + r0 * p.lda;
  const float* a1 = a0 + p.lda;
  const float* a2 = a1 + p.lda;
  const float* a3 = a2 + p.lda;
  float s00 = 0.f, s01 = 0.f, s02 = 0.f, s03 = 0.f, s10 = 0.f, s11 = 0.f, s12 = 0.f, s13 = 0.f;
  float s20 = 0.f, s21 = 0.f, s22 = 0.f, s23 = 0.f, s30 = 0.f, s31 = 0.f, s32 = 0.f, s33 = 0.f;
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)
  for (int64_t k = 0; k < K; ++k) {
    const float v0 = widen(w0[k]), v1 = widen(w1[k]), v2 = widen(w2[k]), v3 = widen(w3[k]);
    const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
    // clang-format off: the 4x4 block reads as a matrix
    s00 += x0 * v0; s01 += x0 * v1; s02 += x0 * v2; s03 += x0 * v3;
    s10 += x1 * v0; s11 += x1 * v1; s12 += x1 * v2; s13 += x1 * v3;
    s20 += x2 * v0; s21 += x2 * v1; s22 += x2 * v2; s23 += x2 * v3;
    s30 += x3 * v0; s31 += x3 * v1; s32 += x3 * v2; s33 += x3 * v3;
  }
  float* o = p.out + r0 * p.ldo + g;
  o[0] = s00; o[1] = s01; o[2] = s02; o[3] = s03;
  o += p.ldo;
  o[0] = s10; o[1] = s11; o[2] = s12; o[3] = s13;
  o += p.ldo;
  o[0] = s20; o[1] = s21; o[2] = s22; o[3] = s23;
  o += p.ldo;
  o[0] = s30; o[1] = s31; o[2] = s32; o[3] = s33;
  // clang-format on
}

// out[r, g:g+4]: four weight rows against one row of a.
template <typename w_t>
C10_ALWAYS_INLINE void gemv_block1x4(const GemvParams<w_t>& p, int64_t r, int64_t g) {
  const int64_t K = p.k;
  const w_t* w0 = p.w + g * p.ldw;
  const w_t* w1 = w0 + p.ldw;
  const w_t* w2 = w1 + p.ldw;
  const w_t* w3 = w2 + p.ldw;
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

// Columns [g_begin, g_end) of out, four weight rows at a time: each is read from memory once,
// then from L1 for every block of rows of a.
template <typename w_t>
C10_ALWAYS_INLINE void gemv_nt(const GemvParams<w_t>& p, int64_t g_begin, int64_t g_end) {
  const int64_t K = p.k;
  int64_t g = g_begin;
  for (; g + 4 <= g_end; g += 4) {
    int64_t r = 0;
    for (; r + 4 <= p.n; r += 4) {
      gemv_block4x4(p, r, g);
    }
    for (; r < p.n; ++r) {
      gemv_block1x4(p, r, g);
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

// ---------------------------------------------------------------------------------------------
// bfloat16 weights, K even: word pairs (see the top of this file).

struct GemvPairsParams {
  const float* a_split;  // [n, K]: row r's even elements a[r, 0::2] in [0, K/2), odd ones after
  const uint32_t* w;     // [N, K/2] words, rows ldw words apart: weights 2j (low) and 2j + 1 (high)
  int64_t ldw;
  float* out;  // [n, N], rows ldo apart
  int64_t ldo;
  int64_t n;
  int64_t k;  // K (even)
};

// dst[r] = a[r, 0::2] then a[r, 1::2], for rows [r_begin, r_end) of a [n, K] (rows lda apart).
C10_ALWAYS_INLINE void even_odd_split(const float* a, int64_t lda, int64_t K, float* dst, int64_t r_begin,
                                      int64_t r_end) {
  const int64_t h = K / 2;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = a + r * lda;
    float* even = dst + r * K;
    float* odd = even + h;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) {
      even[j] = src[2 * j];
      odd[j] = src[2 * j + 1];
    }
  }
}

C10_ALWAYS_INLINE float low_bf16(uint32_t word) {
  const uint32_t wide = word << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

C10_ALWAYS_INLINE float high_bf16(uint32_t word) {
  const uint32_t wide = word & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

// out[r0:r0+4, g:g+4].
C10_ALWAYS_INLINE void gemv_pairs_block4x4(const GemvPairsParams& p, int64_t r0, int64_t g) {
  const int64_t h = p.k / 2;
  const uint32_t* w0 = p.w + g * p.ldw;
  const uint32_t* w1 = w0 + p.ldw;
  const uint32_t* w2 = w1 + p.ldw;
  const uint32_t* w3 = w2 + p.ldw;
  const float* e0 = p.a_split + r0 * p.k;
  const float* e1 = e0 + p.k;
  const float* e2 = e1 + p.k;
  const float* e3 = e2 + p.k;
  float s00 = 0.f, s01 = 0.f, s02 = 0.f, s03 = 0.f, s10 = 0.f, s11 = 0.f, s12 = 0.f, s13 = 0.f;
  float s20 = 0.f, s21 = 0.f, s22 = 0.f, s23 = 0.f, s30 = 0.f, s31 = 0.f, s32 = 0.f, s33 = 0.f;
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)
  for (int64_t j = 0; j < h; ++j) {
    const float l0 = low_bf16(w0[j]), l1 = low_bf16(w1[j]), l2 = low_bf16(w2[j]), l3 = low_bf16(w3[j]);
    const float u0 = high_bf16(w0[j]), u1 = high_bf16(w1[j]), u2 = high_bf16(w2[j]), u3 = high_bf16(w3[j]);
    const float x0 = e0[j], x1 = e1[j], x2 = e2[j], x3 = e3[j];
    const float y0 = e0[h + j], y1 = e1[h + j], y2 = e2[h + j], y3 = e3[h + j];
    // clang-format off: the 4x4 block reads as a matrix
    s00 += x0 * l0 + y0 * u0; s01 += x0 * l1 + y0 * u1; s02 += x0 * l2 + y0 * u2; s03 += x0 * l3 + y0 * u3;
    s10 += x1 * l0 + y1 * u0; s11 += x1 * l1 + y1 * u1; s12 += x1 * l2 + y1 * u2; s13 += x1 * l3 + y1 * u3;
    s20 += x2 * l0 + y2 * u0; s21 += x2 * l1 + y2 * u1; s22 += x2 * l2 + y2 * u2; s23 += x2 * l3 + y2 * u3;
    s30 += x3 * l0 + y3 * u0; s31 += x3 * l1 + y3 * u1; s32 += x3 * l2 + y3 * u2; s33 += x3 * l3 + y3 * u3;
  }
  float* o = p.out + r0 * p.ldo + g;
  o[0] = s00; o[1] = s01; o[2] = s02; o[3] = s03;
  o += p.ldo;
  o[0] = s10; o[1] = s11; o[2] = s12; o[3] = s13;
  o += p.ldo;
  o[0] = s20; o[1] = s21; o[2] = s22; o[3] = s23;
  o += p.ldo;
  o[0] = s30; o[1] = s31; o[2] = s32; o[3] = s33;
  // clang-format on
}

// out[r, g:g+4].
C10_ALWAYS_INLINE void gemv_pairs_block1x4(const GemvPairsParams& p, int64_t r, int64_t g) {
  const int64_t h = p.k / 2;
  const uint32_t* w0 = p.w + g * p.ldw;
  const uint32_t* w1 = w0 + p.ldw;
  const uint32_t* w2 = w1 + p.ldw;
  const uint32_t* w3 = w2 + p.ldw;
  const float* e = p.a_split + r * p.k;
  const float* o_ = e + h;
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t j = 0; j < h; ++j) {
    const float x = e[j], y = o_[j];
    s0 += x * low_bf16(w0[j]) + y * high_bf16(w0[j]);
    s1 += x * low_bf16(w1[j]) + y * high_bf16(w1[j]);
    s2 += x * low_bf16(w2[j]) + y * high_bf16(w2[j]);
    s3 += x * low_bf16(w3[j]) + y * high_bf16(w3[j]);
  }
  float* o = p.out + r * p.ldo + g;
  o[0] = s0;
  o[1] = s1;
  o[2] = s2;
  o[3] = s3;
}

// Columns [g_begin, g_end) of out, four weight rows at a time.
C10_ALWAYS_INLINE void gemv_nt_pairs(const GemvPairsParams& p, int64_t g_begin, int64_t g_end) {
  const int64_t h = p.k / 2;
  int64_t g = g_begin;
  for (; g + 4 <= g_end; g += 4) {
    int64_t r = 0;
    for (; r + 4 <= p.n; r += 4) {
      gemv_pairs_block4x4(p, r, g);
    }
    for (; r < p.n; ++r) {
      gemv_pairs_block1x4(p, r, g);
    }
  }
  for (; g < g_end; ++g) {
    const uint32_t* w0 = p.w + g * p.ldw;
    for (int64_t r = 0; r < p.n; ++r) {
      const float* e = p.a_split + r * p.k;
      float s0 = 0.f;
#pragma omp simd reduction(+ : s0)
      for (int64_t j = 0; j < h; ++j) {
        s0 += e[j] * low_bf16(w0[j]) + e[h + j] * high_bf16(w0[j]);
      }
      p.out[r * p.ldo + g] = s0;
    }
  }
}

}  // namespace lstm
}  // namespace elmo_fast
