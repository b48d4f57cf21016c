// The shared pieces of the CPU LSTM kernels (see lstm_common.h).
#include "cpu/lstm_common.h"

#include <ATen/Context.h>
#include <ATen/Version.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <c10/util/accumulate.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <string>
#include <vector>

#include "cpu/lstm_gemv.h"

namespace elmo_fast {
namespace lstm_cpu {

Isa kernel_isa() {
  static const Isa isa = [] {
    const std::string cap = at::get_cpu_capability();
    return cap == "AVX512" ? Isa::kAvx512 : cap == "AVX2" ? Isa::kAvx2 : Isa::kBase;
  }();
  return isa;
}

namespace {
ELMO_FAST_ISA_DISPATCHED(gemv_nt_f32, lstm::GemvParams<float>, lstm::gemv_nt)
ELMO_FAST_ISA_DISPATCHED(gemv_nt_bf16, lstm::GemvParams<uint16_t>, lstm::gemv_nt)
ELMO_FAST_ISA_DISPATCHED(gemv_nt_bf16_pairs, lstm::GemvPairsParams, lstm::gemv_nt_pairs)
}  // namespace

at::Tensor empty_large(at::IntArrayRef sizes, const at::TensorOptions& options) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize();
  const at::Context& ctx = at::globalContext();
  static const bool disabled = [] {
    const char* env = std::getenv("ELMO_FAST_HUGE_PAGES");  // =0: plain at::empty, for benchmarking
    return env != nullptr && std::string(env) == "0";
  }();
  if (!disabled && bytes >= 2 * kHuge && !(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory())) {
    void* data = nullptr;
    const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    if (posix_memalign(&data, kHuge, rounded) == 0) {
      madvise(data, rounded, MADV_HUGEPAGE);  // advice only: a failure leaves 4 kB pages
      return at::from_blob(data, sizes, [](void* p) { std::free(p); }, options);
    }
  }
#endif
  return at::empty(sizes, options);
}

void linear_nt(at::Tensor& out, const at::Tensor& a, const Weight& w, int64_t gemv_max_rows) {
  const int64_t n = a.size(0);
  const int64_t N = w.w.size(0);
  const int64_t K = w.w.size(1);
  const bool bf16 = w.w.scalar_type() == at::kBFloat16;
  if (out.scalar_type() == at::kFloat && n <= gemv_max_rows) {
    const int64_t grain = std::max<int64_t>(64, kElemGrain / std::max<int64_t>(K * n, 1));
    const auto run = [&](auto params, auto kernel) {
      params.a = a.const_data_ptr<float>();
      params.lda = a.stride(0);
      params.ldw = K;
      params.out = out.mutable_data_ptr<float>();
      params.ldo = out.stride(0);
      params.n = n;
      params.k = K;
      at::parallel_for(0, N, grain, [&](int64_t g0, int64_t g1) { kernel(params, g0, g1); });
    };
    const void* w_data = w.w.const_data_ptr();
    if (bf16 && K % 2 == 0 && reinterpret_cast<uintptr_t>(w_data) % alignof(uint32_t) == 0) {
      // Word pairs (lstm_gemv.h): a's rows split into even and odd halves first, on this thread
      // (n * K floats: a few KB at the few rows that take this path).
      std::vector<float> split(static_cast<size_t>(n * K));
      lstm::even_odd_split(a.const_data_ptr<float>(), a.stride(0), K, split.data(), 0, n);
      lstm::GemvPairsParams p;
      p.a_split = split.data();
      p.w = static_cast<const uint32_t*>(w_data);
      p.ldw = K / 2;
      p.out = out.mutable_data_ptr<float>();
      p.ldo = out.stride(0);
      p.n = n;
      p.k = K;
      at::parallel_for(0, N, grain, [&](int64_t g0, int64_t g1) { gemv_nt_bf16_pairs(p, g0, g1); });
    } else if (bf16) {
      lstm::GemvParams<uint16_t> p;
      p.w = reinterpret_cast<const uint16_t*>(w.w.const_data_ptr<at::BFloat16>());
      run(p, gemv_nt_bf16);
    } else {
      lstm::GemvParams<float> p;
      p.w = w.w.const_data_ptr<float>();
      run(p, gemv_nt_f32);
    }
    return;
  }
  TORCH_INTERNAL_ASSERT(!bf16, "bilstm: bf16 weights take the oneDNN step");
  at::mm_out(out, a, w.w_t);
}

// Tuned on a 2-core AMD Zen 4 (32 MB L3), 'original' shapes (P = 512, C = 4096), T = 27; see
// benchmarks/bench_lstm.py and the commit messages for the measurements.
//
// Steps with at most this many active rows use gemv_nt rather than BLAS. float: gemv_nt streams
// W_hh once per step, so it wins where the weights come from memory: with 'original' (W_hh 32 MB)
// the 4x4-blocked gemv_nt beat MKL sgemm at every n measured (1..128; e.g. B = 64: 1466 vs 1614 ms
// per call), so BLAS only takes larger batches. Weights that stay in the caches favour BLAS's reuse
// from a few dozen rows on (bench_lstm.py --ragged, ms per call at B = 64 with 128 / 32 / 0 rows:
// 'small' (W_hh 2 MB) 69.4 / 60.5 / 58.0, 'medium' (8 MB) 260 / 241 / 258, 'original' 883 / 1021
// at 128 / 32; at B = 16 32 rows match 128 and beat 0): 32 rows below 16 MB of W_hh.
// bf16: gemv_nt widens the weights and computes in fp32, which oneDNN's bf16 dot products outrun
// from n = 4 on; it keeps n <= 2 (B = 1: 62 vs 102 ms).
// ELMO_FAST_BILSTM_GEMV_ROWS overrides, for benchmarking and tests.
int64_t gemv_max_rows(bool bf16_weights, int64_t proj, int64_t cell) {
  const char* env = std::getenv("ELMO_FAST_BILSTM_GEMV_ROWS");
  if (env != nullptr) {
    return std::atoll(env);
  }
  if (bf16_weights) {
    return 2;
  }
  return gemv_max_rows_for(4 * cell * proj * static_cast<int64_t>(sizeof(float)));
}

int64_t gemv_max_rows_for(int64_t weight_bytes) {
  return weight_bytes >= (int64_t{16} << 20) ? 128 : 32;
}

// How the two directions share the threads: concurrently, one each with single-threaded GEMMs
// (true), or in turn, each GEMM and pass on all threads (false). Small batches are bound by
// reading the weights: in turn, one (layer, direction)'s weights are read by both threads and, in
// bf16 (20 MB), stay in L3 from step to step (B = 1 fp32: 102 vs 155 ms; bf16: 62 vs 136 ms).
// Larger batches are compute-bound and single-threaded GEMMs run closer to peak (B = 16 fp32: 483
// vs 545 ms; bf16 from B = 64: 814 vs 886 ms).
// ELMO_FAST_BILSTM_THREADS=sequential|directions overrides, for benchmarking.
bool directions_in_parallel(int64_t rows, bool bf16_weights) {
  if (at::get_num_threads() < 2 || at::in_parallel_region()) {
    return false;
  }
  const char* env = std::getenv("ELMO_FAST_BILSTM_THREADS");
  if (env != nullptr && std::string(env) == "sequential") {
    return false;
  }
  if (env != nullptr && std::string(env) == "directions") {
    return true;
  }
  return rows > (bf16_weights ? 32 : 8);
}

}  // namespace lstm_cpu
}  // namespace elmo_fast
