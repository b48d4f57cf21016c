// CUDA bindings and host loops of the trainable projected-LSTM layer, both directions per call:
// lstm_layer_forward (the forward, keeping `saved` for the backward) and lstm_layer_backward
// (backpropagation through time). Oracle: elmo_fast.bilm.reference.lstm_layer_pair_ref under autograd;
// the CPU twin csrc/cpu/lstm_layer_cpu.cpp, whose contract (shapes, `saved`'s layout, checks and
// messages) these share; kernels: lstm_layer.cu (lstm_layer.h: the math and the layout).
//
// The plan is made on the host (lstm_plan.h, with the CPU op's checks: lstm_args.h) from the lengths
// and token_index there (given on the device they are copied to the host: a device sync;
// ops.bilstm_train passes them on the host) and its arrays uploaded in one go (plan_upload.h). Per
// step, both directions at once:
// the recurrent GEMM (a bmm writing straight into the step's ACT rows of `saved`), the cell pass, the
// projection GEMM (into P_RAW), the output pass. The backward walks the steps from the last: the dp
// pass, dm = dp W_proj (bmm), the cell-gradient pass, dh = dgates W_hh (bmm); then one GEMM per weight
// gradient over all packed rows, and grad_xg by index_put_ with accumulation (rows that several
// positions read sum their gradients; deterministic on CUDA). GEMMs are ATen's (cuBLAS, the current
// stream; fp32 uses TF32 only if torch.backends.cuda.matmul.allow_tf32).
#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/backend.h"
#include "cuda/lstm_layer.h"
#include "cuda/plan_upload.h"
#include "lstm_args.h"
#include "lstm_plan.h"

