// CUDA bindings and host loops of the trainable projected-LSTM layer, both directions per call:
// lstm_layer_forward (the forward, keeping `saved` for the backward) and lstm_layer_backward
// (backpropagation through time). Oracle: elmo_fast.reference.lstm_layer_pair_ref under autograd;
// the CPU twin csrc/cpu/lstm_layer_cpu.cpp, whose contract (shapes, `saved`'s layout, checks and
// messages) these share; kernels: lstm_layer.cu (lstm_layer.h: the math and the layout).
//
// The schedule is made on the host (lstm_plan.h) from the lengths and token_index there (given on the
// device they are copied to the host: a device sync; ops.bilstm_train passes them on the host) and
// copied to the device in one asynchronous copy from pinned memory. Per step, both directions at once:
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

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/backend.h"
#include "cuda/lstm_layer.h"
#include "cuda/lstm_plan.h"
#include "lstm_args.h"

namespace elmo_fast {
namespace {

// What the host reads of a call's lengths and token_index, and the shapes they imply.
struct GateRows {
  at::Tensor lengths;  // [B] int64, contiguous, on the CPU
  at::Tensor index;    // [B, T] int64, contiguous, on the CPU; undefined for a dense xg
  int64_t batch = 0;   // B
  int64_t time = 0;    // T
  int64_t rows = 0;    // R, rows of xg per direction: B T (dense) or U (token_index)

