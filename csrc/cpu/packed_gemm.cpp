// GEMMs against packed weights (see packed_gemm.h) and the op `pack_weight`.
#include "cpu/packed_gemm.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <exception>
#include <type_traits>

#include "checks.h"
#include "packed_weight.h"

namespace elmo_fast {
namespace cpu_gemm {

namespace {

// Rows of `a` per micro-kernel call. oneDNN generates (and caches, per thread) one kernel per
// distinct (M, N, K, ld*); a fixed block keeps the variety to the block and the tails of a batch.
constexpr int64_t kRowBlock = 32;

// Depth per micro-kernel call. The micro-kernel sums each output over its whole K in one register,
// term after term: over K = 4,096 (ELMo's projection) that sequential sum's rounding is several times
// an MKL SGEMM's, which blocks K. Calls of 256 added into the output (add_C) bound each sequential run
// to 256 terms, as the plain path's GEMMs do: the fp32 error of a packed and a plain model agree.
constexpr int64_t kDepthBlock = 256;

// The widest block of output columns dividing N that AMX's kernels take (16, 32, 48 or 64; 48 only
// when nothing else divides N is never needed: N a multiple of 16 has one of 64, 32, 16).
int64_t column_block(int64_t N) { return N % 64 == 0 ? 64 : N % 32 == 0 ? 32 : 16; }

// Whether ATen's BRGeMM runs bf16 VNNI blocks on this CPU: ATen decides once per process from oneDNN's
// ISA (and refuses, raising, where the micro-kernel is missing), so one call on a tiny block tells.
bool bf16_brgemm_runs() {
  try {
    const c10::BFloat16 a[2] = {c10::BFloat16(1.0f), c10::BFloat16(2.0f)};
    c10::BFloat16 b[32];
    std::fill(b, b + 32, c10::BFloat16(1.0f));
    float c[16];
    at::native::cpublas::brgemm(1, 16, 2, 2, 16, 16, /*add_C=*/false, a, b, c, /*is_vnni=*/true);
    at::native::cpublas::brgemm_release(/*is_vnni=*/true);
    return c[0] == 3.0f && c[15] == 3.0f;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

bool packed_gemm_available(at::ScalarType dtype) {
  if (dtype == at::kFloat) {
    return true;
  }
  if (dtype != at::kBFloat16 || !at::globalContext().userEnabledMkldnn()) {
    return false;  // with oneDNN disabled, ATen's BRGeMM refuses bf16 VNNI blocks
  }
  static const bool runs = bf16_brgemm_runs();  // asked with oneDNN enabled: ATen's answer is fixed then
  return runs;
}

at::Tensor pack_weight(const at::Tensor& w) {
  static constexpr char kOp[] = "pack_weight";
  ELMO_CHECK(w.dim() == 2, "weight must have 2 dims [N, K], got ", w.dim());
  ELMO_CHECK(w.device().is_cpu(), "weight must be a CPU tensor, got ", w.device());
  const at::ScalarType dtype = w.scalar_type();
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "weight has dtype ", dtype_name(dtype),
             "; supported: float32, bfloat16");
  const int64_t N = w.size(0), K = w.size(1), g = dtype == at::kBFloat16 ? 2 : 1;
  ELMO_CHECK(N > 0 && N % 16 == 0 && K > 0 && K % g == 0, "weight [N, K] must have N a multiple of 16",
             g == 2 ? " and K even" : "", " to be packed, got ", w.sizes());
  ELMO_CHECK(g == 1 || packed_gemm_available(dtype),
             "this CPU cannot run packed bfloat16 weights (oneDNN's BRGeMM micro-kernel needs AVX-512 with "
             "BF16 or AMX, and torch.backends.mkldnn enabled): keep the weight as it is");
  const int64_t nb = column_block(N);
  // packed[j, k / g, c, k % g] = w[j nb + c, k]
  return w.contiguous().view({N / nb, nb, K / g, g}).permute({0, 2, 1, 3}).contiguous();
}

namespace {

template <typename scalar_t>
void packed_mm_impl(const char* kOp, float* out, int64_t ldo, const scalar_t* a, int64_t lda, int64_t n,
                    const at::Tensor& packed) {
  constexpr bool kVnni = std::is_same_v<scalar_t, c10::BFloat16>;
  constexpr at::ScalarType kDtype = c10::CppTypeToScalarType<scalar_t>::value;
  ELMO_CHECK(is_packed_weight(packed) && packed.scalar_type() == kDtype, "a packed weight (pack_weight) of dtype ",
             dtype_name(kDtype), " is needed here, got a tensor of dtype ", dtype_name(packed.scalar_type()),
             " and shape ", packed.sizes());
  ELMO_CHECK(!kVnni || packed_gemm_available(kDtype),
             "bfloat16 weights packed for oneDNN's BRGeMM micro-kernel cannot run now (torch.backends.mkldnn "
             "is disabled, or this CPU lacks AVX-512 with BF16 or AMX): use weights that are not packed");
  const int64_t blocks = packed.size(0), K = packed.size(1) * packed.size(3), nb = packed.size(2);
  const scalar_t* w = packed.const_data_ptr<scalar_t>();
  if (n <= 0) {
    return;
  }
  const int64_t row_blocks = (n + kRowBlock - 1) / kRowBlock;
  // Tasks column block major: a thread's consecutive tasks share a block of weights (in L1/L2).
  at::parallel_for(0, blocks * row_blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t j = t / row_blocks, r0 = (t % row_blocks) * kRowBlock;
      const int64_t m = std::min(kRowBlock, n - r0);
      // packed[j, k / g, c, k % g]: depth k0 (a multiple of g) of column block j starts at (j K + k0) nb
      for (int64_t k0 = 0; k0 < K; k0 += kDepthBlock) {
        const int64_t k = std::min(kDepthBlock, K - k0);
        at::native::cpublas::brgemm(m, nb, k, lda, nb, ldo, /*add_C=*/k0 > 0, a + r0 * lda + k0, w + (j * K + k0) * nb,
                                    out + r0 * ldo + j * nb, /*is_vnni=*/kVnni);
      }
    }
    at::native::cpublas::brgemm_release(/*is_vnni=*/kVnni);  // AMX: give the tile state back
  });
}

}  // namespace

void packed_mm(const char* kOp, float* out, int64_t ldo, const c10::BFloat16* a, int64_t lda, int64_t n,
               const at::Tensor& packed) {
  packed_mm_impl(kOp, out, ldo, a, lda, n, packed);
}

void packed_mm(const char* kOp, float* out, int64_t ldo, const float* a, int64_t lda, int64_t n,
               const at::Tensor& packed) {
  packed_mm_impl(kOp, out, ldo, a, lda, n, packed);
}

// dtype -> whether packed weights of it run here (packed_gemm_available), for the calibration.
bool packed_gemm_available_op(at::ScalarType dtype) { return packed_gemm_available(dtype); }

}  // namespace cpu_gemm
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(elmo_fast, CPU, m) { m.impl("pack_weight", &elmo_fast::cpu_gemm::pack_weight); }

// No tensor argument to dispatch on: one kernel for every key.
TORCH_LIBRARY_IMPL(elmo_fast, CompositeExplicitAutograd, m) {
  m.impl("packed_gemm_available", &elmo_fast::cpu_gemm::packed_gemm_available_op);
}
