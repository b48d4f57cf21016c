// CUDA binding and host loop of ELMo's stacked projected biLSTM (op `bilstm`; oracle:
// elmo_fast.bilm.reference.bilstm_ref; step kernels: lstm.cu, whose header describes the layout).
//
// Per call: rows are sorted longest first and the packed positions planned on the host (lstm_plan.h,
// the CPU op's plan; checks: lstm_args.h, the CPU op's), from the lengths there (lengths on the device
// are copied to the host first: a device sync; a fast model passes them on the host), then copied to
// the device without waiting for it (plan_upload.h: from pinned memory, or inside the kernel
// parameters under CUDA graph capture), so that a CUDA graph can capture the call. Per layer: the input gates of every
// packed position in one GEMM per direction (layers >= 1; layer 0's come precomputed per distinct
// token, xg0). Per step, both directions at once: the recurrent GEMM (bmm over [2, ...] stacked
// weights), one fused gate kernel, the projection GEMM (bmm), one fused output kernel. GEMMs are
// ATen's (cuBLAS, current stream; fp32 uses TF32 only if torch.backends.cuda.matmul.allow_tf32).
// Every buffer is allocated once per call; the time loop runs no Python and allocates no memory
// beyond ATen's tensor views.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/backend.h"
#include "cuda/binding_utils.h"
#include "cuda/lstm.h"
#include "cuda/plan_upload.h"
#include "lstm_args.h"
#include "lstm_plan.h"