namespace elmo_fast {
namespace {

// [2, rows, cols] view of direction-strided rows inside `saved`: direction d's matrix starts at
// element `at` of its direction, rows from `first`.
at::Tensor saved_rows(const at::Tensor& saved, const gpu::LstmSavedLayout& lay, int64_t at, int64_t first, int64_t rows,
                      int64_t cols) {
  return saved.as_strided({2, rows, cols}, {lay.direction, cols, 1}, saved.storage_offset() + at + first * cols);
}

// [2, B, width] rows of `state` ([2, B, width]) in sorted order, or zeros.
at::Tensor sorted_or_zeros(const std::optional<at::Tensor>& state, const at::Tensor& order, int64_t B, int64_t width,
                           const at::TensorOptions& opts) {
  return state.has_value() ? state->index_select(1, order) : at::zeros({2, B, width}, opts);
}

// xg: [2, B, T, 4C], or [2, U, 4C] with token_index [B, T] (position (b, t) reads row token_index[b, t]);
// lengths: [B] int64; w_hh: [2, 4C, P]; w_proj: [2, P, C]; h0: [2, B, P], c0: [2, B, C] or None (zeros);
// float32 or float64, on one CUDA device (lengths and token_index: there or on the CPU)
// -> y [2, B, T, P] (0 at padding), h [2, B, P], c [2, B, C], saved [2, N, 6C + P] (for the backward).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_layer_forward_cuda(
    const at::Tensor& xg, const at::Tensor& lengths, const at::Tensor& w_hh, const at::Tensor& w_proj,
    std::optional<double> cell_clip, std::optional<double> proj_clip, const std::optional<at::Tensor>& h0_opt,
    const std::optional<at::Tensor>& c0_opt, const std::optional<at::Tensor>& token_index,
    std::optional<at::IntArrayRef> /*tuning: the CPU op's*/) {
  static constexpr char kOp[] = "lstm_layer_forward";
  ELMO_CHECK_GPU(xg);
  gpu::check_host_plan_under_capture(kOp, "lengths", lengths);
  const LstmLayerArgs args =
      check_lstm_layer_forward_args(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0_opt, c0_opt, token_index);
  const GateRows& gr = args.rows;
  const LstmLayerDims& dims = args.dims;
  const at::ScalarType dtype = xg.scalar_type();
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C;

  const gpu::DeviceGuard guard(xg.device());
  const LstmPlan plan = make_lstm_plan(gr.length(), B, T);
  const int64_t N = plan.total(), S = plan.steps();
  const gpu::LstmSavedLayout lay = gpu::lstm_saved_layout(N, C, P);

  // One upload: [order (B) | rank (B) | last_h (B) | xg_row (2N) | y_offset (2N)], where last_h[b] is the
  // row of [h0 sorted (B rows) | packed h (N rows)] holding row b's final h.
  std::vector<int64_t> host(3 * B + 4 * N);
  for (const auto i : c10::irange(B)) {
    const int64_t b = plan.order[i];
    const int64_t len = plan.length[i];
    host[i] = b;
    host[B + b] = i;
    host[2 * B + b] = len > 0 ? B + plan.offset[len - 1] + i : i;
  }
  for (const auto d : c10::irange(2)) {
    plan.for_each_position(d, [&](int64_t r, int64_t, int64_t b, int64_t t) {
      host[3 * B + d * N + r] = gr.row(b, t);
      host[3 * B + 2 * N + d * N + r] = ((d * B + b) * T + t) * P;
    });
  }
  const at::Tensor plan_dev = gpu::plan_to_device(host, xg.device());
  const at::Tensor order = plan_dev.narrow(0, 0, B);
  const at::Tensor rank = plan_dev.narrow(0, B, B);
  const at::Tensor last_h = plan_dev.narrow(0, 2 * B, B);

  const auto opts = xg.options().memory_format(at::MemoryFormat::Contiguous);
  const at::Tensor xg_c = xg.contiguous();
  at::Tensor y = at::zeros({2, B, T, P}, opts);
  at::Tensor saved = at::empty({2, N, 6 * C + P}, opts);
  at::Tensor h_packed = at::empty({2, N, P}, opts);
  const at::Tensor h0s = sorted_or_zeros(h0_opt, order, B, P, opts);
  at::Tensor c_state = sorted_or_zeros(c0_opt, order, B, C, opts).contiguous();
  const at::Tensor w_hh_t = w_hh.transpose(1, 2);      // [2, P, 4C]
  const at::Tensor w_proj_t = w_proj.transpose(1, 2);  // [2, C, P]
  const cudaStream_t stream = gpu::current_stream();
  const gpu::Dtype gdtype = dtype == at::kDouble ? gpu::Dtype::kFloat64 : gpu::Dtype::kFloat32;

  gpu::LstmCellSaveParams cp{};
  cp.xg = xg_c.const_data_ptr();
  cp.xg_row = plan_dev.const_data_ptr<int64_t>() + 3 * B;
  cp.saved = saved.mutable_data_ptr();
  cp.c = c_state.mutable_data_ptr();
  cp.batch = B;
  cp.rows = gr.rows;
  cp.total = N;
  cp.cell = C;
  cp.proj = P;
  cp.cell_clip = clip_bound(cell_clip);
  cp.dtype = gdtype;
  gpu::LstmProjSaveParams pp{};
  pp.saved = saved.const_data_ptr();
  pp.h = h_packed.mutable_data_ptr();
  pp.y = y.mutable_data_ptr();
  pp.y_offset = plan_dev.const_data_ptr<int64_t>() + 3 * B + 2 * N;
  pp.total = N;
  pp.cell = C;
  pp.proj = P;
  pp.proj_clip = clip_bound(proj_clip);
  pp.dtype = gdtype;

  for (const auto s : c10::irange(S)) {
    const int64_t n = plan.running[s];
    const int64_t off = plan.offset[s];
    const at::Tensor h_prev = s == 0 ? h0s.narrow(1, 0, n) : h_packed.narrow(1, plan.offset[s - 1], n);
    at::Tensor act = saved_rows(saved, lay, lay.act, off, n, 4 * C);
    at::bmm_out(act, h_prev, w_hh_t);
    cp.n = n;
    cp.offset = off;
    gpu::lstm_cell_save_launch(cp, stream);
    ELMO_GPU_LAUNCH_CHECK();
    at::Tensor p_raw = saved_rows(saved, lay, lay.p_raw, off, n, P);
    at::bmm_out(p_raw, saved_rows(saved, lay, lay.m, off, n, C), w_proj_t);
    pp.n = n;
    pp.offset = off;
    gpu::lstm_proj_save_launch(pp, stream);
    ELMO_GPU_LAUNCH_CHECK();
  }
  // Each row's state after its own last step (rows of length 0 keep the initial state).
  at::Tensor h_out = at::cat({h0s, h_packed}, 1).index_select(1, last_h);
  at::Tensor c_out = c_state.index_select(1, rank);
  return {y, h_out, c_out, saved};
}

// grad_y: [2, B, T, P] (any strides) or None, grad_h: [2, B, P] / grad_c: [2, B, C] or None (zeros);
// saved: lstm_layer_forward's; xg_size: xg's shape; the forward's other arguments
// -> grad_xg of xg's shape (0 in rows no position reads), grad_w_hh [2, 4C, P], grad_w_proj [2, P, C],
//    grad_h0 [2, B, P], grad_c0 [2, B, C].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_layer_backward_cuda(
    const std::optional<at::Tensor>& grad_y_opt, const std::optional<at::Tensor>& grad_h_opt,
    const std::optional<at::Tensor>& grad_c_opt, const at::Tensor& saved, const at::Tensor& lengths,
    const std::optional<at::Tensor>& token_index, at::IntArrayRef xg_size, const at::Tensor& w_hh,
    const at::Tensor& w_proj, std::optional<double> cell_clip, std::optional<double> proj_clip,
    const std::optional<at::Tensor>& h0_opt, const std::optional<at::Tensor>& c0_opt,
    std::optional<at::IntArrayRef> /*tuning: the CPU op's*/) {
  static constexpr char kOp[] = "lstm_layer_backward";
  ELMO_CHECK_GPU(saved);
  gpu::check_host_plan_under_capture(kOp, "lengths", lengths);
  const LstmLayerArgs args =
      check_lstm_layer_backward_args(grad_y_opt, grad_h_opt, grad_c_opt, saved, lengths, token_index, xg_size, w_hh,
                                     w_proj, cell_clip, proj_clip, h0_opt, c0_opt);
  const GateRows& gr = args.rows;
  const LstmLayerDims& dims = args.dims;
  const at::ScalarType dtype = saved.scalar_type();
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C, R = gr.rows;

  const gpu::DeviceGuard guard(saved.device());
  const LstmPlan plan = make_lstm_plan(gr.length(), B, T);
  const int64_t N = plan.total(), S = plan.steps();
  const int64_t n0 = plan.first_running();
  check_saved(kOp, saved, N, dims);
  const gpu::LstmSavedLayout lay = gpu::lstm_saved_layout(N, C, P);
  // Output gradients are read as rows of P contiguous elements (an expanded one is materialized).
  const at::Tensor grad_y = !grad_y_opt.has_value()                  ? at::Tensor()
                            : (P <= 1 || grad_y_opt->stride(3) == 1) ? *grad_y_opt
                                                                     : grad_y_opt->contiguous();

  // One upload: [order (B) | rank (B) | prev_row (N) | xg_flat_row (2N) | grad_y_offset (2N)]: prev_row[r],
  // the row of [h0 sorted (B rows) | clip(P_RAW) (N rows)] holding packed position r's h_prev (the same
  // for both directions); xg_flat_row, the row of grad_xg viewed [2R, 4C].
  std::vector<int64_t> host(2 * B + 5 * N);
  std::copy(plan.order.begin(), plan.order.end(), host.begin());
  std::copy(plan.rank.begin(), plan.rank.end(), host.begin() + B);
  for (const auto s : c10::irange(S)) {
    for (const auto i : c10::irange(plan.running[s])) {
      host[2 * B + plan.offset[s] + i] = s == 0 ? i : B + plan.offset[s - 1] + i;
    }
  }
  for (const auto d : c10::irange(2)) {
    plan.for_each_position(d, [&](int64_t r, int64_t, int64_t b, int64_t t) {
      host[2 * B + N + d * N + r] = d * R + gr.row(b, t);
      host[2 * B + 3 * N + d * N + r] =
          grad_y.defined() ? d * grad_y.stride(0) + b * grad_y.stride(1) + t * grad_y.stride(2) : 0;
    });
  }
  const at::Tensor plan_dev = gpu::plan_to_device(host, saved.device());
  const at::Tensor order = plan_dev.narrow(0, 0, B);
  const at::Tensor rank = plan_dev.narrow(0, B, B);
  const at::Tensor prev_index = plan_dev.narrow(0, 2 * B, N);
  const at::Tensor xg_index = plan_dev.narrow(0, 2 * B + N, 2 * N);

  const auto opts = saved.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor dh = sorted_or_zeros(grad_h_opt, order, B, P, opts).contiguous();
  at::Tensor dc = sorted_or_zeros(grad_c_opt, order, B, C, opts).contiguous();
  const at::Tensor c0s = sorted_or_zeros(c0_opt, order, B, C, opts).contiguous();
  const at::Tensor h0s = sorted_or_zeros(h0_opt, order, B, P, opts);
  at::Tensor dp = at::empty({2, N, P}, opts);
  at::Tensor dgates = at::empty({2, N, 4 * C}, opts);
  at::Tensor dm_buf = at::empty({2 * n0 * C}, opts);
  const cudaStream_t stream = gpu::current_stream();
  const gpu::Dtype gdtype = dtype == at::kDouble ? gpu::Dtype::kFloat64 : gpu::Dtype::kFloat32;

  gpu::LstmProjGradParams pg{};
  pg.grad_y = grad_y.defined() ? grad_y.const_data_ptr() : nullptr;
  pg.grad_y_offset = plan_dev.const_data_ptr<int64_t>() + 2 * B + 3 * N;
  pg.dh = dh.const_data_ptr();
  pg.saved = saved.const_data_ptr();
  pg.dp = dp.mutable_data_ptr();
  pg.batch = B;
  pg.total = N;
  pg.cell = C;
  pg.proj = P;
  pg.proj_clip = clip_bound(proj_clip);
  pg.dtype = gdtype;
  gpu::LstmCellGradParams cg{};
  cg.saved = saved.const_data_ptr();
  cg.c0 = c0s.const_data_ptr();
  cg.dm = dm_buf.const_data_ptr();
  cg.dc = dc.mutable_data_ptr();
  cg.dgates = dgates.mutable_data_ptr();
  cg.batch = B;
  cg.total = N;
  cg.cell = C;
  cg.proj = P;
  cg.cell_clip = clip_bound(cell_clip);
  cg.dtype = gdtype;

  for (int64_t s = S - 1; s >= 0; --s) {
    const int64_t n = plan.running[s];
    const int64_t off = plan.offset[s];
    pg.n = n;
    pg.offset = off;
    gpu::lstm_proj_grad_launch(pg, stream);
    ELMO_GPU_LAUNCH_CHECK();
    at::Tensor dm = dm_buf.narrow(0, 0, 2 * n * C).view({2, n, C});
    at::bmm_out(dm, dp.narrow(1, off, n), w_proj);
    cg.n = n;
    cg.offset = off;
    cg.prev_offset = s > 0 ? plan.offset[s - 1] : -1;
    gpu::lstm_cell_grad_launch(cg, stream);
    ELMO_GPU_LAUNCH_CHECK();
    at::Tensor dh_running = dh.narrow(1, 0, n);
    at::bmm_out(dh_running, dgates.narrow(1, off, n), w_hh);
  }
  // Weight gradients: one GEMM each over all packed rows.
  at::Tensor grad_w_proj = at::bmm(dp.transpose(1, 2), saved_rows(saved, lay, lay.m, 0, N, C));
  const double pc = clip_bound(proj_clip);
  const at::Tensor p_raw = saved_rows(saved, lay, lay.p_raw, 0, N, P);
  const at::Tensor h_prev =
      at::cat({h0s, pc == std::numeric_limits<double>::infinity() ? p_raw : at::clamp(p_raw, -pc, pc)}, 1)
          .index_select(1, prev_index);
  at::Tensor grad_w_hh = at::bmm(dgates.transpose(1, 2), h_prev);
  at::Tensor grad_xg = at::zeros(xg_size, opts);
  at::Tensor grad_xg_rows = grad_xg.view({2 * R, 4 * C});
  c10::List<std::optional<at::Tensor>> rows_index;
  rows_index.push_back(xg_index);
  at::index_put_(grad_xg_rows, rows_index, dgates.view({2 * N, 4 * C}), /*accumulate=*/true);
  return {grad_xg, grad_w_hh, grad_w_proj, dh.index_select(1, rank), dc.index_select(1, rank)};
}

}  // namespace
}  // namespace elmo_fast

ELMO_GPU_REGISTER(m) {
  m.impl("lstm_layer_forward", &elmo_fast::lstm_layer_forward_cuda);
  m.impl("lstm_layer_backward", &elmo_fast::lstm_layer_backward_cuda);
}
