// Scalar math written so that GCC/Clang auto-vectorize loops calling it (no libm calls, no
// branches), for the CPU kernels. -fno-math-errno alone does not let GCC vectorize std::exp or
// std::tanh (that needs -ffast-math, which the kernels refuse). float64 overloads call libm: the
// float64 paths are the oracle-precision ones (tested to 1e-12).
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace elmo_fast {
namespace vec_math {

// Cephes expf: Cody-Waite reduction x = n ln2 + r, degree-6 polynomial on |r| <= ln2/2, scale by
// 2^n through the exponent bits. Relative error ~2 ulp; the clamp keeps 2^n a normal float. NaN in
// gives an unspecified finite value: callers that must keep NaN select it back.
// exp(r) * 2^n for |r| <= ln2/2, given x = n ln2 + r: the Cephes degree-6 polynomial, 2^n through
// the exponent bits. The one place both expf variants share (they differ only in how they find n).
C10_ALWAYS_INLINE float exp_reduced(float x, float nf, int32_t n) {
  const float r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;  // ln2 split in two: exact n*C1
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  float fn = x * 1.44269504088896341f;  // x / ln2
  fn += fn < 0.f ? -0.5f : 0.5f;        // round half away from zero by truncation below
  const int32_t n = static_cast<int32_t>(fn);
  return exp_reduced(x, static_cast<float>(n), n);
}

// Cephes tanhf: an odd polynomial for |x| < 0.625, else 1 - 2 / (exp(2|x|) + 1) with x's sign.
// Error ~2 ulp relative; exactly +-1 for large |x|; NaN stays NaN. Both branches are computed and
// blended with a 0/1 weight: GCC 12 does not if-convert a plain select between them and would not
// vectorize the loop. The polynomial's input is clamped so that the unused branch stays finite
// (0 * inf would be NaN).
inline float tanh(float x) {
  const float z = std::abs(x);
  const float xs = std::copysign(std::min(z, 0.625f), x);
  const float s = xs * xs;
  const float poly =
      ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s + 1.33314422036e-1f) * s -
       3.33332819422e-1f) *
          s * xs +
      xs;
  const float big = std::copysign(1.f - 2.f / (vec_math::exp(2.f * z) + 1.f), x);
  const float w = z < 0.625f ? 1.f : 0.f;
  const float r = w * poly + (1.f - w) * big;
  return x != x ? x : r;
}

inline double exp(double x) { return std::exp(x); }
inline double tanh(double x) { return std::tanh(x); }

}  // namespace vec_math
}  // namespace elmo_fast
