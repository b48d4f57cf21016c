// The choices the CPU kernels make between equivalent ways of computing the same values (a GEMV of
// their own or BLAS for a GEMM of few rows; the two LSTM directions concurrently or in turn), taken
// as plain arguments. Python measures them on the user's machine (elmo_fast/tuning/calibration.py) and
// passes them to the ops; without them (tuning=None) the kernels take the defaults in tuning.cpp, the
// constants measured once on a 2-core AMD Zen 4. Environment variables force a choice over both
// (for benchmarks and tests): ELMO_FAST_BILSTM_GEMV_ROWS=N, ELMO_FAST_BILSTM_THREADS=sequential|directions;
// any other value is an error naming the variable. Where one is set, the calibration measures and
// stores nothing in that process (its timings would all run the forced schedule).
//
// The ops' `int[]? tuning` (bilstm, lstm_layer_forward, lstm_layer_backward):
//   [gemv_rows_in_turn, gemv_rows_concurrent, concurrent_min_rows]
//   gemv_rows_*: GEMMs of at most this many rows take gemv_nt, the others BLAS (0: never gemv_nt),
//     when the directions run in turn (each GEMM on all threads) / concurrently (one thread each);
//   concurrent_min_rows: the directions run concurrently when the first step has at least this many
//     rows (0: never);
//   -1 in any place: that value's default (a calibration that could not measure it).
// The `int? gemv_max_rows` of linear and highway: GEMMs of at most this many rows take gemv_nt.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace elmo_fast {
namespace lstm_cpu {

struct LstmTuning {
  int64_t gemv_rows_in_turn = 0;
  int64_t gemv_rows_concurrent = 0;
  int64_t concurrent_min_rows = 0;
};

// The tuning of an LSTM op (kOp, for errors): `tuning` checked (3 values, each >= -1), its -1s and
// a missing `tuning` taking the defaults for these weights (bf16 or not, W_hh [4C, P] of
// `recurrent_weight_bytes`); then the environment's overrides.
LstmTuning lstm_tuning(const char* kOp, std::optional<at::IntArrayRef> tuning, bool bf16_weights,
                       int64_t recurrent_weight_bytes);

// Whether the two directions run concurrently, given the first step's rows: never with one thread
// or inside a parallel region.
bool directions_concurrent(const LstmTuning& tuning, int64_t first_rows);

// GEMMs of at most this many rows take gemv_nt, the directions running concurrently or not.
inline int64_t gemv_rows(const LstmTuning& tuning, bool concurrent) {
  return concurrent ? tuning.gemv_rows_concurrent : tuning.gemv_rows_in_turn;
}

// The GEMV threshold of linear / highway (kOp, argument `gemv_max_rows`): the given value (>= 0) or
// the default for float weights of `weight_bytes` (ELMO_FAST_BILSTM_GEMV_ROWS is the LSTM's only).
int64_t linear_gemv_rows(const char* kOp, std::optional<int64_t> gemv_max_rows, int64_t weight_bytes);

// The default threshold for float weights of this many bytes (see tuning.cpp).
int64_t default_gemv_rows(int64_t weight_bytes);

}  // namespace lstm_cpu
}  // namespace elmo_fast
