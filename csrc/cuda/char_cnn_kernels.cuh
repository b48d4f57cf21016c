// CUDA character CNN: a folded-table kernel (see char_cnn.h for the math).
//
// Work per token is sum_k n_k * w_k * (windows computed), one table read and one add each: for
// ELMo's 2048 filters and an English word (~8 windows before the padding run) ~100k adds instead
// of the convolution's ~9M multiply-adds. The fp32 tables (262 ids x sum_k w_k n_k = 3.2M floats,
// 12.9 MB) stay in L2; a warp reads 32 consecutive filters of one table row: coalesced.
//
// Included once, by char_cnn.cu (nvcc) or by the CPU emulator of the tests (tests/cuda_emulation, g++),
// which runs these very kernels and launchers on CPU tensors where no GPU is available.
#pragma once

#include <cmath>

#include "cuda/char_cnn.h"
#include "cuda/device_utils.cuh"

namespace elmo_fast {
namespace gpu {
namespace {

constexpr int kTableThreads = 256;
constexpr int kThreads = 128;    // filters (output columns) per block
constexpr int kTokens = 8;       // tokens whose ids a block stages at once, at most
constexpr int kStageInts = 512;  // ids a block stages in shared memory: 8 rows of up to 64 ids, ...

// Tokens a block takes at once for rows of W ids: as many rows as the staging buffer holds (at most
// kTokens); one for rows longer than the buffer, whose ids the threads read from global memory.
__host__ __device__ inline int char_cnn_group_tokens(int W) {
  return W > kStageInts ? 1 : (kStageInts / W < kTokens ? kStageInts / W : kTokens);
}

// One thread per table entry e = table_offset[k] + (j * V + c) * n_k + f (grid-stride).
template <typename T>
__global__ void __launch_bounds__(kTableThreads) char_cnn_table_kernel(const __grid_constant__ CharCnnTableParams p) {
  using A = math_t<T>;
  A* __restrict__ table = static_cast<A*>(p.table);
  const int64_t size = p.table_offset[p.num_convs];
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kTableThreads + threadIdx.x; e < size;
       e += static_cast<int64_t>(gridDim.x) * kTableThreads) {
    int k = 0;
    while (k + 1 < p.num_convs && e >= p.table_offset[k + 1]) {
      ++k;  // empty convolutions (n_k = 0) have equal offsets and are skipped
    }
    const int64_t local = e - p.table_offset[k];
    const int64_t nf = p.filters[k];
    const int64_t w = p.widths[k];
    const int64_t f = local % nf;
    const int64_t c = (local / nf) % p.vocab;
    const int64_t j = local / nf / p.vocab;
    const T* emb = static_cast<const T*>(p.embedding) + c * p.embedding_row_stride;
    const T* wk = static_cast<const T*>(p.weights[k]) + f * p.dim * w + j;  // W_k[f, d, j], d-stride w
    A acc = A(0);
    for (int64_t d = 0; d < p.dim; ++d) {
      acc += to_math(emb[d]) * to_math(wk[d * w]);
    }
    table[e] = acc;
  }
}

// grid: x over the F output columns in blocks of kThreads, y over groups of char_cnn_group_tokens(W)
// tokens (strided by gridDim.y). Each thread owns one column (conv k, filter f) for all its tokens.
// Rows of any length W >= 1: up to kStageInts ids are staged in shared memory (as ints, -1 for an id
// outside [0, V)), longer rows are read from global memory, one token per group.
// kBackward: the backward's first pass instead (see CharCnnParams::dpre).
template <typename T, bool kBackward>
__global__ void __launch_bounds__(kThreads) char_cnn_kernel(const __grid_constant__ CharCnnParams p) {
  using A = math_t<T>;
  ELMO_SHARED(int, s_ids, kStageInts);  // the group's rows of ids; -1: id outside [0, V)
  ELMO_SHARED(int, s_run, kTokens);     // start of each token's trailing run, -1: invalid token

  const int W = p.chars;
  const int group = char_cnn_group_tokens(W);  // uniform over the launch
  const bool staged = W <= kStageInts;
  const int F = p.col_offset[p.num_convs];
  const int col = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  const bool active = col < F;  // inactive threads still stage ids and reach every barrier
  int k = 0;
  while (active && k + 1 < p.num_convs && col >= p.col_offset[k + 1]) {
    ++k;
  }
  const int w = p.widths[k];
  const int64_t nf = p.filters[k];
  const int64_t f = active ? col - p.col_offset[k] : 0;
  // T_k[j][c][f] = column[j * row_stride + c * nf]
  const A* __restrict__ column = static_cast<const A*>(p.table) + p.table_offset[k] + f;
  const int64_t j_stride = p.vocab * nf;
  const A bias = active ? to_math(static_cast<const T*>(p.biases[k])[f]) : A(0);
  const int windows = W - w + 1;  // >= 1: the binding checks w <= W

  for (int64_t tok0 = static_cast<int64_t>(blockIdx.y) * group; tok0 < p.n;
       tok0 += static_cast<int64_t>(gridDim.y) * group) {
    const int count = static_cast<int>(p.n - tok0 < group ? p.n - tok0 : group);
    const int64_t* g_ids = p.char_ids + tok0 * W;  // the group's rows in global memory
    __syncthreads();                               // the previous group's ids are no longer read
    if (staged) {
      for (int e = threadIdx.x; e < count * W; e += kThreads) {
        const int64_t id = g_ids[e];
        s_ids[e] = (id >= 0 && id < p.vocab) ? static_cast<int>(id) : -1;
      }
    }
    __syncthreads();
    if (threadIdx.x < count) {
      // The trailing run of one repeated id starts at `run`; every window starting at p >= run
      // equals window `run`, so windows 0..min(run, windows - 1) cover the max. The run is the
      // token's; `windows` is each thread's own (the block's columns span several widths).
      const int t = threadIdx.x;
      bool valid = true;
      int run = W - 1;
      if (staged) {
        const int* ids = s_ids + t * W;
        for (int q = 0; q < W; ++q) {
          valid = valid && ids[q] >= 0;
        }
        while (run > 0 && ids[run - 1] == ids[W - 1]) {
          --run;
        }
      } else {
        const int64_t* ids = g_ids + static_cast<int64_t>(t) * W;
        for (int q = 0; q < W; ++q) {
          valid = valid && ids[q] >= 0 && ids[q] < p.vocab;
        }
        while (run > 0 && ids[run - 1] == ids[W - 1]) {
          --run;
        }
      }
      s_run[t] = valid ? run : -1;
    }
    __syncthreads();
    if (!active) {
      continue;
    }
    for (int t = 0; t < count; ++t) {
      const int run = s_run[t];
      const int last = run < windows - 1 ? run : windows - 1;  // -1 stays -1: an invalid token
      const int* s_row = s_ids + t * W;
      const int64_t* g_row = g_ids + static_cast<int64_t>(t) * W;  // (valid ids only are read)
      A best = -INFINITY;
      int arg = 0;
      for (int q = 0; q <= last; ++q) {
        A v = A(0);
        for (int j = 0; j < w; ++j) {
          const int64_t id = staged ? static_cast<int64_t>(s_row[q + j]) : g_row[q + j];
          v += column[j * j_stride + id * nf];
        }
        const bool take = v > best || v != v;  // NaN wins, as amax; once NaN, stays NaN
        best = take ? v : best;
        if constexpr (kBackward) {
          arg = take ? q : arg;  // strict >: the first of equal windows
        }
      }
      if constexpr (kBackward) {
        const A g = to_math(static_cast<const T*>(p.grad)[(tok0 + t) * p.grad_row_stride + col]);
        A dpre = A(NAN);  // an id outside [0, V): NaN, as the forward's row
        if (last >= 0) {
          const A v = best + bias;
          if (p.tanh_activation) {
            const A th = tanh_math(v);
            dpre = g * (A(1) - th * th);
          } else {
            dpre = v > A(0) ? g : A(0);
          }
        }
        static_cast<A*>(p.dpre)[(tok0 + t) * F + col] = dpre;
        p.window[(tok0 + t) * F + col] = last >= 0 ? arg : -1;
      } else {
        A result;
        if (last < 0) {
          result = A(NAN);  // an id outside [0, V): no value to give (the reference would raise)
        } else {
          result = best + bias;
          result = p.tanh_activation ? tanh_math(result) : relu_math(result);
        }
        static_cast<T*>(p.out)[(tok0 + t) * F + col] = from_math<T>(result);
      }
    }
  }
}

// grid: x over all taps (k, f, j) in blocks of kThreads, y over the chunks of tokens.
template <typename A>
__global__ void __launch_bounds__(kThreads) char_cnn_hist_kernel(const __grid_constant__ CharCnnHistParams p) {
  const int64_t taps = p.tap_offset[p.num_convs];
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= taps) {
    return;
  }
  int k = 0;
  while (k + 1 < p.num_convs && e >= p.tap_offset[k + 1]) {
    ++k;  // empty convolutions (n_k = 0) have equal offsets and are skipped
  }
  const int64_t local = e - p.tap_offset[k];  // f w_k + j
  const int w = p.widths[k];
  const int64_t f = local / w;
  const int j = static_cast<int>(local % w);
  const int F = p.col_offset[p.num_convs];
  const int64_t col = p.col_offset[k] + f;
  const int64_t taps_v = taps * p.vocab_count;
  A* __restrict__ hist = static_cast<A*>(p.hist) + blockIdx.y * taps_v + e * p.vocab_count;
  const A* __restrict__ dpre = static_cast<const A*>(p.dpre);
  const int64_t first = static_cast<int64_t>(blockIdx.y) * p.chunk_tokens;
  const int64_t end = first + p.chunk_tokens < p.n ? first + p.chunk_tokens : p.n;
  for (int64_t t = first; t < end; ++t) {
    const A g = dpre[t * F + col];
    if (g == A(0)) {
      continue;  // relu's dead filters: about half of them
    }
    const int win = p.window[t * F + col];
    // A token with a bad id (window -1) spreads its NaN to row 0: the gradients say something is wrong.
    const int64_t c = (win < 0 ? 0 : p.char_ids[t * p.chars + win + j]) - p.vocab_begin;
    if (c >= 0 && c < p.vocab_count) {
      hist[c] += g;
    }
  }
}

}  // namespace

