// CPU kernels of the character CNN (its binding: char_cnn_cpu.cpp): for every token (a row of L character ids; ELMo's L
// is 50) and every convolution k (n_k filters of width w_k over D-dim character embeddings),
//   out[t, off_k + f] = act(max_p (b_k[f] + sum_{j<w_k} sum_d E[ids[t, p + j], d] W_k[f, d, j])),
// p over the L - w_k + 1 valid windows. Oracle: elmo_fast.bilm.reference.char_cnn_ref.
//
// Three exact rewrites make it two orders of magnitude cheaper than the convolution (about
// 18 MFLOP per token for ELMo's 2048 filters):
//  1. Fold the embedding into the filters, once per call, for the U distinct ids the call uses:
//     T_k[j][u][f] = sum_d E[c_u, d] W_k[f, d, j]. A window is then bias + w_k row adds of a
//     table instead of w_k * D multiply-adds per filter (D = 16 for ELMo).
//  2. Every window that starts inside a token's trailing run of one repeated id c (ELMo's padding
//     after the end-of-word mark, or a whole "no token" row of zeros) has the same value: compute
//     it once. Only windows starting before the run are computed one by one (~8 for an English
//     word instead of 44..50).
//  3. Windows that start before the run but reach into it end in w - m copies of c: suffix rows
//     S_k[m][u] = b_k + sum_{j >= m} T_k[j][u] (also folded once per call) replace those terms by
//     one row, so a window costs min(w, run - p) + 1 row loads. S_k[0][c] is the constant window
//     of 2. Together ~30% fewer loads for an English word, ~50% for a short one.
// Nothing assumes ELMo's id layout: a row without a trailing run has run = L - 1 and every window
// is computed term by term. Summation order differs from the convolution's (error ~1e-7 in fp32).
// Filters are processed in slices of kBlockBytes (64 fp32 / 32 fp64 filters): a slice's
// accumulators and running maxima stay in registers (4 + 4 vectors per pass over the slice) while
// its table part (2 * w * U * 256 bytes) stays in L2 across a chunk of tokens. On a Zen 4 core:
// ~360k English words/s (fp32, relu) against ~1.4k for char_cnn_ref.
// Vectors are GCC/Clang vector extensions (no intrinsics): one source for every ISA variant.
#pragma once

#include <ATen/Parallel.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/kernel_support.h"
#include "cpu/vec_math.h"

