// CUDA biLSTM step kernels (oracle: elmo_fast.bilm.reference.bilstm_ref; host loop: lstm_cuda.cpp).
//
// Layout shared with the host loop. Rows are sorted by length, longest first (stable), so the rows
// still running at step s are a prefix i < n_s, the same prefix for both directions: the forward
// direction is at t = s, the backward one at t = length - 1 - s (each row's own reversed time).
// "Packed" positions list (step, sorted row) pairs step-major: step s owns the n_s packed rows
// starting at offset_s, and the layer inputs, input gates and outputs of every layer use it.
// Both directions run in the same launches: d (0 forward, 1 backward) is the slowest index.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dtype.h"

namespace elmo_fast {
namespace gpu {

// Step s: gates = input gates + recurrent gates; i, f, o = sigmoid, g = tanh (gate order i, f, g, o);
// c = clip(i * g + f * c); m = o * tanh(c).
struct LstmGatesParams {
  const void* xg;          // layer 0: xg0 [U, 2, 4C]; layers >= 1: [2, total, 4C] packed input gates
  const int64_t* xg0_row;  // layer 0: [2, total] row of xg0 at each packed position; nullptr otherwise
  const void* rec;         // [2, n, 4C] h W_hh^T of the running rows, contiguous
  void* c;                 // [2, batch, C] cell state in the math type; rows i < n updated in place
  void* m;                 // [2, n, C] o * tanh(c), contiguous (the projection GEMM's input)
  int64_t n;               // running rows n_s >= 1
  int64_t batch;           // B
  int64_t total;           // packed positions per direction (sum of lengths)
  int64_t offset;          // offset_s
  int64_t cell;            // C
  double cell_clip;        // > 0: clamp c to [-cell_clip, cell_clip]; 0: no clip
  Dtype dtype;             // of xg, rec, m
};

// Step s: h = clip(m W_proj^T); the layer's output is h (+ the layer's input for layers >= 1).
struct LstmOutputParams {
  const void* hproj;       // [2, n, P] m W_proj^T, contiguous
  void* h;                 // [2, batch, P] hidden state; rows i < n updated in place
  void* y;                 // [2, total, P] packed layer outputs: the previous layer's (read if skip),
                           //   overwritten with this layer's (if write_y); nullptr if neither
  void* out;               // [B * T, 2P] this layer's slice of the outputs, contiguous
  const int64_t* out_row;  // [2, total] b * T + t of each packed position
  int64_t n;               // running rows n_s >= 1
  int64_t batch;           // B
  int64_t total;           // packed positions per direction
  int64_t offset;          // offset_s
  int64_t proj;            // P
  double proj_clip;        // > 0: clamp h to [-proj_clip, proj_clip]; 0: no clip
  bool skip;               // add the layer's input (the previous layer's output): layers >= 1
  bool write_y;            // keep this layer's output for the next layer
  Dtype dtype;             // of hproj, h, y, out
};

// Enqueue on `stream`; nothing when n or the width is 0. The caller checks each launch.
void lstm_gates_launch(const LstmGatesParams& params, cudaStream_t stream);
void lstm_output_launch(const LstmOutputParams& params, cudaStream_t stream);

}  // namespace gpu
}  // namespace elmo_fast