void char_cnn_table_launch(const CharCnnTableParams& params, cudaStream_t stream) {
  const int64_t size = params.table_offset[params.num_convs];
  if (size == 0) {
    return;
  }
  const int64_t blocks = (size + kTableThreads - 1) / kTableThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);  // grid-stride beyond
  dispatch_dtype(params.dtype, [&](auto tag) {
    using T = decltype(tag);
    ELMO_KERNEL_LAUNCH(char_cnn_table_kernel<T>, grid, kTableThreads, stream, params);
  });
}

// The forward (kBackward false) or the backward's first pass over tokens in groups.
template <bool kBackward>
void launch_token_groups(const char* name, const CharCnnParams& params, cudaStream_t stream) {
  const int group = char_cnn_group_tokens(params.chars);
  dispatch_dtype(params.dtype, [&](auto tag) {
    launch_rows<kThreads>(name, char_cnn_kernel<decltype(tag), kBackward>, params, params.col_offset[params.num_convs],
                          (params.n + group - 1) / group, stream);
  });
}

void char_cnn_launch(const CharCnnParams& params, cudaStream_t stream) {
  launch_token_groups<false>("char_cnn_kernel", params, stream);
}

void char_cnn_argmax_launch(const CharCnnParams& params, cudaStream_t stream) {
  launch_token_groups<true>("char_cnn_kernel (backward)", params, stream);
}

void char_cnn_hist_launch(const CharCnnHistParams& params, cudaStream_t stream) {
  const int64_t taps = params.tap_offset[params.num_convs];
  if (params.n == 0 || taps == 0) {
    return;
  }
  const dim3 grid(ceil_div(taps, kThreads), static_cast<unsigned>(params.chunks));
  if (params.dtype == Dtype::kFloat64) {
    ELMO_KERNEL_LAUNCH(char_cnn_hist_kernel<double>, grid, kThreads, stream, params);
  } else {
    ELMO_KERNEL_LAUNCH(char_cnn_hist_kernel<float>, grid, kThreads, stream, params);
  }
}

}  // namespace gpu
}  // namespace elmo_fast