namespace elmo_fast {
namespace char_cnn {

// Bytes of filters per slice (64 fp32 / 32 fp64): one pass of 4 AVX-512 registers, 2 passes of 4
// AVX2 ones, 4 of 4 SSE ones. Every table row starts 64-byte aligned.
constexpr int64_t kBlockBytes = 256;
// Tokens run through one slice at a time (one work item): their ids (50 * 4 bytes each) stay in
// L2 next to the slice's table, which is read into L2 once for them all.
constexpr int64_t kChunkTokens = 512;
// Output rows are a row apart per token: the hot loop prefetches (for writing) the row of the
// token this many ahead, else each store waits on its line's read-for-ownership (1.6x slower at
// N = 2000 on Zen 4).
constexpr int64_t kPrefetchTokens = 4;

// One convolution. Its weight and bias may have any strides (read once, by the fold).
template <typename scalar_t>
struct CharConv {
  const scalar_t* weight;  // [num, D, width], strides below
  const scalar_t* bias;    // [num], stride bias_stride
  int64_t num;             // n_k filters
  int64_t width;           // w_k, 1 <= w_k <= L
  int64_t weight_stride[3];
  int64_t bias_stride;
};

template <typename scalar_t>
struct CharCnnParams {
  const int64_t* char_ids;          // [N, L], values in [0, V) (the binding checked them)
  int64_t ids_stride[2];            // any strides
  const scalar_t* embedding;        // [V, D]
  int64_t embedding_stride[2];      // any strides
  const CharConv<scalar_t>* convs;  // K convolutions
  int64_t num_convs;                // K >= 1
  scalar_t* out;                    // [N, sum n_k], contiguous
  int64_t n;                        // N tokens
  int64_t length;                   // L >= 1 characters per token (ELMo's 50)
  int64_t vocab;                    // V rows of the embedding
  int64_t dim;                      // D
  bool relu;                        // relu, else tanh (after the max)
};

// One slice of one convolution: `lanes` filters of conv k starting at filter `first`.
struct Slice {
  int64_t conv;
  int64_t first;     // first filter (within conv k)
  int64_t lanes;     // valid filters, <= block; the table pads the rest with zeros
  int64_t out_col;   // its first output column
  int64_t table_at;  // offset of its table [T: w][U][block] + [S: w][U][block], in elements
  int64_t work;      // relative cost (w_k): the most costly slices are handed out first
};

// One slice's fold, for every used id u:
//   T[j][u][i] = sum_d e[u][d] wt[j][d][i],  S[m][u][i] = bias[i] + sum_{j >= m} T[j][u][i].
// e: [U rounded up to kFoldIds][D] used embedding rows (zero padded); wt: [w][D][block] the slice's
// filters, zero-padded; bias: [block]. Returns whether every T, S and bias value is at most
// `limit` in magnitude (false for NaN and inf). Vectors of kVecBytes, 4 per pass over the block:
// kFoldIds x 4 accumulators share each filter load.
constexpr int64_t kFoldIds = 4;

template <typename scalar_t, int kVecBytes>
C10_ALWAYS_INLINE bool fold_slice_impl(const scalar_t* e, const scalar_t* wt, const scalar_t* bias, int64_t num_used,
                                       int64_t dim, int64_t width, scalar_t limit, scalar_t* table) {
  typedef scalar_t vec __attribute__((vector_size(kVecBytes)));
  typedef scalar_t vec_io __attribute__((vector_size(kVecBytes), aligned(sizeof(scalar_t)), may_alias));
  constexpr int64_t lanes = kVecBytes / sizeof(scalar_t);
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  constexpr int64_t vecs = block / lanes;  // per row
  constexpr int64_t pass = 4 * lanes;      // elements per pass
  const int64_t j_stride = num_used * block;
  scalar_t* suffix = table + width * j_stride;
  // Range and finiteness in forms every ISA vectorizes (max, min, x * 0 is NaN for inf/NaN).
  vec hi = vec{} - std::numeric_limits<scalar_t>::infinity(), lo = -hi, nonfinite = {};
  const auto check = [&](const vec& x) {
    hi = x > hi ? x : hi;
    lo = x < lo ? x : lo;
    nonfinite += x * scalar_t(0);
  };
  for (int64_t off = 0; off < block; off += pass) {
    for (int64_t u0 = 0; u0 < num_used; u0 += kFoldIds) {
      const int64_t ids = std::min(kFoldIds, num_used - u0);
      for (int64_t j = 0; j < width; ++j) {
        vec acc[kFoldIds][4] = {};
        for (int64_t d = 0; d < dim; ++d) {
          const vec_io* row = reinterpret_cast<const vec_io*>(wt + (j * dim + d) * block + off);
          vec r[4];
#pragma GCC unroll 4
          for (int64_t v = 0; v < 4; ++v) {
            r[v] = row[v];
          }
#pragma GCC unroll 4
          for (int64_t k = 0; k < kFoldIds; ++k) {
            const scalar_t ed = e[(u0 + k) * dim + d];
#pragma GCC unroll 4
            for (int64_t v = 0; v < 4; ++v) {
              acc[k][v] += ed * r[v];
            }
          }
        }
        for (int64_t k = 0; k < ids; ++k) {
          vec_io* t_row = reinterpret_cast<vec_io*>(table + j * j_stride + (u0 + k) * block + off);
#pragma GCC unroll 4
          for (int64_t v = 0; v < 4; ++v) {
            t_row[v] = acc[k][v];
            check(acc[k][v]);
          }
        }
      }
    }
  }
  const vec_io* b = reinterpret_cast<const vec_io*>(bias);
  for (int64_t v = 0; v < vecs; ++v) {
    check(b[v]);
  }
  for (int64_t u = 0; u < num_used; ++u) {
    for (int64_t v = 0; v < vecs; ++v) {
      vec run = b[v];
      for (int64_t j = width - 1; j >= 0; --j) {
        run += reinterpret_cast<const vec_io*>(table + j * j_stride + u * block)[v];
        reinterpret_cast<vec_io*>(suffix + j * j_stride + u * block)[v] = run;
        check(run);
      }
    }
  }
  bool small = true;
  for (int64_t i = 0; i < lanes; ++i) {
    small &= nonfinite[i] == 0 && hi[i] <= limit && lo[i] >= -limit;
  }
  return small;
}

template <typename scalar_t>
struct FoldSlice {
  template <int kVecBytes>
  static C10_ALWAYS_INLINE bool run(const scalar_t* e, const scalar_t* wt, const scalar_t* bias, int64_t num_used,
                                    int64_t dim, int64_t width, scalar_t limit, scalar_t* table) {
    return fold_slice_impl<scalar_t, kVecBytes>(e, wt, bias, num_used, dim, width, limit, table);
  }
};

template <typename scalar_t>
bool fold_slice_rows(const scalar_t* e, const scalar_t* wt, const scalar_t* bias, int64_t num_used, int64_t dim,
                     int64_t width, scalar_t limit, scalar_t* table) {
  return cpu::dispatch_isa<FoldSlice<scalar_t>>(e, wt, bias, num_used, dim, width, limit, table);
}

// Gathers a slice's filters and bias (any strides) into zero-padded scratch, then folds. Returns
// whether all of the slice's table and bias are at most `limit` in magnitude.
template <typename scalar_t>
bool fold_slice(const CharCnnParams<scalar_t>& p, const Slice& s, const scalar_t* e, int64_t num_used, scalar_t limit,
                scalar_t* table, scalar_t* bias, std::vector<scalar_t>& wt) {
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  const CharConv<scalar_t>& conv = p.convs[s.conv];
  const int64_t dim = p.dim, width = conv.width;
  wt.resize(static_cast<size_t>(width * dim * block));
  const scalar_t* w0 = conv.weight + s.first * conv.weight_stride[0];
  for (int64_t j = 0; j < width; ++j) {
    for (int64_t d = 0; d < dim; ++d) {
      const scalar_t* src = w0 + d * conv.weight_stride[1] + j * conv.weight_stride[2];
      scalar_t* dst = wt.data() + (j * dim + d) * block;
      for (int64_t i = 0; i < block; ++i) {
        dst[i] = i < s.lanes ? src[i * conv.weight_stride[0]] : scalar_t(0);
      }
    }
  }
  for (int64_t i = 0; i < block; ++i) {
    bias[i] = i < s.lanes ? conv.bias[(s.first + i) * conv.bias_stride] : scalar_t(0);
  }
  return fold_slice_rows(e, wt.data(), bias, num_used, dim, width, limit, table + s.table_at);
}

// A slice over a chunk of tokens: everything the hot loop reads.
template <typename scalar_t>
struct SliceTask {
  const scalar_t* table;  // [T: w][U][block] then [S: w][U][block] of this slice
  const scalar_t* bias;   // [block], padded with zeros
  const int32_t* cids;    // [tokens][L] compact ids (rows of the table)
  const int32_t* runs;    // [tokens] start of each token's trailing run of one repeated id
  scalar_t* out;          // first output column of the slice, row 0 of the chunk
  int64_t tokens;
  int64_t length;      // L
  int64_t width;       // w
  int64_t num_used;    // U
  int64_t out_stride;  // sum n_k
  int64_t lanes;       // valid filters (columns to write), <= block
};

// The hot loop, written once with GCC/Clang vector extensions: per token, per pass of 4 vectors
// of kVecBytes over the slice's filters, 4 accumulators and 4 running maxima in registers.
template <typename scalar_t, int kVecBytes, bool kPropagateNan, bool kRelu>
C10_ALWAYS_INLINE void slice_tokens_impl(const SliceTask<scalar_t>& a) {
  typedef scalar_t vec __attribute__((vector_size(kVecBytes)));
  // Loads and stores go through a may_alias, element-aligned twin of `vec` (no function takes or
  // returns a vector: that would be an ABI question across the ISA variants).
  typedef scalar_t vec_io __attribute__((vector_size(kVecBytes), aligned(sizeof(scalar_t)), may_alias));
  constexpr int64_t lanes = kVecBytes / sizeof(scalar_t);
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  constexpr int64_t pass = 4 * lanes;                   // elements per pass
  constexpr int shift = sizeof(scalar_t) == 4 ? 6 : 5;  // log2(block)
  static_assert((int64_t{1} << shift) == block, "block is a power of two");
#define ELMO_ROW(ptr, v) (reinterpret_cast<const vec_io*>(ptr)[v])

  const vec zero = {};
  const vec minus_inf = zero - std::numeric_limits<scalar_t>::infinity();
  const int64_t w = a.width, length = a.length;
  const int64_t j_stride = a.num_used * block;
  const int64_t num_windows = length - w + 1;

  for (int64_t t = 0; t < a.tokens; ++t) {
    const int32_t* ids = a.cids + t * length;
    if (t + kPrefetchTokens < a.tokens) {
      const char* ahead = reinterpret_cast<const char*>(a.out + (t + kPrefetchTokens) * a.out_stride);
      for (int64_t line = 0; line < kBlockBytes; line += 64) {
        __builtin_prefetch(ahead + line, 1);
      }
    }
    const int64_t run = a.runs[t];
    const int64_t last_row = static_cast<int64_t>(ids[length - 1]) << shift;
    const int64_t individual = std::min(run, num_windows);
    for (int64_t off = 0; off < block; off += pass) {
      const scalar_t* table = a.table + off;
      const scalar_t* suffix = table + w * j_stride;
      const vec b0 = ELMO_ROW(a.bias + off, 0), b1 = ELMO_ROW(a.bias + off, 1), b2 = ELMO_ROW(a.bias + off, 2),
                b3 = ELMO_ROW(a.bias + off, 3);
      vec m0 = minus_inf, m1 = minus_inf, m2 = minus_inf, m3 = minus_inf;
      // kPropagateNan: NaN in any window makes the max NaN, as amax does. Otherwise the table is
      // known finite and small enough that no window overflows, so a plain compare is exact.
      const auto take_max = [&](const vec& s0, const vec& s1, const vec& s2, const vec& s3) {
        if constexpr (kPropagateNan) {
          m0 = ((s0 > m0) | (s0 != s0)) ? s0 : m0;
          m1 = ((s1 > m1) | (s1 != s1)) ? s1 : m1;
          m2 = ((s2 > m2) | (s2 != s2)) ? s2 : m2;
          m3 = ((s3 > m3) | (s3 != s3)) ? s3 : m3;
        } else {
          m0 = s0 > m0 ? s0 : m0;
          m1 = s1 > m1 ? s1 : m1;
          m2 = s2 > m2 ? s2 : m2;
          m3 = s3 > m3 ? s3 : m3;
        }
      };
      // Windows starting before the run, one by one: `terms` ids before the run, then one
      // suffix row (or the bias) for the rest.
      for (int64_t p = 0; p < individual; ++p) {
        const int64_t terms = std::min(w, run - p);
        vec s0, s1, s2, s3;
        if (terms == w) {
          s0 = b0, s1 = b1, s2 = b2, s3 = b3;
        } else {
          const scalar_t* row = suffix + terms * j_stride + last_row;
          s0 = ELMO_ROW(row, 0), s1 = ELMO_ROW(row, 1), s2 = ELMO_ROW(row, 2), s3 = ELMO_ROW(row, 3);
        }
        const scalar_t* tj = table;
        for (int64_t j = 0; j < terms; ++j, tj += j_stride) {
          const scalar_t* row = tj + (static_cast<int64_t>(ids[p + j]) << shift);
          s0 += ELMO_ROW(row, 0);
          s1 += ELMO_ROW(row, 1);
          s2 += ELMO_ROW(row, 2);
          s3 += ELMO_ROW(row, 3);
        }
        take_max(s0, s1, s2, s3);
      }
      // All windows starting inside the run (if any fits) are S[0] of the repeated id.
      if (run < num_windows) {
        const scalar_t* row = suffix + last_row;
        take_max(ELMO_ROW(row, 0), ELMO_ROW(row, 1), ELMO_ROW(row, 2), ELMO_ROW(row, 3));
      }
      if constexpr (kRelu) {
        // `m < 0 ? 0 : m` keeps NaN, as F.relu does.
        m0 = m0 < zero ? zero : m0;
        m1 = m1 < zero ? zero : m1;
        m2 = m2 < zero ? zero : m2;
        m3 = m3 < zero ? zero : m3;
      }
      alignas(64) scalar_t result[pass];
      std::memcpy(result, &m0, sizeof(vec));
      std::memcpy(result + lanes, &m1, sizeof(vec));
      std::memcpy(result + 2 * lanes, &m2, sizeof(vec));
      std::memcpy(result + 3 * lanes, &m3, sizeof(vec));
      if constexpr (!kRelu) {
        for (int64_t i = 0; i < pass; ++i) {  // vectorized for float (libm for double)
          result[i] = vec_math::tanh(result[i]);
        }
      }
      const int64_t count = std::min(pass, a.lanes - off);
      if (count > 0) {
        std::memcpy(a.out + t * a.out_stride + off, result, static_cast<size_t>(count) * sizeof(scalar_t));
      }
    }
  }
#undef ELMO_ROW
}

template <typename scalar_t, bool kPropagateNan, bool kRelu>
struct SliceTokens {
  template <int kVecBytes>
  static C10_ALWAYS_INLINE int run(const SliceTask<scalar_t>& a) {
    slice_tokens_impl<scalar_t, kVecBytes, kPropagateNan, kRelu>(a);
    return 0;
  }
};

template <typename scalar_t, bool kPropagateNan, bool kRelu>
void slice_tokens_isa(const SliceTask<scalar_t>& a) {
  cpu::dispatch_isa<SliceTokens<scalar_t, kPropagateNan, kRelu>>(a);
}

template <typename scalar_t>
void slice_tokens(const SliceTask<scalar_t>& a, bool propagate_nan, bool relu) {
  if (propagate_nan) {
    relu ? slice_tokens_isa<scalar_t, true, true>(a) : slice_tokens_isa<scalar_t, true, false>(a);
  } else {
    relu ? slice_tokens_isa<scalar_t, false, true>(a) : slice_tokens_isa<scalar_t, false, false>(a);
  }
}

// The backward's pass over one slice and all tokens: the same windows as slice_tokens_impl, also
// tracking which window gave each filter's max (the first of the largest; every window inside the
// trailing run counts as the run's first one: they all hold the same ids, so which one takes the
// gradient makes no difference, and the reference's amax, which shares it among equal windows,
// gives the same result). Per token and filter with a non-zero gradient g (after the activation's
// derivative, taken at the recomputed max): bias_grad += g and, for every tap j of the argmax window
// p, hist[filter][j][compact id at p + j] += g. Not NaN-propagating: gradients of non-finite
// weights are unspecified.
template <typename scalar_t>
struct SliceGradTask {
  const scalar_t* table;  // [T: w][U][block] then [S: w][U][block] of this slice
  const scalar_t* bias;   // [block], padded with zeros
  const int32_t* cids;    // [tokens][L] compact ids
  const int32_t* runs;    // [tokens] start of each token's trailing run
  const scalar_t* grad;   // the output gradient at the slice's first column, token 0
  int64_t grad_stride;    // its row stride
  scalar_t* hist;         // [lanes][w][U] accumulated (zeroed by the caller)
  scalar_t* bias_grad;    // [lanes] accumulated (zeroed by the caller)
  int64_t tokens;
  int64_t length;    // L
  int64_t width;     // w
  int64_t num_used;  // U
  int64_t lanes;     // valid filters, <= block
};

template <typename scalar_t, int kVecBytes, bool kRelu>
C10_ALWAYS_INLINE void slice_grad_impl(const SliceGradTask<scalar_t>& a) {
  typedef scalar_t vec __attribute__((vector_size(kVecBytes)));
  typedef scalar_t vec_io __attribute__((vector_size(kVecBytes), aligned(sizeof(scalar_t)), may_alias));
  constexpr int64_t lanes = kVecBytes / sizeof(scalar_t);
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  constexpr int64_t pass = 4 * lanes;
  constexpr int shift = sizeof(scalar_t) == 4 ? 6 : 5;  // log2(block)
  static_assert((int64_t{1} << shift) == block, "block is a power of two");
#define ELMO_ROW(ptr, v) (reinterpret_cast<const vec_io*>(ptr)[v])

  const vec zero = {};
  const vec minus_inf = zero - std::numeric_limits<scalar_t>::infinity();
  const int64_t w = a.width, length = a.length, U = a.num_used;
  const int64_t j_stride = a.num_used * block;
  const int64_t num_windows = length - w + 1;

  for (int64_t t = 0; t < a.tokens; ++t) {
    const int32_t* ids = a.cids + t * length;
    const int64_t run = a.runs[t];
    const int64_t last_row = static_cast<int64_t>(ids[length - 1]) << shift;
    const int64_t individual = std::min(run, num_windows);
    const scalar_t* grad = a.grad + t * a.grad_stride;
    for (int64_t off = 0; off < a.lanes; off += pass) {
      const scalar_t* table = a.table + off;
      const scalar_t* suffix = table + w * j_stride;
      const vec b0 = ELMO_ROW(a.bias + off, 0), b1 = ELMO_ROW(a.bias + off, 1), b2 = ELMO_ROW(a.bias + off, 2),
                b3 = ELMO_ROW(a.bias + off, 3);
      vec m0 = minus_inf, m1 = minus_inf, m2 = minus_inf, m3 = minus_inf;
      vec i0 = zero, i1 = zero, i2 = zero, i3 = zero;  // argmax windows, as scalar_t (exact up to 2^24)
      const auto take_max = [&](const vec& s0, const vec& s1, const vec& s2, const vec& s3, int64_t p) {
        const vec pv = zero + static_cast<scalar_t>(p);
        i0 = s0 > m0 ? pv : i0;
        i1 = s1 > m1 ? pv : i1;
        i2 = s2 > m2 ? pv : i2;
        i3 = s3 > m3 ? pv : i3;
        m0 = s0 > m0 ? s0 : m0;
        m1 = s1 > m1 ? s1 : m1;
        m2 = s2 > m2 ? s2 : m2;
        m3 = s3 > m3 ? s3 : m3;
      };
      for (int64_t p = 0; p < individual; ++p) {
        const int64_t terms = std::min(w, run - p);
        vec s0, s1, s2, s3;
        if (terms == w) {
          s0 = b0, s1 = b1, s2 = b2, s3 = b3;
        } else {
          const scalar_t* row = suffix + terms * j_stride + last_row;
          s0 = ELMO_ROW(row, 0), s1 = ELMO_ROW(row, 1), s2 = ELMO_ROW(row, 2), s3 = ELMO_ROW(row, 3);
        }
        const scalar_t* tj = table;
        for (int64_t j = 0; j < terms; ++j, tj += j_stride) {
          const scalar_t* row = tj + (static_cast<int64_t>(ids[p + j]) << shift);
          s0 += ELMO_ROW(row, 0);
          s1 += ELMO_ROW(row, 1);
          s2 += ELMO_ROW(row, 2);
          s3 += ELMO_ROW(row, 3);
        }
        take_max(s0, s1, s2, s3, p);
      }
      if (run < num_windows) {
        const scalar_t* row = suffix + last_row;
        take_max(ELMO_ROW(row, 0), ELMO_ROW(row, 1), ELMO_ROW(row, 2), ELMO_ROW(row, 3), run);
      }
      alignas(64) scalar_t m[pass];
      alignas(64) scalar_t arg[pass];
      std::memcpy(m, &m0, sizeof(vec));
      std::memcpy(m + lanes, &m1, sizeof(vec));
      std::memcpy(m + 2 * lanes, &m2, sizeof(vec));
      std::memcpy(m + 3 * lanes, &m3, sizeof(vec));
      std::memcpy(arg, &i0, sizeof(vec));
      std::memcpy(arg + lanes, &i1, sizeof(vec));
      std::memcpy(arg + 2 * lanes, &i2, sizeof(vec));
      std::memcpy(arg + 3 * lanes, &i3, sizeof(vec));
      const int64_t count = std::min(pass, a.lanes - off);
      for (int64_t i = 0; i < count; ++i) {
        scalar_t g = grad[off + i];
        if constexpr (kRelu) {
          g = m[i] > scalar_t(0) ? g : scalar_t(0);
        } else {
          const scalar_t th = vec_math::tanh(m[i]);
          g *= scalar_t(1) - th * th;
        }
        if (g == scalar_t(0)) {
          continue;  // relu's dead filters: about half of them
        }
        a.bias_grad[off + i] += g;
        const int32_t* window = ids + static_cast<int64_t>(arg[i]);
        scalar_t* h = a.hist + (off + i) * w * U;
        for (int64_t j = 0; j < w; ++j) {
          h[j * U + window[j]] += g;
        }
      }
    }
  }
#undef ELMO_ROW
}

template <typename scalar_t, bool kRelu>
struct SliceGrad {
  template <int kVecBytes>
  static C10_ALWAYS_INLINE int run(const SliceGradTask<scalar_t>& a) {
    slice_grad_impl<scalar_t, kVecBytes, kRelu>(a);
    return 0;
  }
};

template <typename scalar_t, bool kRelu>
void slice_grad_isa(const SliceGradTask<scalar_t>& a) {
  cpu::dispatch_isa<SliceGrad<scalar_t, kRelu>>(a);
}

// What the forward's windows and the backward read, built once per call (steps 1 and 2 below).
template <typename scalar_t>
struct Prepared {
  std::vector<int64_t> used;  // [U] the distinct ids of the call, increasing: table row u is id used[u]
  std::vector<Slice> slices;
  std::vector<int64_t> order;          // slice indices, the widest (most costly per token) first
  cpu::AlignedArray<scalar_t> table;   // every slice's T and S tables
  cpu::AlignedArray<scalar_t> biases;  // [slices][block], zero padded
  cpu::AlignedArray<int32_t> cids;     // [N][L] every token's compact ids (table rows)
  cpu::AlignedArray<int32_t> runs;     // [N] start of each token's trailing run of one repeated id
  bool propagate_nan = false;          // some table or bias entry is non-finite or huge
  int64_t out_cols = 0;                // sum n_k
};

// Steps 1 and 2: the distinct ids, the slices and their folded tables, every token's compact ids.
// Returns false when there is nothing to compute (no tokens or no filters).
template <typename scalar_t>
bool prepare(const CharCnnParams<scalar_t>& p, Prepared<scalar_t>& pr) {
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  const int64_t n = p.n, length = p.length;
  for (int64_t k = 0; k < p.num_convs; ++k) {
    pr.out_cols += p.convs[k].num;
  }
  if (n == 0 || pr.out_cols == 0) {
    return false;
  }

  // 1. The distinct ids of this call, in increasing order, and each id's row in the table.
  std::vector<int32_t> compact(static_cast<size_t>(p.vocab), -1);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t* row = p.char_ids + t * p.ids_stride[0];
    for (int64_t i = 0; i < length; ++i) {
      compact[row[i * p.ids_stride[1]]] = 0;
    }
  }
  std::vector<int64_t>& used = pr.used;
  for (int64_t c = 0; c < p.vocab; ++c) {
    if (compact[c] == 0) {
      compact[c] = static_cast<int32_t>(used.size());
      used.push_back(c);
    }
  }
  const int64_t num_used = static_cast<int64_t>(used.size());

