// CUDA kernels of the trainable projected-LSTM layer, both directions of one layer per launch: the
// pointwise passes of lstm_layer_forward and lstm_layer_backward (host loop and GEMMs: ATen, in
// lstm_layer_cuda.cpp; oracle: elmo_fast.bilm.reference.lstm_layer_pair_ref under autograd; CPU twin:
// csrc/cpu/lstm_layer_pointwise.h, whose formulas these are). One step of one row:
//   z = xg + h_prev W_hh^T;  i, f, o = sig(z_i, z_f, z_o), g = tanh(z_g)
//   c_raw = i g + f c_prev;  c = clip(c_raw, cell_clip);  m = o tanh(c)
//   p_raw = m W_proj^T;      h = clip(p_raw, proj_clip)   (the step's output and next h_prev)
// Clips have zero gradient where they bind (it passes where -clip <= x <= clip).
//
// Rows and packed positions as in lstm_plan.h (sorted rows, step s owns the n_s packed rows from
// offset_s); both directions in each launch (d = 0, 1 the slowest index). `saved` [2, N, 6C + P]
// is the forward's record for the backward, the CPU op's layout: per direction (at d * N (6C + P))
// four packed matrices, ACT [N, 4C] (i f g o), C_RAW [N, C], M [N, C], P_RAW [N, P].
// float32 and float64 (the CPU op's dtypes); the cell state is kept in the element type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dtype.h"

namespace elmo_fast {
namespace gpu {

// The element offsets of `saved`'s matrices for N packed rows.
struct LstmSavedLayout {
  int64_t direction;  // N (6C + P): from direction 0 to 1
  int64_t act;        // 0: ACT [N, 4C]
  int64_t c_raw;      // 4 C N: C_RAW [N, C]
  int64_t m;          // 5 C N: M [N, C]
  int64_t p_raw;      // 6 C N: P_RAW [N, P]
};

#ifdef __CUDACC__
#define ELMO_HOST_DEVICE __host__ __device__
#else
#define ELMO_HOST_DEVICE
#endif

inline ELMO_HOST_DEVICE LstmSavedLayout lstm_saved_layout(int64_t total, int64_t cell, int64_t proj) {
  return LstmSavedLayout{total * (6 * cell + proj), 0, 4 * cell * total, 5 * cell * total, 6 * cell * total};
}

// Forward, after the recurrent GEMM wrote h_prev W_hh^T into the step's ACT rows: the gates, the cell
// (state updated, C_RAW and M saved), ACT overwritten with the activations.
struct LstmCellSaveParams {
  const void* xg;         // [2, R, 4C] contiguous input gates (x W_ih^T + bias)
  const int64_t* xg_row;  // [2, N] the row of xg (within its direction) of each packed position
  void* saved;            // [2, N, 6C + P] (layout above)
  void* c;                // [2, B, C] contiguous cell state of the sorted rows; rows i < n updated
  int64_t n;              // running rows n_s >= 1
  int64_t batch;          // B
  int64_t rows;           // R, rows of xg per direction
  int64_t total;          // N, packed positions per direction
  int64_t offset;         // offset_s
  int64_t cell;           // C
  int64_t proj;           // P
  double cell_clip;       // +inf: no clip
  Dtype dtype;            // kFloat32 or kFloat64, of every tensor
};

// Forward, after the projection GEMM wrote m W_proj^T into the step's P_RAW rows: h = clip(p_raw)
// into the packed h (the next step's h_prev) and the output.
struct LstmProjSaveParams {
  const void* saved;        // [2, N, 6C + P]: P_RAW read
  void* h;                  // [2, N, P] contiguous packed h; rows offset..offset + n written
  void* y;                  // [2, B, T, P] contiguous output
  const int64_t* y_offset;  // [2, N] element offset in y of each packed position's row
  int64_t n;
  int64_t total;
  int64_t offset;
  int64_t cell;
  int64_t proj;
  double proj_clip;  // +inf: no clip
  Dtype dtype;
};

// Backward, first pass of a step: the gradient of p_raw from the output's gradient and the recurrent
// gradient of h, masked where the projection clip bound.
struct LstmProjGradParams {
  const void* grad_y;            // the output gradient, or nullptr (zeros)
  const int64_t* grad_y_offset;  // [2, N] element offset in grad_y of each packed position's row
  const void* dh;                // [2, B, P] contiguous gradient of the sorted rows' h (from later steps)
  const void* saved;             // P_RAW read
  void* dp;                      // [2, N, P] contiguous; rows offset..offset + n written
  int64_t n;
  int64_t batch;
  int64_t total;
  int64_t offset;
  int64_t cell;
  int64_t proj;
  double proj_clip;
  Dtype dtype;
};

// Backward cell pass of a step: from dm = dp W_proj and the cell's gradient after the step, the
// gradients of the gate pre-activations (packed) and of the cell before the step.
struct LstmCellGradParams {
  const void* saved;  // ACT and C_RAW read
  const void* c0;     // [2, B, C] contiguous sorted initial cell: step 0's c_prev (not clipped)
  const void* dm;     // [2, n, C] contiguous
  void* dc;           // [2, B, C] contiguous; rows i < n: in the gradient of the clipped cell
                      //   after the step, out that of the cell before it
  void* dgates;       // [2, N, 4C] contiguous; rows offset..offset + n written
  int64_t n;
  int64_t batch;
  int64_t total;
  int64_t offset;
  int64_t prev_offset;  // offset_{s-1}: c_prev is that step's C_RAW, clipped; -1 at step 0 (c0)
  int64_t cell;
  int64_t proj;
  double cell_clip;
  Dtype dtype;
};

// Enqueue on `stream`; nothing when n or the width is 0. The caller checks each launch.
void lstm_cell_save_launch(const LstmCellSaveParams& params, cudaStream_t stream);
void lstm_proj_save_launch(const LstmProjSaveParams& params, cudaStream_t stream);
void lstm_proj_grad_launch(const LstmProjGradParams& params, cudaStream_t stream);
void lstm_cell_grad_launch(const LstmCellGradParams& params, cudaStream_t stream);

}  // namespace gpu
}  // namespace elmo_fast
