// Pieces shared by the CPU LSTM kernels: the inference stack `bilstm` (lstm_cpu.cpp) and the trainable
// layer `lstm_layer_forward` / `lstm_layer_backward` (lstm_layer_cpu.cpp):
//   * the per-ISA compilation of float kernels and the choice of level (kernel_isa),
//   (the plan, rows sorted by length and stored packed step after step, is both backends': lstm_plan.h)
//   * the GEMMs of one step (linear_nt: the op's own GEMV for few rows, else BLAS) and how the two
//     directions share the threads (for_each_direction); which of these runs is tuning.h's choice.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>
#include <c10/util/irange.h>

#include <cstdint>
#include <vector>

#include "lstm_plan.h"

namespace elmo_fast {
namespace lstm_cpu {

// The float kernels are compiled once per ISA level (the extension itself is built for baseline
// x86-64) and the level is picked once per process, as ATen picks its own kernels:
// at::get_cpu_capability() (which honours ATEN_CPU_CAPABILITY). GCC 12's target_clones with
// "arch=x86-64-v4" never selects that clone (its resolver asks __builtin_cpu_is), hence this.
enum class Isa { kBase, kAvx2, kAvx512 };

Isa kernel_isa();

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ELMO_FAST_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,prefer-vector-width=512")))
#define ELMO_FAST_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define ELMO_FAST_HAVE_ISA_VARIANTS 1
#endif

// name(params, begin, end) running kernel(params, begin, end) built for the CPU's ISA level.
#ifdef ELMO_FAST_HAVE_ISA_VARIANTS
#define ELMO_FAST_ISA_DISPATCHED(name, Params, kernel)                                                   \
  ELMO_FAST_TARGET_AVX512 void name##_avx512(const Params& p, int64_t b, int64_t e) { kernel(p, b, e); } \
  ELMO_FAST_TARGET_AVX2 void name##_avx2(const Params& p, int64_t b, int64_t e) { kernel(p, b, e); }     \
  void name##_base(const Params& p, int64_t b, int64_t e) { kernel(p, b, e); }                           \
  void name(const Params& p, int64_t b, int64_t e) {                                                     \
    switch (::elmo_fast::lstm_cpu::kernel_isa()) {                                                       \
      case ::elmo_fast::lstm_cpu::Isa::kAvx512: return name##_avx512(p, b, e);                           \
      case ::elmo_fast::lstm_cpu::Isa::kAvx2: return name##_avx2(p, b, e);                               \
      default: return name##_base(p, b, e);                                                              \
    }                                                                                                    \
  }
#else
#define ELMO_FAST_ISA_DISPATCHED(name, Params, kernel) \
  void name(const Params& p, int64_t b, int64_t e) { kernel(p, b, e); }
#endif

// One GEMM operand of weights: w [N, K] contiguous (the dtype of the states, or bfloat16) and its
// transposed view, so that BLAS computes x @ w^T without copies.
struct Weight {
  at::Tensor w;    // [N, K]
  at::Tensor w_t;  // [K, N]
};

// Work below these sizes stays on the calling thread (ATen's GRAIN_SIZE is 32768 elements).
constexpr int64_t kCellGrainElements = 16384;
constexpr int64_t kElemGrain = 32768;

// at::empty(sizes, options) for large buffers the kernels write once per call (a training step
// writes several hundred MB of them): 2 MB aligned and madvise(MADV_HUGEPAGE), so that their first
// touch faults in 2 MB pages instead of 4 kB ones (~0.9 ms per MB saved on the machine this was
// measured on; what PyTorch's THP_MEM_ALLOC_ENABLE=1 does for every allocation). Small buffers, other
// systems, and deterministic mode's fill of uninitialized memory (which tests use to poison
// outputs) get at::empty; so does every buffer with ELMO_FAST_HUGE_PAGES=0 (for benchmarking).
at::Tensor empty_large(at::IntArrayRef sizes, const at::TensorOptions& options);

// A [rows, cols] contiguous view of the front of a flat buffer.
inline at::Tensor front(const at::Tensor& flat, int64_t rows, int64_t cols) {
  return flat.narrow(0, 0, rows * cols).view({rows, cols});
}

// out[n, N] = a[n, K] @ w^T, all in the states' dtype but w, which may be bf16. Few rows (float
// states): gemv_nt, which streams w once and keeps a in fp32 even for bf16 weights; else BLAS. A
// float32 packed w (packed_weight.h): oneDNN's BRGeMM micro-kernel at any row count.
// a and out: rows contiguous (any row stride).
void linear_nt(at::Tensor& out, const at::Tensor& a, const Weight& w, int64_t gemv_max_rows);

// run(d) for d = 0, 1: concurrently on two threads, or in turn.
template <typename Fn>
void for_each_direction(bool concurrent, const Fn& run) {
  if (concurrent) {
    // The worker thread runs ATen ops on tensors made here: it needs this thread's dispatch state
    // (inference mode, grad mode), which at::parallel_for does not carry over.
    const at::ThreadLocalState caller_state;
    at::parallel_for(0, 2, 1, [&](int64_t d0, int64_t d1) {
      const at::ThreadLocalStateGuard state_guard(caller_state);
      for (const auto d : c10::irange(d0, d1)) {
        run(d);
      }
    });
  } else {
    for (const auto d : c10::irange(2)) {
      run(d);
    }
  }
}

}  // namespace lstm_cpu
}  // namespace elmo_fast