  // xg's row (per direction) that position (b, t) reads.
  int64_t row(int64_t b, int64_t t) const {
    return index.defined() ? index.const_data_ptr<int64_t>()[b * time + t] : b * time + t;
  }
};

// xg_size: [2, B, T, 4C], or [2, U, 4C] with token_index [B, T]; lengths [B] int64 in [0, T];
// token_index (when given) in [0, U) at every position t < lengths[b]. lengths and token_index may
// be on the CPU or on `device` (then copied to the host). The CPU op's checks, in its words.
GateRows check_gate_rows(const char* kOp, at::IntArrayRef xg_size, const at::Tensor& lengths,
                         const std::optional<at::Tensor>& token_index, int64_t C, c10::Device device) {
  ELMO_CHECK(lengths.dim() == 1, "lengths must have 1 dims, got ", lengths.dim());
  ELMO_CHECK(lengths.device().is_cpu() || lengths.device() == device, "lengths must be a CPU tensor or on ", device,
             ", got ", lengths.device());
  ELMO_CHECK(lengths.scalar_type() == at::kLong, "lengths must have dtype int64, got ",
             dtype_name(lengths.scalar_type()));
  GateRows g;
  g.batch = lengths.size(0);
  const int64_t B = g.batch;
  if (token_index.has_value()) {
    ELMO_CHECK(token_index->dim() == 2 && token_index->size(0) == B, "token_index must have shape [B, T] = [", B,
               ", T], got ", token_index->sizes());
    ELMO_CHECK(token_index->scalar_type() == at::kLong, "token_index must have dtype int64, got ",
               dtype_name(token_index->scalar_type()));
    ELMO_CHECK(token_index->device().is_cpu() || token_index->device() == device,
               "token_index must be a CPU tensor or on ", device, ", got ", token_index->device());
    g.time = token_index->size(1);
    ELMO_CHECK(xg_size.size() == 3 && xg_size[0] == 2 && xg_size[2] == 4 * C,
               "xg with token_index expected shape [2, U, 4C] = [2, U, ", 4 * C, "] (C = ", C,
               " from w_proj [2, P, C]), got ", xg_size);
    g.rows = xg_size[1];
    g.index = token_index->to(at::kCPU).contiguous();
  } else {
    ELMO_CHECK(xg_size.size() == 4 && xg_size[0] == 2 && xg_size[1] == B && xg_size[3] == 4 * C,
               "xg expected shape [2, B, T, 4C] = [2, ", B, ", T, ", 4 * C, "] (B from lengths, C = ", C,
               " from w_proj [2, P, C]), got ", xg_size);
    g.time = xg_size[2];
    g.rows = B * g.time;
  }
  g.lengths = lengths.to(at::kCPU).contiguous();
  const int64_t* len = g.lengths.const_data_ptr<int64_t>();
  for (const auto b : c10::irange(B)) {
    ELMO_CHECK(len[b] >= 0 && len[b] <= g.time, "lengths[", b, "] = ", len[b], " is out of range [0, T = ", g.time,
               "]");
    if (g.index.defined()) {
      for (const auto t : c10::irange(len[b])) {
        const int64_t u = g.row(b, t);
        ELMO_CHECK(u >= 0 && u < g.rows, "token_index[", b, ", ", t, "] = ", u, " is out of range for xg with ",
                   g.rows, " rows (positions before lengths[", b, "] = ", len[b], " must index xg)");
      }
    }
  }
  return g;
}

void check_float_or_double(const char* kOp, const char* name, at::ScalarType dtype) {
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kDouble, name, " has dtype ", dtype_name(dtype),
             "; supported: float32, float64");
}

double clip_value(std::optional<double> v) {
  // As the reference: None or 0 means no clip.
  return !v.has_value() || *v == 0.0 ? std::numeric_limits<double>::infinity() : *v;
}

// [2, rows, cols] view of direction-strided rows inside `saved`: direction d's matrix starts at
// element `at` of its direction, rows from `first`.
at::Tensor saved_rows(const at::Tensor& saved, const gpu::LstmSavedLayout& lay, int64_t at, int64_t first,
                      int64_t rows, int64_t cols) {
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
    const std::optional<at::Tensor>& c0_opt, const std::optional<at::Tensor>& token_index) {
  static constexpr char kOp[] = "lstm_layer_forward";
  ELMO_CHECK_GPU(xg);
  const at::ScalarType dtype = xg.scalar_type();
  check_float_or_double(kOp, "xg", dtype);
  ELMO_CHECK(w_proj.dim() == 3, "w_proj must have shape [2, P, C] (forward, backward), got ", w_proj.sizes());
  const GateRows gr = check_gate_rows(kOp, xg.sizes(), lengths, token_index, w_proj.size(2), xg.device());
  const LstmLayerDims dims = check_lstm_layer_weights(kOp, gr.batch, gr.time, gr.lengths, w_hh, w_proj, dtype,
                                                      xg.device(), cell_clip, proj_clip, h0_opt, c0_opt);
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C;

  const gpu::DeviceGuard guard(xg.device());
  const gpu::LstmPlan plan = gpu::make_lstm_plan(gr.lengths.const_data_ptr<int64_t>(), B);
  const int64_t N = plan.total(), S = plan.steps();
  const gpu::LstmSavedLayout lay = gpu::lstm_saved_layout(N, C, P);

  // One host-to-device copy: [order (B) | rank (B) | last_h (B) | xg_row (2N) | y_offset (2N)], where
  // last_h[b] is the row of [h0 sorted (B rows) | packed h (N rows)] holding row b's final h.
  at::Tensor plan_host = at::empty({3 * B + 4 * N}, gpu::host_staging(at::kLong));
  int64_t* ph = plan_host.mutable_data_ptr<int64_t>();
  for (const auto i : c10::irange(B)) {
    const int64_t b = plan.order[i];
    const int64_t len = plan.length[i];
    ph[i] = b;
    ph[B + b] = i;
    ph[2 * B + b] = len > 0 ? B + plan.offset[len - 1] + i : i;
  }
  int64_t* xg_row = ph + 3 * B;
  int64_t* y_off = xg_row + 2 * N;
  for (const auto d : c10::irange(2)) {
    for (const auto s : c10::irange(S)) {
      for (const auto i : c10::irange(plan.running[s])) {
        const int64_t b = plan.order[i];
        const int64_t t = plan.position(d, i, s);
        const int64_t r = d * N + plan.offset[s] + i;
        xg_row[r] = gr.row(b, t);
        y_off[r] = ((d * B + b) * T + t) * P;
      }
    }
  }
  const at::Tensor plan_dev = gpu::to_device_async(plan_host, xg.device());
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
  cp.cell_clip = clip_value(cell_clip);
  cp.dtype = gdtype;
  gpu::LstmProjSaveParams pp{};
  pp.saved = saved.const_data_ptr();
  pp.h = h_packed.mutable_data_ptr();
  pp.y = y.mutable_data_ptr();
  pp.y_offset = plan_dev.const_data_ptr<int64_t>() + 3 * B + 2 * N;
  pp.total = N;
  pp.cell = C;
  pp.proj = P;
  pp.proj_clip = clip_value(proj_clip);
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
    const std::optional<at::Tensor>& h0_opt, const std::optional<at::Tensor>& c0_opt) {
  static constexpr char kOp[] = "lstm_layer_backward";
  ELMO_CHECK_DIM(saved, 3);
  ELMO_CHECK_GPU(saved);
  const at::ScalarType dtype = saved.scalar_type();
  check_float_or_double(kOp, "saved", dtype);
  ELMO_CHECK(w_proj.dim() == 3, "w_proj must have shape [2, P, C] (forward, backward), got ", w_proj.sizes());
  const GateRows gr = check_gate_rows(kOp, xg_size, lengths, token_index, w_proj.size(2), saved.device());
  const LstmLayerDims dims = check_lstm_layer_weights(kOp, gr.batch, gr.time, gr.lengths, w_hh, w_proj, dtype,
                                                      saved.device(), cell_clip, proj_clip, h0_opt, c0_opt);
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C, R = gr.rows;
  const auto check_grad = [&](const std::optional<at::Tensor>& g, const char* name, std::vector<int64_t> shape) {
    if (g.has_value()) {
      ELMO_CHECK(g->sizes() == at::IntArrayRef(shape), name, " expected shape ", at::IntArrayRef(shape), ", got ",
                 g->sizes());
      ELMO_CHECK(g->scalar_type() == dtype && g->device() == saved.device(), name, " must have dtype ",
                 dtype_name(dtype), " on ", saved.device());
    }
  };
  check_grad(grad_y_opt, "grad_y", {2, B, T, P});
  check_grad(grad_h_opt, "grad_h", {2, B, P});
  check_grad(grad_c_opt, "grad_c", {2, B, C});

  const gpu::DeviceGuard guard(saved.device());
  const gpu::LstmPlan plan = gpu::make_lstm_plan(gr.lengths.const_data_ptr<int64_t>(), B);
  const int64_t N = plan.total(), S = plan.steps();
  const int64_t n0 = S > 0 ? plan.running[0] : 0;
  ELMO_CHECK(saved.size(0) == 2 && saved.size(1) == N && saved.size(2) == 6 * C + P && saved.is_contiguous(),
             "saved must be lstm_layer_forward's contiguous [2, N, 6C + P] = [2, ", N, ", ", 6 * C + P,
             "] (N = sum of lengths), got shape ", saved.sizes());
  const gpu::LstmSavedLayout lay = gpu::lstm_saved_layout(N, C, P);
  // Output gradients are read as rows of P contiguous elements (an expanded one is materialized).
  const at::Tensor grad_y = !grad_y_opt.has_value()                                 ? at::Tensor()
                            : (P <= 1 || grad_y_opt->stride(3) == 1) ? *grad_y_opt
                                                                                    : grad_y_opt->contiguous();

  // One host-to-device copy: [order (B) | rank (B) | prev_row (N) | xg_flat_row (2N) | grad_y_offset (2N)]:
  // prev_row[r], the row of [h0 sorted (B rows) | clip(P_RAW) (N rows)] holding packed position r's
  // h_prev (the same for both directions); xg_flat_row, the row of grad_xg viewed [2R, 4C].
  at::Tensor plan_host = at::empty({2 * B + 5 * N}, gpu::host_staging(at::kLong));
  int64_t* ph = plan_host.mutable_data_ptr<int64_t>();
  for (const auto i : c10::irange(B)) {
    ph[i] = plan.order[i];
    ph[B + plan.order[i]] = i;
  }
  int64_t* prev_row = ph + 2 * B;
  int64_t* xg_row = prev_row + N;
  int64_t* gy_off = xg_row + 2 * N;
  for (const auto s : c10::irange(S)) {
    for (const auto i : c10::irange(plan.running[s])) {
      prev_row[plan.offset[s] + i] = s == 0 ? i : B + plan.offset[s - 1] + i;
    }
  }
  for (const auto d : c10::irange(2)) {
    for (const auto s : c10::irange(S)) {
      for (const auto i : c10::irange(plan.running[s])) {
        const int64_t b = plan.order[i];
        const int64_t t = plan.position(d, i, s);
        const int64_t r = d * N + plan.offset[s] + i;
        xg_row[r] = d * R + gr.row(b, t);
        gy_off[r] = grad_y.defined() ? d * grad_y.stride(0) + b * grad_y.stride(1) + t * grad_y.stride(2) : 0;
      }
    }
  }
  const at::Tensor plan_dev = gpu::to_device_async(plan_host, saved.device());
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
  pg.proj_clip = clip_value(proj_clip);
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
  cg.cell_clip = clip_value(cell_clip);
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
  const double pc = clip_value(proj_clip);
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

TORCH_LIBRARY_IMPL(ELMO_GPU_LIBRARY, ELMO_GPU_DISPATCH_KEY, m) {
  m.impl("lstm_layer_forward", &elmo_fast::lstm_layer_forward_cuda);
  m.impl("lstm_layer_backward", &elmo_fast::lstm_layer_backward_cuda);
}
