// The pointwise halves of one projected-LSTM step (the GEMMs around them stay in ATen/BLAS):
//   cell:       gates = xg + rec;  c = sig(f) * c + sig(i) * tanh(g), clipped;  hc = sig(o) * tanh(c)
//   projection: h = clip(h);  x = h (layer 0) or x + h (skip connection, layers >= 1)
// Framework-independent: plain structs of raw pointers, no ATen types. Oracle:
// elmo_fast.bilm.reference.lstm_layer_ref.
//
// float uses a polynomial exp that GCC vectorizes (libm's expf blocks vectorization without
// -ffast-math); the caller compiles the float instantiation once per ISA with target_clones.
// double keeps libm: it is the oracle-precision path, tested to 1e-12.
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/vec_math.h"

namespace elmo_fast {
namespace lstm {

// Cephes expf (as csrc/cpu/highway_cpu.cpp): Cody-Waite reduction x = n ln2 + r, degree-6
// polynomial on |r| <= ln2/2, 2^n through the exponent bits; max relative error 8e-8 over
// [-87, 88]. n = round(x / ln2) comes from the float adder (adding 1.5 * 2^23 pushes the fraction
// out) instead of a float -> int conversion: GCC will not speculate that conversion, so a select
// between exp and another value (tanh_fast) would not vectorize. The clamp keeps 2^n a normal
// float; sigmoid and tanh saturate long before it matters.
C10_ALWAYS_INLINE float exp_fast(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23
  const float shifted = x * 1.44269504088896341f + kShifter;
  const float nf = shifted - kShifter;
  int32_t shifted_bits, shifter_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(float));
  const float shifter = kShifter;
  std::memcpy(&shifter_bits, &shifter, sizeof(float));
  const int32_t n = shifted_bits - shifter_bits;
  return vec_math::exp_reduced(x, nf, n);
}

C10_ALWAYS_INLINE float sigmoid_fast(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

// tanh without cancellation near 0: Cephes tanhf's odd polynomial for |x| < 0.625, else
// 1 - 2 / (exp(2|x|) + 1); both branches are computed and one is selected, which vectorizes.
// Relative error ~2e-7 everywhere (checked against libm in tests/bilm/test_lstm.py).
C10_ALWAYS_INLINE float tanh_fast(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * a + a;
  const float big = 1.0f - 2.0f / (exp_fast(2.0f * a) + 1.0f);
  return std::copysign(a < 0.625f ? small : big, x);
}

C10_ALWAYS_INLINE double sigmoid_fast(double x) { return 1.0 / (1.0 + std::exp(-x)); }
C10_ALWAYS_INLINE double tanh_fast(double x) { return std::tanh(x); }

// Clamps to [-clip, clip]; clip = +inf means no clip. NaN stays NaN (std::max/min return their
// first argument when the comparison is false).
template <typename T>
C10_ALWAYS_INLINE T clip_to(T v, T clip) {
  return std::min(std::max(v, -clip), clip);
}

// bfloat16 as raw bits (the top half of a float): widened exactly; narrowed with round to nearest
// even, NaN kept a (quiet) NaN, as c10::BFloat16 does.
C10_ALWAYS_INLINE float widen(float v) { return v; }
C10_ALWAYS_INLINE double widen(double v) { return v; }
C10_ALWAYS_INLINE float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

C10_ALWAYS_INLINE uint16_t to_bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return v != v ? uint16_t{0x7FC0} : rounded;
}

// *dst = v in dst's type.
C10_ALWAYS_INLINE void store(float* dst, float v) { *dst = v; }
C10_ALWAYS_INLINE void store(double* dst, double v) { *dst = v; }
C10_ALWAYS_INLINE void store(uint16_t* dst, float v) { *dst = to_bf16_bits(v); }

// One step's cell update for rows [row_begin, row_end) of the active prefix. All rows are
// contiguous in the feature dim; gate blocks are ordered i, f, g, o, C apart. xg_t, rec_t and
// hc_t are scalar_t, or bfloat16 bits (uint16_t) around oneDNN's bf16 GEMMs.
template <typename scalar_t, typename xg_t = scalar_t, typename rec_t = scalar_t, typename hc_t = scalar_t>
struct CellParams {
  const xg_t* xg;            // input gates x W_ih^T: row j at xg + xg_offset[j] (4C contiguous) ...
  const int64_t* xg_offset;  // [n] element offsets, or nullptr: row j at xg + j * 4C
  const scalar_t* bias;      // [4C] added to every row's input gates (zeros where xg has it)
  const rec_t* rec;          // [n, 4C] recurrent gates h W_hh^T
  scalar_t* c;               // [n, C] cell state, updated in place
  hc_t* hc;                  // [n, C] out: sig(o) * tanh(c), the projection's input
  int64_t cell;              // C
  scalar_t cell_clip;        // +inf: none
};

// One row: 4C gates in (input + bias + recurrent), C cells updated, C values of sig(o) * tanh(c) out.
template <typename scalar_t, typename xg_t, typename rec_t, typename hc_t>
C10_ALWAYS_INLINE void cell_row(const xg_t* C10_RESTRICT xg, const scalar_t* C10_RESTRICT bias,
                                const rec_t* C10_RESTRICT rec, scalar_t* C10_RESTRICT c, hc_t* C10_RESTRICT hc,
                                int64_t C, scalar_t clip) {
  for (int64_t k = 0; k < C; ++k) {
    const scalar_t i = sigmoid_fast(widen(xg[k]) + bias[k] + widen(rec[k]));
    const scalar_t f = sigmoid_fast(widen(xg[C + k]) + bias[C + k] + widen(rec[C + k]));
    const scalar_t g = tanh_fast(widen(xg[2 * C + k]) + bias[2 * C + k] + widen(rec[2 * C + k]));
    const scalar_t o = sigmoid_fast(widen(xg[3 * C + k]) + bias[3 * C + k] + widen(rec[3 * C + k]));
    const scalar_t c_new = clip_to(i * g + f * c[k], clip);
    c[k] = c_new;
    store(hc + k, o * tanh_fast(c_new));
  }
}

template <typename scalar_t, typename xg_t, typename rec_t, typename hc_t>
C10_ALWAYS_INLINE void cell_rows(const CellParams<scalar_t, xg_t, rec_t, hc_t>& p, int64_t row_begin, int64_t row_end) {
  const int64_t C = p.cell;
  for (int64_t j = row_begin; j < row_end; ++j) {
    cell_row(p.xg + (p.xg_offset ? p.xg_offset[j] : j * 4 * C), p.bias, p.rec + j * 4 * C, p.c + j * C, p.hc + j * C, C,
             p.cell_clip);
  }
}

// After the projection GEMM: h = clip(projection) (the state for the next step) and the layer's
// output (with the skip connection from layers >= 1 on). All [n, P] contiguous: one flat loop.
template <typename scalar_t, typename in_t = scalar_t>
struct ProjParams {
  const in_t* in;           // [n, P] the projection GEMM's result; may be h itself
  scalar_t* h;              // [n, P] out: clipped h
  scalar_t* x;              // [n, P] the layer's output rows (packed), overwritten or accumulated
  int64_t numel;            // n * P
  bool skip;                // x += h (layers >= 1) instead of x = h
  scalar_t proj_clip;       // +inf: none
  uint16_t* h16 = nullptr;  // [n, P] out, or nullptr: h in bf16, the next step's GEMM input (packed weights)
};

template <typename scalar_t, typename in_t>
C10_ALWAYS_INLINE void proj_elems(const ProjParams<scalar_t, in_t>& p, int64_t begin, int64_t end) {
  const in_t* in = p.in;  // may alias h: no restrict
  scalar_t* h = p.h;
  scalar_t* C10_RESTRICT x = p.x;
  const scalar_t clip = p.proj_clip;
  if (p.skip) {
    for (int64_t e = begin; e < end; ++e) {
      const scalar_t v = clip_to(static_cast<scalar_t>(widen(in[e])), clip);
      h[e] = v;
      x[e] += v;
    }
  } else {
    for (int64_t e = begin; e < end; ++e) {
      const scalar_t v = clip_to(static_cast<scalar_t>(widen(in[e])), clip);
      h[e] = v;
      x[e] = v;
    }
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (p.h16 != nullptr) {  // a second loop over the same (cached) elements: a branch inside would not vectorize
      uint16_t* C10_RESTRICT h16 = p.h16;
      const float* C10_RESTRICT hr = h;
      for (int64_t e = begin; e < end; ++e) {
        h16[e] = to_bf16_bits(hr[e]);
      }
    }
  }
}

}  // namespace lstm
}  // namespace elmo_fast