  // 2. Slices, and the fold of every slice's table.
  std::vector<Slice>& slices = pr.slices;
  int64_t table_size = 0, out_col = 0;
  for (int64_t k = 0; k < p.num_convs; ++k) {
    const CharConv<scalar_t>& conv = p.convs[k];
    for (int64_t first = 0; first < conv.num; first += block) {
      Slice s;
      s.conv = k;
      s.first = first;
      s.lanes = std::min(block, conv.num - first);
      s.out_col = out_col + first;
      s.table_at = table_size;
      s.work = conv.width;
      slices.push_back(s);
      table_size += 2 * conv.width * num_used * block;
    }
    out_col += conv.num;
  }
  pr.table = cpu::AlignedArray<scalar_t>(table_size);
  pr.biases = cpu::AlignedArray<scalar_t>(static_cast<int64_t>(slices.size()) * block);
  std::vector<int64_t>& order = pr.order;
  order.resize(slices.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = static_cast<int64_t>(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return slices[x].work > slices[y].work; });
  const int64_t num_slices = static_cast<int64_t>(slices.size());
  // Rows past U are zero: the fold reads whole groups of kFoldIds.
  const int64_t used_rows_padded = (num_used + kFoldIds - 1) / kFoldIds * kFoldIds;
  std::vector<scalar_t> used_rows(static_cast<size_t>(used_rows_padded * p.dim), scalar_t(0));
  for (int64_t u = 0; u < num_used; ++u) {
    for (int64_t d = 0; d < p.dim; ++d) {
      used_rows[u * p.dim + d] = p.embedding[used[u] * p.embedding_stride[0] + d * p.embedding_stride[1]];
    }
  }
  // The fast max needs every window finite: a window sums at most w + 1 table entries and biases,
  // so with all of them at most max / max(64, w_max + 2) in magnitude no sum overflows (for any L,
  // hence any width). Anything else (inf, NaN, huge weights) takes the NaN-propagating path.
  int64_t widest = 1;
  for (int64_t k = 0; k < p.num_convs; ++k) {
    widest = std::max(widest, p.convs[k].width);
  }
  const scalar_t limit =
      std::numeric_limits<scalar_t>::max() / static_cast<scalar_t>(std::max<int64_t>(64, widest + 2));
  std::vector<uint8_t> slice_small(slices.size(), 0);
  // Every token's compact ids (the table rows) and the start of its trailing run.
  pr.cids = cpu::AlignedArray<int32_t>(n * length);
  pr.runs = cpu::AlignedArray<int32_t>(n);
  const auto stage_tokens = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t* row = p.char_ids + t * p.ids_stride[0];
      int32_t* c = pr.cids.get() + t * length;
      for (int64_t i = 0; i < length; ++i) {
        c[i] = compact[row[i * p.ids_stride[1]]];
      }
      int64_t run = length - 1;
      while (run > 0 && c[run - 1] == c[length - 1]) {
        --run;
      }
      pr.runs.get()[t] = static_cast<int32_t>(run);
    }
  };
  // Two parallel regions in all (threads meet twice per call, which matters on a busy machine):
  // the folds and the staging of ids, then the windows. Parallel only when a thread's share is
  // worth waking it: a slice of width 1 folds U ids in ~U * 0.1 us and a token costs ~15 ns per
  // slice of width 1.
  constexpr int64_t kStageTokens = 256;
  const int64_t stage_items = (n + kStageTokens - 1) / kStageTokens;
  cpu::for_each_item(num_slices + stage_items, num_used >= 16 || n >= 16, [&](int64_t item) {
    if (item < num_slices) {
      const int64_t index = order[item];
      std::vector<scalar_t> wt;
      slice_small[index] = fold_slice(p, slices[index], used_rows.data(), num_used, limit, pr.table.get(),
                                      pr.biases.get() + index * block, wt);
    } else {
      const int64_t begin = (item - num_slices) * kStageTokens;
      stage_tokens(begin, std::min(n, begin + kStageTokens));
    }
  });
  pr.propagate_nan = std::find(slice_small.begin(), slice_small.end(), 0) != slice_small.end();
  return true;
}

