// The pointwise passes of the trainable projected-LSTM layer (ops lstm_layer_forward / _backward;
// oracle: elmo_fast.bilm.reference.lstm_layer_ref under autograd). One step of one row:
//   z = xg + h_prev W_hh^T;  i, f, o = sig(z_i, z_f, z_o), g = tanh(z_g)
//   c_raw = i g + f c_prev;  c = clip(c_raw, cell_clip);  m = o tanh(c)
//   p_raw = m W_proj^T;      h = clip(p_raw, proj_clip)   (the step's output and next h_prev)
// The forward keeps, per packed row, i f g o (4C), c_raw (C), m (C) and p_raw (P): the backward
// recomputes only tanh(c) and reads the clip masks from the unclipped values (gradient passes
// where -clip <= x <= clip, as torch.clamp and TensorFlow's clip_by_value).
// The GEMMs stay in BLAS / gemv_nt; framework-independent: plain structs of raw pointers.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "cpu/lstm_pointwise.h"  // sigmoid_fast, tanh_fast, clip_to

namespace elmo_fast {
namespace lstm {

// Forward cell pass with the saves, for rows [row_begin, row_end) of one step's active prefix.
template <typename scalar_t>
struct CellSaveParams {
  const scalar_t* xg;        // input gates: row j at xg + xg_offset[j], 4C contiguous (i, f, g, o)
  const int64_t* xg_offset;  // [n] element offsets
  scalar_t* act;             // [n, 4C] in: recurrent gates h_prev W_hh^T; out: i, f, g, o activations
  scalar_t* c;               // [n, C] cell state: in c_prev, out clip(c_raw)
  scalar_t* c_raw;           // [n, C] out: the unclipped cell
  scalar_t* m;               // [n, C] out: o * tanh(c), the projection's input
  int64_t cell;              // C
  scalar_t cell_clip;        // +inf: none
};

template <typename scalar_t>
C10_ALWAYS_INLINE void cell_save_row(const scalar_t* C10_RESTRICT xg, scalar_t* C10_RESTRICT act,
                                     scalar_t* C10_RESTRICT c, scalar_t* C10_RESTRICT c_raw, scalar_t* C10_RESTRICT m,
                                     int64_t C, scalar_t clip) {
  for (int64_t k = 0; k < C; ++k) {
    const scalar_t i = sigmoid_fast(xg[k] + act[k]);
    const scalar_t f = sigmoid_fast(xg[C + k] + act[C + k]);
    const scalar_t g = tanh_fast(xg[2 * C + k] + act[2 * C + k]);
    const scalar_t o = sigmoid_fast(xg[3 * C + k] + act[3 * C + k]);
    act[k] = i;
    act[C + k] = f;
    act[2 * C + k] = g;
    act[3 * C + k] = o;
    const scalar_t raw = i * g + f * c[k];
    c_raw[k] = raw;
    const scalar_t clipped = clip_to(raw, clip);
    c[k] = clipped;
    m[k] = o * tanh_fast(clipped);
  }
}

template <typename scalar_t>
C10_ALWAYS_INLINE void cell_save_rows(const CellSaveParams<scalar_t>& p, int64_t row_begin, int64_t row_end) {
  const int64_t C = p.cell;
  for (int64_t j = row_begin; j < row_end; ++j) {
    cell_save_row(p.xg + p.xg_offset[j], p.act + j * 4 * C, p.c + j * C, p.c_raw + j * C, p.m + j * C, C, p.cell_clip);
  }
}

// Forward projection pass: h = clip(p_raw) into the packed outputs (the next step's h_prev) and
// into the caller's output rows.
template <typename scalar_t>
struct ProjSaveParams {
  const scalar_t* p_raw;      // [n, P] the projection GEMM's result
  scalar_t* h;                // [n, P] out: clip(p_raw), packed
  scalar_t* out;              // out: row j also at out + out_offset[j] (P contiguous)
  const int64_t* out_offset;  // [n]
  int64_t proj;               // P
  scalar_t proj_clip;         // +inf: none
};

template <typename scalar_t>
C10_ALWAYS_INLINE void proj_save_rows(const ProjSaveParams<scalar_t>& p, int64_t row_begin, int64_t row_end) {
  const int64_t P = p.proj;
  for (int64_t j = row_begin; j < row_end; ++j) {
    const scalar_t* C10_RESTRICT raw = p.p_raw + j * P;
    scalar_t* C10_RESTRICT h = p.h + j * P;
    scalar_t* C10_RESTRICT out = p.out + p.out_offset[j];
    for (int64_t k = 0; k < P; ++k) {
      const scalar_t v = clip_to(raw[k], p.proj_clip);
      h[k] = v;
      out[k] = v;
    }
  }
}

// Backward, first pass of a step: the gradient of p_raw from the step's output gradient and the
// recurrent gradient of h, masked where the projection clip bound.
template <typename scalar_t>
struct ProjGradParams {
  const scalar_t* grad_y;  // row j's output gradient at grad_y + grad_y_offset[j], or nullptr (none)
  const int64_t* grad_y_offset;
  const scalar_t* dh;     // [n, P] gradient of h from the steps after (or of the final h)
  const scalar_t* p_raw;  // [n, P] saved
  scalar_t* dp;           // [n, P] out: gradient of p_raw
  int64_t proj;           // P
  scalar_t proj_clip;     // +inf: none
};

template <typename scalar_t>
C10_ALWAYS_INLINE void proj_grad_rows(const ProjGradParams<scalar_t>& p, int64_t row_begin, int64_t row_end) {
  const int64_t P = p.proj;
  const scalar_t clip = p.proj_clip;
  for (int64_t j = row_begin; j < row_end; ++j) {
    const scalar_t* C10_RESTRICT dh = p.dh + j * P;
    const scalar_t* C10_RESTRICT raw = p.p_raw + j * P;
    scalar_t* C10_RESTRICT dp = p.dp + j * P;
    if (p.grad_y != nullptr) {
      const scalar_t* C10_RESTRICT gy = p.grad_y + p.grad_y_offset[j];
      for (int64_t k = 0; k < P; ++k) {
        dp[k] = std::abs(raw[k]) <= clip ? dh[k] + gy[k] : scalar_t(0);
      }
    } else {
      for (int64_t k = 0; k < P; ++k) {
        dp[k] = std::abs(raw[k]) <= clip ? dh[k] : scalar_t(0);
      }
    }
  }
}

// Backward cell pass of a step: from the gradient of m (dp W_proj) and of the cell after the
// step, the gradients of the four gate pre-activations and of the cell before the step.
template <typename scalar_t>
struct CellGradParams {
  const scalar_t* act;        // [n, 4C] saved i, f, g, o
  const scalar_t* c_raw;      // [n, C] saved unclipped cell of this step
  const scalar_t* c_prev;     // [n, C] the cell before the step, clipped to c_prev_clip when read
  scalar_t c_prev_clip;       // cell_clip when c_prev is the previous step's c_raw, +inf for c0
  const scalar_t* dm;         // [n, C] gradient of m
  scalar_t* dc;               // [n, C] in: gradient of the clipped cell after the step; out: of c_prev
  scalar_t* dgates;           // [n, 4C] out: gradient of z (packed)
  scalar_t* dxg;              // out: row j also at dxg + dxg_offset[j] (4C contiguous) ...
  const int64_t* dxg_offset;  // [n]
  bool accumulate;            // ... added to what is there (rows that several positions read)
  int64_t cell;               // C
  scalar_t cell_clip;         // +inf: none
};

// kAccumulate is a template parameter: a branch on it inside the loop (conditional stores) kept GCC
// from vectorizing the loop at all. Each gate block has its own restrict pointer: with one pointer
// and offsets C, 2C, 3C GCC cannot rule out overlaps (C < the vector width) and gives up.
template <bool kAccumulate, typename scalar_t>
C10_ALWAYS_INLINE void cell_grad_row(const scalar_t* C10_RESTRICT act_i, const scalar_t* C10_RESTRICT act_f,
                                     const scalar_t* C10_RESTRICT act_g, const scalar_t* C10_RESTRICT act_o,
                                     const scalar_t* C10_RESTRICT c_raw, const scalar_t* C10_RESTRICT c_prev,
                                     const scalar_t* C10_RESTRICT dm, scalar_t* C10_RESTRICT dc,
                                     scalar_t* C10_RESTRICT dg_i, scalar_t* C10_RESTRICT dg_f,
                                     scalar_t* C10_RESTRICT dg_g, scalar_t* C10_RESTRICT dg_o,
                                     scalar_t* C10_RESTRICT dx_i, scalar_t* C10_RESTRICT dx_f,
                                     scalar_t* C10_RESTRICT dx_g, scalar_t* C10_RESTRICT dx_o, int64_t C, scalar_t clip,
                                     scalar_t prev_clip) {
  for (int64_t k = 0; k < C; ++k) {
    const scalar_t i = act_i[k], f = act_f[k], g = act_g[k], o = act_o[k];
    const scalar_t raw = c_raw[k];
    const scalar_t tc = tanh_fast(clip_to(raw, clip));
    const scalar_t cp = clip_to(c_prev[k], prev_clip);
    const scalar_t dmk = dm[k];
    const scalar_t dzo = dmk * tc * o * (scalar_t(1) - o);
    const scalar_t dct = dc[k] + dmk * o * (scalar_t(1) - tc * tc);
    const scalar_t dcr = std::abs(raw) <= clip ? dct : scalar_t(0);
    const scalar_t dzi = dcr * g * i * (scalar_t(1) - i);
    const scalar_t dzf = dcr * cp * f * (scalar_t(1) - f);
    const scalar_t dzg = dcr * i * (scalar_t(1) - g * g);
    dc[k] = dcr * f;
    dg_i[k] = dzi;
    dg_f[k] = dzf;
    dg_g[k] = dzg;
    dg_o[k] = dzo;
    if constexpr (kAccumulate) {
      dx_i[k] += dzi;
      dx_f[k] += dzf;
      dx_g[k] += dzg;
      dx_o[k] += dzo;
    } else {
      dx_i[k] = dzi;
      dx_f[k] = dzf;
      dx_g[k] = dzg;
      dx_o[k] = dzo;
    }
  }
}

template <typename scalar_t>
C10_ALWAYS_INLINE void cell_grad_rows(const CellGradParams<scalar_t>& p, int64_t row_begin, int64_t row_end) {
  const int64_t C = p.cell;
  // No (generic) lambda here: GCC emits it out of line, compiled for the base ISA, outside the
  // caller's AVX2 / AVX-512 variant.
  for (int64_t j = row_begin; j < row_end; ++j) {
    const scalar_t* a = p.act + j * 4 * C;
    scalar_t* dg = p.dgates + j * 4 * C;
    scalar_t* dx = p.dxg + p.dxg_offset[j];
    if (p.accumulate) {
      cell_grad_row<true>(a, a + C, a + 2 * C, a + 3 * C, p.c_raw + j * C, p.c_prev + j * C, p.dm + j * C, p.dc + j * C,
                          dg, dg + C, dg + 2 * C, dg + 3 * C, dx, dx + C, dx + 2 * C, dx + 3 * C, C, p.cell_clip,
                          p.c_prev_clip);
    } else {
      cell_grad_row<false>(a, a + C, a + 2 * C, a + 3 * C, p.c_raw + j * C, p.c_prev + j * C, p.dm + j * C,
                           p.dc + j * C, dg, dg + C, dg + 2 * C, dg + 3 * C, dx, dx + C, dx + 2 * C, dx + 3 * C, C,
                           p.cell_clip, p.c_prev_clip);
    }
  }
}

}  // namespace lstm
}  // namespace elmo_fast
