// What the CPU kernels share: the runtime ISA dispatch (each hot loop compiled for AVX-512, AVX2 + FMA
// and the baseline, one picked per process), 64-byte aligned scratch, and the work-sharing loop over
// items on the intra-op threads. Header-only; kernels include it and know nothing of Python.
#pragma once

#include <ATen/Parallel.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

// Runtime ISA dispatch: a kernel written once with GCC/Clang vector extensions, as
//   struct MyKernel { template <int kVecBytes> static C10_ALWAYS_INLINE R run(args...); };
// is compiled three times by dispatch_isa<MyKernel>(args...), for AVX-512 (64-byte vectors), AVX2 + FMA
// (32 bytes) and the baseline (16 bytes: SSE2, or NEON elsewhere), each with its own vector width so that
// its accumulators fit its register file; the CPU's features pick one, once per process (cpu_isa).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELMO_X86_DISPATCH 1
#define ELMO_TARGET_AVX512 __attribute__((target("avx512f")))
#define ELMO_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define ELMO_X86_DISPATCH 0
#endif

namespace elmo_fast {
namespace cpu {

enum class Isa { kAvx512, kAvx2, kBase };

// The best variant this CPU runs, read once. ELMO_FAST_CPU_ISA=avx2 or =base caps it (so that
// tests and benchmarks on an AVX-512 machine exercise the other variants); other values are ignored.
inline Isa cpu_isa() {
  static const Isa isa = [] {
    Isa best = Isa::kBase;
#if ELMO_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
      best = Isa::kAvx512;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      best = Isa::kAvx2;
    }
#endif
    const char* cap = std::getenv("ELMO_FAST_CPU_ISA");
    if (cap != nullptr && std::strcmp(cap, "base") == 0) {
      return Isa::kBase;
    }
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0 && best == Isa::kAvx512) {
      return Isa::kAvx2;
    }
    return best;
  }();
  return isa;
}

#if ELMO_X86_DISPATCH
template <typename Kernel, typename... Args>
ELMO_TARGET_AVX512 auto run_avx512(const Args&... args) {
  return Kernel::template run<64>(args...);
}

template <typename Kernel, typename... Args>
ELMO_TARGET_AVX2 auto run_avx2(const Args&... args) {
  return Kernel::template run<32>(args...);
}
#endif

// Kernel::run<kVecBytes>(args...) for the widest vectors this CPU (and ELMO_FAST_CPU_ISA) allows.
template <typename Kernel, typename... Args>
auto dispatch_isa(const Args&... args) {
#if ELMO_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512: return run_avx512<Kernel>(args...);
    case Isa::kAvx2: return run_avx2<Kernel>(args...);
    case Isa::kBase: break;
  }
#endif
  return Kernel::template run<16>(args...);
}

// 64-byte aligned scratch (std::vector's 16-byte alignment would split every 64-byte load across
// two cache lines).
template <typename T>
struct AlignedArray {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data;
  AlignedArray() = default;
  explicit AlignedArray(int64_t count) {
    const size_t bytes = (static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T) + 63) / 64 * 64;
    data.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    TORCH_CHECK(data != nullptr, "char_cnn: cannot allocate ", bytes, " bytes of scratch");
  }
  T* get() const { return data.get(); }
};

// Runs body(item) for every item in [0, count) on the intra-op threads, each thread taking the
// next item from a shared counter: a thread that gets less CPU (a busy machine, another process
// on its core) does fewer items instead of holding the others up at the end.
template <typename Body>
void for_each_item(int64_t count, bool parallel, const Body& body) {
  const int64_t threads = parallel ? std::min<int64_t>(at::get_num_threads(), count) : 1;
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) {
      body(i);
    }
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      body(i);
    }
  });
}

}  // namespace cpu
}  // namespace elmo_fast