template <typename scalar_t>
void char_cnn_kernel(const CharCnnParams<scalar_t>& p) {
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  Prepared<scalar_t> pr;
  if (!prepare(p, pr)) {
    return;
  }
  const int64_t n = p.n, length = p.length;
  const int64_t num_slices = static_cast<int64_t>(pr.slices.size());
  const int64_t num_used = static_cast<int64_t>(pr.used.size());

  // 3. Items of one slice over one chunk of tokens: the slice's table stays in L2 for the chunk's
  // tokens (and so do the chunk's ids: 200 bytes per token).
  const int64_t num_chunks = (n + kChunkTokens - 1) / kChunkTokens;
  cpu::for_each_item(num_chunks * num_slices, n >= 16, [&](int64_t item) {
    const int64_t chunk = item / num_slices * kChunkTokens;
    const int64_t index = pr.order[item % num_slices];
    const Slice& s = pr.slices[index];
    SliceTask<scalar_t> task;
    task.table = pr.table.get() + s.table_at;
    task.bias = pr.biases.get() + index * block;
    task.cids = pr.cids.get() + chunk * length;
    task.runs = pr.runs.get() + chunk;
    task.out = p.out + chunk * pr.out_cols + s.out_col;
    task.tokens = std::min(kChunkTokens, n - chunk);
    task.length = length;
    task.width = p.convs[s.conv].width;
    task.num_used = num_used;
    task.out_stride = pr.out_cols;
    task.lanes = s.lanes;
    slice_tokens(task, pr.propagate_nan, p.relu);
  });
}

