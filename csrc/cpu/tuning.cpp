// The CPU kernels' choices as plain arguments, their defaults and their environment overrides (see
// tuning.h). The measurement that makes them on the user's machine is elmo_fast/tuning/calibration.py.
#include "cpu/tuning.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "checks.h"

namespace elmo_fast {
namespace lstm_cpu {

namespace {

// The defaults, measured on a 2-core AMD Zen 4 (32 MB L3), 'original' shapes (P = 512, C = 4096),
// T = 27 (benchmarks/bench_lstm.py; the commit messages hold the measurements). On other CPUs the
// calibration measures them instead: on a 2-vCPU Intel Xeon with a 480 MB L3 the float threshold
// below cost 21% at batch 64 (its weights stay in cache, where BLAS wins).
//
// float: gemv_nt streams W_hh once per step, so it wins where the weights come from memory: with
// 'original' (W_hh 32 MB) it beat MKL sgemm at every n measured (1..128), so BLAS only takes larger
// batches. Weights that stay in the caches favour BLAS's reuse from a few dozen rows on: 32 rows
// below 16 MB of W_hh.
// bf16: gemv_nt widens the weights and computes in fp32, which oneDNN's bf16 dot products outrun
// from n = 4 on; it keeps n <= 2 (B = 1: 62 vs 102 ms).
// Directions: small batches are bound by reading the weights: in turn, one (layer, direction)'s
// weights are read by both threads and, in bf16 (20 MB), stay in L3 from step to step (B = 1 fp32:
// 102 vs 155 ms; bf16: 62 vs 136 ms). Larger batches are compute-bound and single-threaded GEMMs run
// closer to peak (B = 16 fp32: 483 vs 545 ms; bf16 from B = 64: 814 vs 886 ms).
LstmTuning default_lstm_tuning(bool bf16_weights, int64_t recurrent_weight_bytes) {
  LstmTuning t;
  t.gemv_rows_in_turn = t.gemv_rows_concurrent = bf16_weights ? 2 : default_gemv_rows(recurrent_weight_bytes);
  t.concurrent_min_rows = bf16_weights ? 33 : 9;
  return t;
}

// The environment's overrides (for benchmarks and tests), read at every call; a value that is not one
// of the accepted ones is an error naming the variable (Python checks them first: elmo_fast/tuning).
// ELMO_FAST_BILSTM_GEMV_ROWS=N (digits only): GEMMs of at most N rows take gemv_nt, in either schedule.
std::optional<int64_t> gemv_rows_override(const char* kOp) {
  const char* env = std::getenv("ELMO_FAST_BILSTM_GEMV_ROWS");
  if (env == nullptr || *env == '\0') {
    return std::nullopt;
  }
  const std::string text(env);
  const bool digits =
      text.size() <= 10 && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t rows = digits ? std::stoll(text) : -1;
  ELMO_CHECK(digits && rows <= int64_t{2147483647}, "ELMO_FAST_BILSTM_GEMV_ROWS='", text,
             "' is not a row count: expected an integer from 0 to 2147483647 (or unset)");
  return rows;
}

// ELMO_FAST_BILSTM_THREADS=sequential (the directions in turn) | directions (on a thread each).
std::optional<int64_t> threads_override(const char* kOp) {
  const char* env = std::getenv("ELMO_FAST_BILSTM_THREADS");
  if (env == nullptr || *env == '\0') {
    return std::nullopt;
  }
  const std::string mode(env);
  ELMO_CHECK(mode == "sequential" || mode == "directions", "ELMO_FAST_BILSTM_THREADS='", mode,
             "' is not a schedule: expected sequential or directions (or unset)");
  return mode == "sequential" ? 0 : 1;
}

}  // namespace

int64_t default_gemv_rows(int64_t weight_bytes) { return weight_bytes >= (int64_t{16} << 20) ? 128 : 32; }

LstmTuning lstm_tuning(const char* kOp, std::optional<at::IntArrayRef> tuning, bool bf16_weights,
                       int64_t recurrent_weight_bytes) {
  LstmTuning t = default_lstm_tuning(bf16_weights, recurrent_weight_bytes);
  if (tuning.has_value()) {
    const at::IntArrayRef v = *tuning;
    ELMO_CHECK(v.size() == 3,
               "tuning must hold 3 values [gemv_rows_in_turn, gemv_rows_concurrent, "
               "concurrent_min_rows] or be None, got ",
               v.size(), " values");
    for (const int64_t x : v) {
      ELMO_CHECK(x >= -1, "tuning values must be >= 0, or -1 for the default, got ", v);
    }
    int64_t* fields[3] = {&t.gemv_rows_in_turn, &t.gemv_rows_concurrent, &t.concurrent_min_rows};
    for (size_t i = 0; i < 3; ++i) {
      if (v[i] >= 0) {
        *fields[i] = v[i];
      }
    }
  }
  if (const std::optional<int64_t> rows = gemv_rows_override(kOp)) {
    t.gemv_rows_in_turn = t.gemv_rows_concurrent = *rows;
  }
  if (const std::optional<int64_t> concurrent_min = threads_override(kOp)) {
    t.concurrent_min_rows = *concurrent_min;
  }
  return t;
}

bool directions_concurrent(const LstmTuning& tuning, int64_t first_rows) {
  if (at::get_num_threads() < 2 || at::in_parallel_region()) {
    return false;
  }
  return tuning.concurrent_min_rows > 0 && first_rows >= tuning.concurrent_min_rows;
}

int64_t linear_gemv_rows(const char* kOp, std::optional<int64_t> gemv_max_rows, int64_t weight_bytes) {
  if (gemv_max_rows.has_value()) {
    ELMO_CHECK(*gemv_max_rows >= 0, "gemv_max_rows must be >= 0 or None, got ", *gemv_max_rows);
    return *gemv_max_rows;
  }
  return default_gemv_rows(weight_bytes);
}

}  // namespace lstm_cpu
}  // namespace elmo_fast
