// CPU `linear`: out[n, N] = x[n, K] @ weight[N, K]^T + bias (oracle: reference.linear_ref, F.linear).
// Few rows of x against large weights (layer 0's input gates of one sentence's distinct tokens: 27
// rows against 2 x 33.5 MB at 'original' shapes) make a pass over the weights, which MKL's sgemm
// reads at a fraction of memory bandwidth (27 rows: ~90 GFLOP/s, 13 GB/s, on the Zen 5 this was
// measured on). They take the LSTM steps' GEMV (lstm_gemv.h, through lstm_cpu::linear_nt), which
// streams the weights once; other shapes and dtypes take ATen's addmm. How many rows are few is the
// caller's measured choice (`gemv_max_rows`, tuning.h). A packed weight (pack_weight) with float32 x
// runs oneDNN's BRGeMM micro-kernel (packed_gemm.h): x rounded to bf16 for a bf16 weight; a float32 result.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <optional>

#include "checks.h"
#include "cpu/lstm_common.h"
#include "cpu/packed_gemm.h"
#include "cpu/tuning.h"
#include "packed_weight.h"

namespace elmo_fast {
namespace {

// x [n, K] float32, weight packed [N, K], bias [N] float32 or None -> [n, N] float32.
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static constexpr char kOp[] = "linear";
  ELMO_CHECK(x.scalar_type() == at::kFloat, "with a packed weight x must have dtype float32, got ",
             dtype_name(x.scalar_type()));
  const std::vector<int64_t> wsize = weight_sizes(weight);
  const int64_t n = x.size(0), N = wsize[0], K = wsize[1];
  ELMO_CHECK(x.size(1) == K, "x [n, K] and weight [N, K] (packed) must have the same K, got x ", x.sizes(),
             " and weight [", N, ", ", K, "]");
  if (bias.has_value()) {
    ELMO_CHECK(bias->device().is_cpu(), "bias must be a CPU tensor, got ", bias->device());
    ELMO_CHECK(bias->scalar_type() == at::kFloat, "bias must have dtype float32, got ",
               dtype_name(bias->scalar_type()));
    ELMO_CHECK(bias->sizes() == at::IntArrayRef({N}), "bias expected shape [", N, "], got ", bias->sizes());
  }
  at::Tensor out = at::empty({n, N}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const at::Tensor w = weight.contiguous();
  if (w.scalar_type() == at::kBFloat16) {
    const at::Tensor x16 = x.to(at::kBFloat16).contiguous();
    cpu_gemm::packed_mm(kOp, out.mutable_data_ptr<float>(), N, x16.const_data_ptr<at::BFloat16>(), K, n, w);
  } else {
    const at::Tensor xc = x.contiguous();
    cpu_gemm::packed_mm(kOp, out.mutable_data_ptr<float>(), N, xc.const_data_ptr<float>(), K, n, w);
  }
  if (bias.has_value()) {
    out.add_(*bias);
  }
  return out;
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      std::optional<int64_t> gemv_max_rows) {
  static constexpr char kOp[] = "linear";
  ELMO_CHECK_DIM(x, 2);
  ELMO_CHECK_CPU(x);
  ELMO_CHECK_CPU(weight);
  if (is_packed_weight(weight)) {
    return linear_packed(x, weight, bias);
  }
  ELMO_CHECK_DIM(weight, 2);
  ELMO_CHECK_SAME_DTYPE(weight, x);
  ELMO_CHECK(x.size(1) == weight.size(1), "x [n, K] and weight [N, K] must have the same K, got x ", x.sizes(),
             " and weight ", weight.sizes());
  const int64_t n = x.size(0);
  const int64_t N = weight.size(0);
  if (bias.has_value()) {
    ELMO_CHECK_CPU(*bias);
    ELMO_CHECK_SAME_DTYPE(*bias, x);
    ELMO_CHECK_SHAPE(*bias, N);
  }
  const int64_t weight_bytes = weight.numel() * static_cast<int64_t>(weight.element_size());
  if (x.scalar_type() == at::kFloat && n > 0 && n <= lstm_cpu::linear_gemv_rows(kOp, gemv_max_rows, weight_bytes)) {
    at::Tensor out = at::empty({n, N}, x.options());
    const at::Tensor w = weight.contiguous();
    const at::Tensor a = x.stride(1) == 1 ? x : x.contiguous();
    lstm_cpu::linear_nt(out, a, lstm_cpu::Weight{w, w.t()}, n);
    if (bias.has_value()) {
      out.add_(*bias);
    }
    return out;
  }
  return bias.has_value() ? at::addmm(*bias, x, weight.t()) : at::mm(x, weight.t());
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(elmo_fast, CPU, m) { m.impl("linear", &elmo_fast::linear_cpu); }
