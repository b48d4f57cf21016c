// CUDA character CNN (oracle: elmo_fast.bilm.reference.char_cnn_ref). For token t (a row of W >= 1
// character ids) and convolution k (n_k filters of width w_k <= W over D-dim embeddings):
//   out[t, off_k + f] = act(b_k[f] + max_p sum_{j < w_k} T_k[j][ids[t, p + j]][f]),
//   T_k[j][c][f] = sum_d E[c, d] W_k[f, d, j]      (the embedding folded into the filters),
// p over the W - w_k + 1 windows. Windows that start inside the token's trailing run of one
// repeated id (ELMo's padding after the end-of-word mark, or a whole row of zeros) all have the
// value of the run's first window: only windows 0..min(run start, W - w_k) are computed.
// The bias moves out of the max exactly: rounding is monotonic, so max_p fl(b + s_p) = fl(b + max_p s_p).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dtype.h"

namespace elmo_fast {
namespace gpu {

constexpr int kCharCnnMaxConvs = 16;  // ELMo has 7 widths

// Builds the folded tables of every convolution, in the math type (float; double for float64).
struct CharCnnTableParams {
  const void* embedding;                       // [V, D], rows embedding_row_stride apart
  int64_t embedding_row_stride;                // elements
  const void* weights[kCharCnnMaxConvs];       // conv k: [n_k, D, w_k], contiguous
  int widths[kCharCnnMaxConvs];                // w_k
  int filters[kCharCnnMaxConvs];               // n_k
  int64_t table_offset[kCharCnnMaxConvs + 1];  // conv k's table [w_k, V, n_k] starts here; [K] = size
  int num_convs;                               // K
  int64_t vocab;                               // V
  int64_t dim;                                 // D
  void* table;                                 // [table_offset[K]] math type
  Dtype dtype;                                 // of embedding and weights
};

struct CharCnnParams {
  const int64_t* char_ids;                     // [N, W], contiguous
  const void* table;                           // the folded tables (CharCnnTableParams::table)
  const void* biases[kCharCnnMaxConvs];        // conv k: [n_k], contiguous
  void* out;                                   // [N, F], contiguous, F = col_offset[K]
  int64_t n;                                   // N tokens
  int chars;                                   // W >= 1 (ELMo: 50)
  int64_t vocab;                               // V; an id outside [0, V) makes its token's row NaN
  int num_convs;                               // K
  int widths[kCharCnnMaxConvs];                // w_k, 1..W
  int filters[kCharCnnMaxConvs];               // n_k
  int col_offset[kCharCnnMaxConvs + 1];        // conv k's columns start here; [K] = F
  int64_t table_offset[kCharCnnMaxConvs + 1];  // as CharCnnTableParams
  bool tanh_activation;                        // else relu
  Dtype dtype;                                 // of biases and out
  // The backward's first pass (char_cnn_argmax_launch) writes, instead of `out`, for every token t and
  // column c: the gradient at c's max window after the activation's derivative, taken at the
  // recomputed max (relu: grad [v > 0]; tanh: grad (1 - tanh(v)^2)), and that window (the first of
  // equal maxima, as the CPU op; NaN and -1 for a token with an id outside [0, V)).
  const void* grad;         // [N, F] the output's gradient, rows grad_row_stride apart
  int64_t grad_row_stride;  // elements
  void* dpre;               // [N, F] contiguous, math type
  int32_t* window;          // [N, F] contiguous
};

// The backward's second pass: per convolution k, hist_k[f][j][c] = the sum of dpre[t, col(k, f)] over the
// tokens t whose window for that column has id c at tap j, for the ids c of one slice of the vocabulary
// [vocab_begin, vocab_begin + vocab_count) (the binding bounds the workspace with slices). One thread per
// tap (k, f, j) and chunk of tokens, which it walks in order: every sum is made by one thread, in one order
// (deterministic).
struct CharCnnHistParams {
  const int64_t* char_ids;                   // [N, W], contiguous
  const void* dpre;                          // [N, F] math type (CharCnnParams::dpre)
  const int32_t* window;                     // [N, F] (CharCnnParams::window)
  void* hist;                                // [chunks, H] math type, zeroed, H = taps x vocab_count;
                                             //   chunk q's conv k is [n_k, w_k, vocab_count] at
                                             //   q H + tap_offset[k] vocab_count
  int64_t n;                                 // N tokens
  int chars;                                 // W
  int64_t vocab_begin;                       // the slice's first id
  int64_t vocab_count;                       // the slice's ids, >= 1
  int num_convs;                             // K
  int widths[kCharCnnMaxConvs];              // w_k
  int col_offset[kCharCnnMaxConvs + 1];      // as CharCnnParams
  int64_t tap_offset[kCharCnnMaxConvs + 1];  // conv k's taps (f, j) start here; [K] = taps in all
  int64_t chunks;                            // token chunks (grid.y), 1..65535
  int64_t chunk_tokens;                      // tokens per chunk
  Dtype dtype;                               // the math type's element type (kFloat32 or kFloat64)
};

// Enqueue on `stream`; nothing for empty work. The caller checks each launch.
void char_cnn_table_launch(const CharCnnTableParams& params, cudaStream_t stream);
void char_cnn_launch(const CharCnnParams& params, cudaStream_t stream);
void char_cnn_argmax_launch(const CharCnnParams& params, cudaStream_t stream);
void char_cnn_hist_launch(const CharCnnHistParams& params, cudaStream_t stream);

}  // namespace gpu
}  // namespace elmo_fast