// The backward's histograms: for conv k, hist_k [n_k][w_k][U] (at hist_at[k] of `hist`, zeroed),
// hist_k[f][j][u] = the sum of g[t, f] over the tokens t whose argmax window for f has id used[u]
// at tap j; bias_grad [sum n_k] (zeroed) = the sums of g. Returns the distinct ids (U of them).
template <typename scalar_t>
std::vector<int64_t> char_cnn_histograms(const CharCnnParams<scalar_t>& p, const scalar_t* grad, int64_t grad_stride,
                                         std::vector<at::Tensor>& hist, scalar_t* bias_grad) {
  constexpr int64_t block = kBlockBytes / sizeof(scalar_t);
  Prepared<scalar_t> pr;
  if (!prepare(p, pr)) {
    return pr.used;
  }
  const int64_t num_used = static_cast<int64_t>(pr.used.size());
  std::vector<int64_t> first_col(p.num_convs, 0);
  for (int64_t k = 1; k < p.num_convs; ++k) {
    first_col[k] = first_col[k - 1] + p.convs[k - 1].num;
  }
  for (int64_t k = 0; k < p.num_convs; ++k) {
    hist[k] = at::zeros({p.convs[k].num, p.convs[k].width, num_used},
                        at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value));
  }
  // One item per slice over all tokens: a slice owns its histogram rows, so threads never share one.
  const int64_t num_slices = static_cast<int64_t>(pr.slices.size());
  cpu::for_each_item(num_slices, p.n >= 16, [&](int64_t item) {
    const int64_t index = pr.order[item];
    const Slice& s = pr.slices[index];
    const int64_t w = p.convs[s.conv].width;
    SliceGradTask<scalar_t> task;
    task.table = pr.table.get() + s.table_at;
    task.bias = pr.biases.get() + index * block;
    task.cids = pr.cids.get();
    task.runs = pr.runs.get();
    task.grad = grad + s.out_col;
    task.grad_stride = grad_stride;
    task.hist = hist[s.conv].template mutable_data_ptr<scalar_t>() + s.first * w * num_used;
    task.bias_grad = bias_grad + s.out_col;
    task.tokens = p.n;
    task.length = p.length;
    task.width = w;
    task.num_used = num_used;
    task.lanes = s.lanes;
    p.relu ? slice_grad_isa<scalar_t, true>(task) : slice_grad_isa<scalar_t, false>(task);
  });
  return pr.used;
}

}  // namespace char_cnn
}  // namespace elmo_fast