namespace elmo_fast {
namespace {

// [2, r, c] of two same-shaped matrices (forward, backward). Without a copy when the backward one
// lies at a constant positive offset after the forward one in the same storage (a model that keeps
// its weights stacked passes such views); otherwise a stacked copy.
at::Tensor stack_pair(const at::Tensor& forward, const at::Tensor& backward) {
  if (forward.sizes() == backward.sizes() && forward.strides() == backward.strides() && forward.is_alias_of(backward)) {
    const int64_t delta = backward.storage_offset() - forward.storage_offset();
    if (delta > 0) {
      return at::as_strided(forward, {2, forward.size(0), forward.size(1)},
                            {delta, forward.stride(0), forward.stride(1)}, forward.storage_offset());
    }
  }
  return at::stack({forward, backward});
}

// xg0: [U, 2, 4C]; token_index: [B, T] int64; lengths: [B] int64 (CPU or CUDA); weights: 8L tensors
// (see the schema); cell_clip, proj_clip: None or 0 (no clip) or > 0; h0: [L, B, 2P], c0: [L, B, 2C]
// or None (tuning: the CPU op's, ignored) -> outputs [L, B, T, 2P] (zero at padding), h [L, B, 2P], c [L, B, 2C].
// Floating tensors share one dtype (float32, float64, bfloat16, float16) and one CUDA device; the
// cell state is kept in float32 (float64 for float64). token_index is clamped to [0, U) as the
// reference does (an out-of-range index is not an error here: checking would cost a device sync).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bilstm_cuda(
    const at::Tensor& xg0, const at::Tensor& token_index, const at::Tensor& lengths, at::TensorList weights,
    std::optional<double> cell_clip, std::optional<double> proj_clip, const std::optional<at::Tensor>& h0,
    const std::optional<at::Tensor>& c0, std::optional<at::IntArrayRef> /*tuning: the CPU op's*/) {
  static constexpr char kOp[] = "bilstm";
  const BilstmDims dims = bilstm_dims(xg0, token_index, weights);
  const int64_t L = dims.L, P = dims.P, C = dims.C, U = dims.U, B = dims.B, T = dims.T;
  ELMO_CHECK_GPU(xg0);
  ELMO_CHECK_CUDA_DTYPE(xg0);
  // One floating dtype for everything (the kernels take one): the weights have xg0's.
  const at::ScalarType dtype = xg0.scalar_type();
  check_bilstm_args(dims, xg0, token_index, lengths, weights, dtype, cell_clip, proj_clip, h0, c0);
  gpu::check_host_plan_under_capture(kOp, "lengths", lengths);

  const gpu::DeviceGuard guard(xg0.device());
  const at::TensorOptions opts = xg0.options().memory_format(at::MemoryFormat::Contiguous);

  // The plan is made on the host, from the lengths there: given on the device, they are copied to
  // the host, which waits for the device (the call's one sync). Given on the host (as a fast model
  // passes them), the call never waits for the device.
  const at::Tensor lengths_host = bilstm_host_lengths(dims, lengths);
  const LstmPlan plan = make_lstm_plan(lengths_host.const_data_ptr<int64_t>(), B, T);
  const int64_t steps = plan.steps();
  const int64_t total = plan.total();
  ELMO_CHECK(U > 0 || total == 0, "xg0 has no rows, but lengths asks for ", total, " positions");

  at::Tensor outputs = at::zeros({L, B, T, 2 * P}, opts);
  if (steps == 0) {  // no row takes a step: the states come out as they went in
    at::Tensor h = h0.has_value() ? h0->contiguous().clone() : at::zeros({L, B, 2 * P}, opts);
    at::Tensor c = c0.has_value() ? c0->contiguous().clone() : at::zeros({L, B, 2 * C}, opts);
    return {outputs, h, c};
  }

  // One upload: [order (B) | rank (B) | out_row (2 total)], out_row[d][r] = b T + t of packed position r.
  std::vector<int64_t> host(2 * B + 2 * total);
  std::copy(plan.order.begin(), plan.order.end(), host.begin());
  std::copy(plan.rank.begin(), plan.rank.end(), host.begin() + B);
  for (int64_t d = 0; d < 2; ++d) {
    plan.for_each_position(d,
                           [&](int64_t r, int64_t, int64_t b, int64_t t) { host[2 * B + d * total + r] = b * T + t; });
  }
  const at::Tensor plan_dev = gpu::plan_to_device(host, xg0.device());
  const at::Tensor order = plan_dev.narrow(0, 0, B);
  const at::Tensor rank = plan_dev.narrow(0, B, B);
  const at::Tensor out_row = plan_dev.narrow(0, 2 * B, 2 * total);  // [2 * total]
  // Layer 0 reads its input gates through token_index, clamped as the reference clamps.
  const at::Tensor xg0_row = token_index.reshape({B * T}).index_select(0, out_row).clamp_(0, U - 1).contiguous();
  const at::Tensor xg0_c = xg0.contiguous();

  // Buffers for the whole call. The per-step ones are used as contiguous [2, n_s, ...] prefixes.
  const at::TensorOptions math_opts = opts.dtype(gpu::math_dtype(dtype));
  at::Tensor rec_buf = at::empty({2 * B * 4 * C}, opts);
  at::Tensor m_buf = at::empty({2 * B * C}, opts);
  at::Tensor hproj_buf = at::empty({2 * B * P}, opts);
  at::Tensor h_state = at::empty({2, B, P}, opts);
  at::Tensor c_state = at::empty({2, B, C}, math_opts);
  at::Tensor y_buf = L > 1 ? at::empty({2, total, P}, opts) : at::Tensor();
  at::Tensor xg_buf = L > 1 ? at::empty({2, total, 4 * C}, opts) : at::Tensor();
  at::Tensor h_out = at::empty({L, B, 2 * P}, opts);
  at::Tensor c_out = at::empty({L, B, 2 * C}, opts);
  const cudaStream_t stream = gpu::current_stream();
  const gpu::Dtype gdtype = gpu::to_gpu_dtype(dtype);

  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* w = weights.data() + 8 * l;                        // forward: w[0..3], backward: w[4..7]
    const at::Tensor w_hh_t = stack_pair(w[1], w[5]).transpose(1, 2);    // [2, P, 4C]
    const at::Tensor w_proj_t = stack_pair(w[3], w[7]).transpose(1, 2);  // [2, C, P]
    if (l > 0) {  // input gates of every packed position: y_{l-1} W_ih^T + bias, one GEMM per direction
      for (int64_t d = 0; d < 2; ++d) {
        at::Tensor xg_d = xg_buf.select(0, d);
        at::addmm_out(xg_d, w[4 * d + 2], y_buf.select(0, d), w[4 * d].t());
      }
    }
    // Initial states in sorted row order: state[d][i] = h0[l][order[i]][d-th half].
    if (h0.has_value()) {
      h_state.copy_(h0->select(0, l).index_select(0, order).view({B, 2, P}).transpose(0, 1));
    } else {
      h_state.zero_();
    }
    if (c0.has_value()) {
      c_state.copy_(c0->select(0, l).index_select(0, order).view({B, 2, C}).transpose(0, 1));
    } else {
      c_state.zero_();
    }

    gpu::LstmGatesParams gp{};
    gp.xg = l == 0 ? xg0_c.const_data_ptr() : xg_buf.const_data_ptr();
    gp.xg0_row = l == 0 ? xg0_row.const_data_ptr<int64_t>() : nullptr;
    gp.rec = rec_buf.const_data_ptr();
    gp.c = c_state.mutable_data_ptr();
    gp.m = m_buf.mutable_data_ptr();
    gp.batch = B;
    gp.total = total;
    gp.cell = C;
    gp.cell_clip = cell_clip.value_or(0.0);
    gp.dtype = gdtype;

    gpu::LstmOutputParams op{};
    op.hproj = hproj_buf.const_data_ptr();
    op.h = h_state.mutable_data_ptr();
    op.y = L > 1 ? y_buf.mutable_data_ptr() : nullptr;
    op.out = outputs.select(0, l).mutable_data_ptr();  // [B, T, 2P] contiguous
    op.out_row = out_row.const_data_ptr<int64_t>();
    op.batch = B;
    op.total = total;
    op.proj = P;
    op.proj_clip = proj_clip.value_or(0.0);
    op.skip = l > 0;
    op.write_y = l + 1 < L;
    op.dtype = gdtype;

    for (int64_t s = 0; s < steps; ++s) {
      const int64_t n = plan.running[s];
      at::Tensor rec = rec_buf.narrow(0, 0, 2 * n * 4 * C).view({2, n, 4 * C});
      at::bmm_out(rec, h_state.narrow(1, 0, n), w_hh_t);
      gp.n = n;
      gp.offset = plan.offset[s];
      gpu::lstm_gates_launch(gp, stream);
      ELMO_GPU_LAUNCH_CHECK();

      at::Tensor hproj = hproj_buf.narrow(0, 0, 2 * n * P).view({2, n, P});
      at::bmm_out(hproj, m_buf.narrow(0, 0, 2 * n * C).view({2, n, C}), w_proj_t);
      op.n = n;
      op.offset = plan.offset[s];
      gpu::lstm_output_launch(op, stream);
      ELMO_GPU_LAUNCH_CHECK();
    }

    // Final states back in batch order: out[l][b] = [state[0][rank[b]] | state[1][rank[b]]] (a gather:
    // index_copy_ would refuse to run under torch.use_deterministic_algorithms on CUDA).
    h_out.select(0, l).copy_(h_state.transpose(0, 1).reshape({B, 2 * P}).index_select(0, rank));
    c_out.select(0, l).copy_(c_state.transpose(0, 1).reshape({B, 2 * C}).index_select(0, rank));
  }
  return {outputs, h_out, c_out};
}

}  // namespace
}  // namespace elmo_fast

ELMO_GPU_REGISTER(m) { m.impl("bilstm", &elmo_fast::bilstm_cuda); }
