// The shared pieces of the CPU LSTM kernels (see lstm_common.h).
#include "cpu/lstm_common.h"

#include <ATen/Context.h>
#include <ATen/Version.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <string>
#include <vector>

#include "checks.h"
#include "cpu/lstm_gemv.h"
#include "cpu/packed_gemm.h"
#include "packed_weight.h"

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
  if (!disabled && bytes >= 2 * kHuge &&
      !(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory())) {
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
  if (is_packed_weight(w.w)) {  // float32 packed (bf16 packed weights take bilstm's own step)
    static constexpr char kOp[] = "bilstm";
    ELMO_CHECK(w.w.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat && a.stride(1) == 1,
               "float32 packed weights need float32 states with unit-stride rows, got states of dtype ",
               dtype_name(a.scalar_type()), " and weights of dtype ", dtype_name(w.w.scalar_type()));
    cpu_gemm::packed_mm(kOp, out.mutable_data_ptr<float>(), out.stride(0), a.const_data_ptr<float>(), a.stride(0),
                        a.size(0), w.w);
    return;
  }
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
  TORCH_CHECK(!bf16, "bilstm: bfloat16 weights need float32 states, got states of dtype ", dtype_name(a.scalar_type()));
  at::mm_out(out, a, w.w_t);
}

}  // namespace lstm_cpu
}  // namespace elmo_fast
