// CPU kernels of the trainable projected-LSTM layer, both directions of one layer per call:
// lstm_layer_forward (the forward, keeping what the backward reads) and lstm_layer_backward
// (backpropagation through time). Oracle: elmo_fast.bilm.reference.lstm_layer_pair_ref under autograd.
//
// The machinery is bilstm's: the plan of lstm_plan.h (rows sorted by length so that the rows
// running at step s are a prefix [0, n_s), stored packed step after step at [off_s, off_s + n_s)),
// the checks of lstm_args.h (shared with the CUDA op), and lstm_common.h's GEMMs (gemv_nt for few
// rows, else BLAS) and threads (the two directions on the two threads). What differs:
//   * The forward keeps, per packed row, the gate activations i f g o (4C), the unclipped cell
//     (C), m = o tanh(c) (C) and the unclipped projection (P): `saved`, [2, N, 6C + P] (N = sum of
//     lengths: nothing for padding), per direction four packed matrices one after the other:
//     ACT [N, 4C], C_RAW [N, C], M [N, C], P_RAW [N, P]. The recurrent GEMM writes straight into
//     ACT (the cell pass then overwrites the pre-activations with activations) and the projection
//     GEMM into P_RAW, so saving costs no pass of its own.
//   * The input gates are xg [2, B, T, 4C] (the op's contract) or, with token_index [B, T], rows of
//     xg [2, U, 4C] (as bilstm's xg0): a training stack computes them packed, one GEMM over the real
//     tokens, and hands them over without scattering them into a padded tensor; grad_xg has xg's
//     shape either way.
//   * The backward walks the steps from the last: per step a pass for dp (the output's and the
//     recurrence's gradient of h, masked by the projection clip), dm = dp W_proj, a pass for the
//     gate and cell gradients (recomputing only tanh(c)), dh = dgates W_hh. The weight gradients
//     are one GEMM each at the end: dW_proj = dp^T m over the packed rows, dW_hh = dgates^T h_prev
//     over grad_xg's rows themselves when each holds one position's dgates and few are padding
//     (dgates then also go to a one-step buffer for dh's GEMM), else over a packed copy of dgates.
// Clips have zero gradient where they bind: the gradient passes where -clip <= x <= clip.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cpu/lstm_common.h"
#include "cpu/lstm_layer_pointwise.h"
#include "cpu/tuning.h"
#include "lstm_args.h"

namespace elmo_fast {
namespace {

using namespace lstm_cpu;

ELMO_FAST_ISA_DISPATCHED(cell_save_f32, lstm::CellSaveParams<float>, lstm::cell_save_rows)
ELMO_FAST_ISA_DISPATCHED(proj_save_f32, lstm::ProjSaveParams<float>, lstm::proj_save_rows)
ELMO_FAST_ISA_DISPATCHED(proj_grad_f32, lstm::ProjGradParams<float>, lstm::proj_grad_rows)
ELMO_FAST_ISA_DISPATCHED(cell_grad_f32, lstm::CellGradParams<float>, lstm::cell_grad_rows)

void run_rows(const lstm::CellSaveParams<float>& p, int64_t b, int64_t e) { cell_save_f32(p, b, e); }
void run_rows(const lstm::ProjSaveParams<float>& p, int64_t b, int64_t e) { proj_save_f32(p, b, e); }
void run_rows(const lstm::ProjGradParams<float>& p, int64_t b, int64_t e) { proj_grad_f32(p, b, e); }
void run_rows(const lstm::CellGradParams<float>& p, int64_t b, int64_t e) { cell_grad_f32(p, b, e); }
void run_rows(const lstm::CellSaveParams<double>& p, int64_t b, int64_t e) { lstm::cell_save_rows(p, b, e); }
void run_rows(const lstm::ProjSaveParams<double>& p, int64_t b, int64_t e) { lstm::proj_save_rows(p, b, e); }
void run_rows(const lstm::ProjGradParams<double>& p, int64_t b, int64_t e) { lstm::proj_grad_rows(p, b, e); }
void run_rows(const lstm::CellGradParams<double>& p, int64_t b, int64_t e) { lstm::cell_grad_rows(p, b, e); }

// A pass over n rows of `width` elements each: on the calling thread below ATen's grain (and always
// inside the directions' parallel region), else split by rows.
template <typename Params>
void rows_pass(const Params& p, int64_t n, int64_t width) {
  at::parallel_for(0, n, std::max<int64_t>(1, kCellGrainElements / std::max<int64_t>(width, 1)),
                   [&](int64_t b, int64_t e) { run_rows(p, b, e); });
}

// Element offsets of one direction's matrices inside `saved` (N rows each).
struct SavedLayout {
  int64_t act, c_raw, m, p_raw;  // ACT [R, 4C], C_RAW [R, C], M [R, C], P_RAW [R, P]
  int64_t size;
  SavedLayout(int64_t rows, int64_t P, int64_t C)
      : act(0), c_raw(rows * 4 * C), m(rows * 5 * C), p_raw(rows * 6 * C), size(rows * (6 * C + P)) {}
};

// [rows, cols] view at element `at` of a flat tensor.
at::Tensor view_at(const at::Tensor& flat, int64_t at, int64_t rows, int64_t cols) {
  return flat.narrow(0, at, rows * cols).view({rows, cols});
}

// Per packed row of direction d: the element offset d s0 + b s1 + t s2 of its position (b, t) in a
// [2, B, T, .] tensor of strides s0, s1, s2.
std::vector<int64_t> position_offsets(const LstmPlan& plan, int64_t d, int64_t s0, int64_t s1, int64_t s2) {
  return plan.per_position(d, [&](int64_t b, int64_t t) { return d * s0 + b * s1 + t * s2; });
}

// Per packed row of direction d: the element offset of its input gates in xg ([2, B, T, 4C], or
// [2, U, 4C] read through token_index).
std::vector<int64_t> gate_offsets(const GateRows& gr, const LstmPlan& plan, int64_t d, const at::Tensor& xg) {
  if (!gr.index.defined()) {
    return position_offsets(plan, d, xg.stride(0), xg.stride(1), xg.stride(2));
  }
  return plan.per_position(d, [&](int64_t b, int64_t t) { return d * xg.stride(0) + gr.row(b, t) * xg.stride(1); });
}

// Zeroes positions t >= lengths[b] of direction d of a contiguous [2, B, T, width] tensor.
template <typename scalar_t>
void zero_padding(scalar_t* base, const LstmPlan& sc, int64_t d, int64_t width) {
  const int64_t B = sc.batch, T = sc.time;
  for (const auto b : c10::irange(B)) {
    const int64_t len = sc.length[sc.rank[b]];
    std::fill_n(base + ((d * B + b) * T + len) * width, (T - len) * width, scalar_t(0));
  }
}

// A [rows, cols] tensor with unit stride along cols (copied only when it has not).
at::Tensor unit_last_stride(const at::Tensor& t) { return (t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous(); }

// xg: [2, B, T, 4C], or [2, U, 4C] with token_index [B, T] int64 (position (b, t) reads row
// token_index[b, t]); last dim unit stride, else copied once. lengths: [B] int64, w_hh: [2, 4C, P],
// w_proj: [2, P, C], h0: [2, B, P], c0: [2, B, C] or None (zeros), float32 or float64
// -> y [2, B, T, P] (0 at padding), h [2, B, P], c [2, B, C], saved [2, N, 6C + P] (for the backward).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_layer_forward_cpu(
    const at::Tensor& xg, const at::Tensor& lengths, const at::Tensor& w_hh, const at::Tensor& w_proj,
    std::optional<double> cell_clip, std::optional<double> proj_clip, const std::optional<at::Tensor>& h0_opt,
    const std::optional<at::Tensor>& c0_opt, const std::optional<at::Tensor>& token_index,
    std::optional<at::IntArrayRef> tuning_opt) {
  static constexpr char kOp[] = "lstm_layer_forward";
  ELMO_CHECK_CPU(xg);
  const LstmLayerArgs args =
      check_lstm_layer_forward_args(xg, lengths, w_hh, w_proj, cell_clip, proj_clip, h0_opt, c0_opt, token_index);
  const GateRows& gr = args.rows;
  const LstmLayerDims& dims = args.dims;
  const at::ScalarType dtype = xg.scalar_type();
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C;

  const at::Tensor xg_c = unit_last_stride(xg);
  const LstmPlan plan = make_lstm_plan(gr.length(), B, T);
  const int64_t N = plan.total();
  const int64_t n0 = plan.first_running();
  const SavedLayout layout(N, P, C);

  const auto opts = xg.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty({2, B, T, P}, opts);
  at::Tensor h_out = at::empty({2, B, P}, opts);
  at::Tensor c_out = at::empty({2, B, C}, opts);
  at::Tensor saved = empty_large({2, N, 6 * C + P}, opts);
  const at::Tensor h0_c = h0_opt.has_value() ? h0_opt->contiguous() : at::Tensor();
  const at::Tensor c0_c = c0_opt.has_value() ? c0_opt->contiguous() : at::Tensor();
  const at::Tensor w_hh_c = w_hh.contiguous();
  const at::Tensor w_proj_c = w_proj.contiguous();
  const LstmTuning tuning = lstm_tuning(kOp, tuning_opt, false, 4 * C * P * int64_t{sizeof(float)});
  const bool concurrent = directions_concurrent(tuning, n0);
  const int64_t gemv_rows = lstm_cpu::gemv_rows(tuning, concurrent);

  // Per direction: h [N, P] packed (each step's h, read by the next step's GEMM), the sorted
  // initial h, the cell state [B, C].
  struct Workspace {
    at::Tensor h, h0, c;
  } ws[2];
  for (auto& w : ws) {
    w.h = at::empty({N, P}, opts);
    w.h0 = at::empty({B, P}, opts);
    w.c = at::empty({B, C}, opts);
  }

  AT_DISPATCH_FLOATING_TYPES(dtype, "lstm_layer_forward", [&] {
    const scalar_t cc = static_cast<scalar_t>(clip_bound(cell_clip));
    const scalar_t pc = static_cast<scalar_t>(clip_bound(proj_clip));
    const auto run = [&](int64_t d) {
      const LstmPlan& sc = plan;
      Workspace& w = ws[d];
      const at::Tensor saved_d = saved.select(0, d).view({-1});
      scalar_t* base = saved_d.mutable_data_ptr<scalar_t>();
      const Weight whh{w_hh_c.select(0, d), w_hh_c.select(0, d).t()};
      const Weight wproj{w_proj_c.select(0, d), w_proj_c.select(0, d).t()};
      const std::vector<int64_t> xg_offset = gate_offsets(gr, sc, d, xg_c);
      const std::vector<int64_t> y_offset = position_offsets(sc, d, B * T * P, T * P, P);
      scalar_t* h0s = w.h0.mutable_data_ptr<scalar_t>();
      scalar_t* c = w.c.mutable_data_ptr<scalar_t>();
      for (const auto j : c10::irange(B)) {
        const int64_t b = sc.order[j];
        if (h0_c.defined()) {
          std::memcpy(h0s + j * P, h0_c.const_data_ptr<scalar_t>() + (d * B + b) * P, P * sizeof(scalar_t));
        } else {
          std::fill_n(h0s + j * P, P, scalar_t(0));
        }
        if (c0_c.defined()) {
          std::memcpy(c + j * C, c0_c.const_data_ptr<scalar_t>() + (d * B + b) * C, C * sizeof(scalar_t));
        } else {
          std::fill_n(c + j * C, C, scalar_t(0));
        }
      }
      zero_padding(y.mutable_data_ptr<scalar_t>(), sc, d, P);
      for (const auto s : c10::irange(sc.steps())) {
        const int64_t n = sc.running[s];
        const int64_t off = sc.offset[s];
        const at::Tensor h_prev = s == 0 ? w.h0.narrow(0, 0, n) : w.h.narrow(0, sc.offset[s - 1], n);
        at::Tensor act = view_at(saved_d, layout.act + off * 4 * C, n, 4 * C);
        linear_nt(act, h_prev, whh, gemv_rows);
        lstm::CellSaveParams<scalar_t> cp;
        cp.xg = xg_c.const_data_ptr<scalar_t>();
        cp.xg_offset = xg_offset.data() + off;
        cp.act = base + layout.act + off * 4 * C;
        cp.c = c;
        cp.c_raw = base + layout.c_raw + off * C;
        cp.m = base + layout.m + off * C;
        cp.cell = C;
        cp.cell_clip = cc;
        rows_pass(cp, n, 4 * C);
        at::Tensor p_raw = view_at(saved_d, layout.p_raw + off * P, n, P);
        linear_nt(p_raw, view_at(saved_d, layout.m + off * C, n, C), wproj, gemv_rows);
        lstm::ProjSaveParams<scalar_t> pp;
        pp.p_raw = base + layout.p_raw + off * P;
        pp.h = w.h.mutable_data_ptr<scalar_t>() + off * P;
        pp.out = y.mutable_data_ptr<scalar_t>();
        pp.out_offset = y_offset.data() + off;
        pp.proj = P;
        pp.proj_clip = pc;
        rows_pass(pp, n, P);
      }
      // Each row's state after its own last step (rows of length 0 keep the initial state).
      const scalar_t* hp = w.h.const_data_ptr<scalar_t>();
      for (const auto b : c10::irange(B)) {
        const int64_t j = sc.rank[b];
        const int64_t len = sc.length[j];
        const scalar_t* h_last = len > 0 ? hp + (sc.offset[len - 1] + j) * P : h0s + j * P;
        std::memcpy(h_out.mutable_data_ptr<scalar_t>() + (d * B + b) * P, h_last, P * sizeof(scalar_t));
        std::memcpy(c_out.mutable_data_ptr<scalar_t>() + (d * B + b) * C, c + j * C, C * sizeof(scalar_t));
      }
    };
    for_each_direction(concurrent, run);
  });
  return {y, h_out, c_out, saved};
}

// grad_y: [2, B, T, P] or None (zeros), grad_h: [2, B, P] / grad_c: [2, B, C] or None (zeros), saved:
// lstm_layer_forward's, xg_size: xg's shape, the forward's other arguments but xg
// -> grad_xg of xg's shape (0 in rows no position reads), grad_w_hh [2, 4C, P], grad_w_proj [2, P, C],
//    grad_h0 [2, B, P], grad_c0 [2, B, C].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_layer_backward_cpu(
    const std::optional<at::Tensor>& grad_y_opt, const std::optional<at::Tensor>& grad_h_opt,
    const std::optional<at::Tensor>& grad_c_opt, const at::Tensor& saved, const at::Tensor& lengths,
    const std::optional<at::Tensor>& token_index, at::IntArrayRef xg_size, const at::Tensor& w_hh,
    const at::Tensor& w_proj, std::optional<double> cell_clip, std::optional<double> proj_clip,
    const std::optional<at::Tensor>& h0_opt, const std::optional<at::Tensor>& c0_opt,
    std::optional<at::IntArrayRef> tuning_opt) {
  static constexpr char kOp[] = "lstm_layer_backward";
  ELMO_CHECK_CPU(saved);
  const LstmLayerArgs args =
      check_lstm_layer_backward_args(grad_y_opt, grad_h_opt, grad_c_opt, saved, lengths, token_index, xg_size, w_hh,
                                     w_proj, cell_clip, proj_clip, h0_opt, c0_opt);
  const GateRows& gr = args.rows;
  const LstmLayerDims& dims = args.dims;
  const at::ScalarType dtype = saved.scalar_type();
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C;

  const LstmPlan plan = make_lstm_plan(gr.length(), B, T);
  const int64_t N = plan.total();
  const int64_t n0 = plan.first_running();
  check_saved(kOp, saved, N, dims);
  const SavedLayout layout(N, P, C);

  // How often each row of xg is read (the same rows for both directions): rows read more than once
  // (token_index repeating rows) accumulate their positions' gradients; rows never read get 0.
  const int64_t R = gr.rows;
  std::vector<int32_t> reads(R, 0);
  bool unique = true;
  for (const auto b : c10::irange(B)) {
    for (const auto t : c10::irange(plan.length[plan.rank[b]])) {
      unique &= ++reads[gr.row(b, t)] == 1;
    }
  }
  // dW_hh straight from grad_xg (one row per position) unless padding rows would make that GEMM
  // more than 25% longer than the packed one; then dgates are kept packed too.
  const bool gemm_on_grad_xg = unique && 4 * R <= 5 * N;

  const auto opts = saved.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_xg = empty_large(xg_size, opts);
  at::Tensor grad_w_hh = at::empty({2, 4 * C, P}, opts);
  at::Tensor grad_w_proj = at::empty({2, P, C}, opts);
  at::Tensor grad_h0 = at::empty({2, B, P}, opts);
  at::Tensor grad_c0 = at::empty({2, B, C}, opts);
  // Expanded gradients (y.sum()'s has stride 0 everywhere) are materialized: rows are read as P contiguous.
  const at::Tensor grad_y = grad_y_opt.has_value() ? unit_last_stride(*grad_y_opt) : at::Tensor();
  const at::Tensor grad_h = grad_h_opt.has_value() ? grad_h_opt->contiguous() : at::Tensor();
  const at::Tensor grad_c = grad_c_opt.has_value() ? grad_c_opt->contiguous() : at::Tensor();
  const at::Tensor h0_c = h0_opt.has_value() ? h0_opt->contiguous() : at::Tensor();
  const at::Tensor c0_c = c0_opt.has_value() ? c0_opt->contiguous() : at::Tensor();
  const at::Tensor w_hh_c = w_hh.contiguous();
  const at::Tensor w_proj_c = w_proj.contiguous();
  const LstmTuning tuning = lstm_tuning(kOp, tuning_opt, false, 4 * C * P * int64_t{sizeof(float)});
  const bool concurrent = directions_concurrent(tuning, n0);
  const int64_t gemv_rows = lstm_cpu::gemv_rows(tuning, concurrent);

  // Per direction: dh [B, P] / dc [B, C] (sorted rows: the gradient of the state that each row's
  // next step backwards produced), dp [N, P], dgates ([N, 4C] packed, or one step's [n_0, 4C]),
  // h_prev for dW_hh (rows of dgates' GEMM partner: [R, P] or [N, P]), dm [n_0, C], the sorted c0 [B, C].
  struct Workspace {
    at::Tensor dh, dc, dp, dgates, h_prev, dm, c0;
  } ws[2];
  for (auto& w : ws) {
    w.dh = at::empty({B, P}, opts);
    w.dc = at::empty({B, C}, opts);
    w.dp = at::empty({N, P}, opts);
    w.dgates = empty_large({gemm_on_grad_xg ? n0 : N, 4 * C}, opts);
    w.h_prev = gemm_on_grad_xg ? at::empty({R, P}, opts) : w.dp;  // dp is spent by then
    w.dm = at::empty({n0, C}, opts);
    w.c0 = at::empty({B, C}, opts);
  }

  AT_DISPATCH_FLOATING_TYPES(dtype, "lstm_layer_backward", [&] {
    const scalar_t cc = static_cast<scalar_t>(clip_bound(cell_clip));
    const scalar_t pc = static_cast<scalar_t>(clip_bound(proj_clip));
    const scalar_t inf = std::numeric_limits<scalar_t>::infinity();
    const auto run = [&](int64_t d) {
      const LstmPlan& sc = plan;
      Workspace& w = ws[d];
      const at::Tensor saved_d = saved.select(0, d).view({-1});
      const scalar_t* base = saved_d.const_data_ptr<scalar_t>();
      // dm = dp W_proj and dh = dgates W_hh as linear_nt's a @ w^T: w = W^T, copied contiguous for gemv_nt.
      const at::Tensor whh_d = w_hh_c.select(0, d), wproj_d = w_proj_c.select(0, d);
      const Weight whh_t{whh_d.t().contiguous(), whh_d};
      const Weight wproj_t{wproj_d.t().contiguous(), wproj_d};
      const std::vector<int64_t> gy_offset =
          grad_y.defined() ? position_offsets(sc, d, grad_y.stride(0), grad_y.stride(1), grad_y.stride(2))
                           : std::vector<int64_t>();
      const at::Tensor grad_xg_d = grad_xg.view({2, R, 4 * C}).select(0, d);
      const std::vector<int64_t> xg_row = sc.per_position(d, [&](int64_t b, int64_t t) { return gr.row(b, t); });
      std::vector<int64_t> dxg_offset(xg_row.size());
      for (const auto r : c10::irange(N)) {
        dxg_offset[r] = xg_row[r] * 4 * C;
      }
      scalar_t* dxg = grad_xg_d.mutable_data_ptr<scalar_t>();
      for (const auto r : c10::irange(R)) {
        if (!unique || reads[r] == 0) {
          std::fill_n(dxg + r * 4 * C, 4 * C, scalar_t(0));
        }
      }
      scalar_t* dh = w.dh.mutable_data_ptr<scalar_t>();
      scalar_t* dc = w.dc.mutable_data_ptr<scalar_t>();
      scalar_t* c0s = w.c0.mutable_data_ptr<scalar_t>();
      for (const auto j : c10::irange(B)) {
        const int64_t b = sc.order[j];
        const auto row_or_zero = [&](scalar_t* dst, const at::Tensor& src, int64_t width) {
          if (src.defined()) {
            std::memcpy(dst, src.const_data_ptr<scalar_t>() + (d * B + b) * width, width * sizeof(scalar_t));
          } else {
            std::fill_n(dst, width, scalar_t(0));
          }
        };
        row_or_zero(dh + j * P, grad_h, P);
        row_or_zero(dc + j * C, grad_c, C);
        row_or_zero(c0s + j * C, c0_c, C);
      }
      scalar_t* dp = w.dp.mutable_data_ptr<scalar_t>();
      for (int64_t s = sc.steps() - 1; s >= 0; --s) {
        const int64_t n = sc.running[s];
        const int64_t off = sc.offset[s];
        lstm::ProjGradParams<scalar_t> pp;
        pp.grad_y = grad_y.defined() ? grad_y.const_data_ptr<scalar_t>() : nullptr;
        pp.grad_y_offset = grad_y.defined() ? gy_offset.data() + off : nullptr;
        pp.dh = dh;
        pp.p_raw = base + layout.p_raw + off * P;
        pp.dp = dp + off * P;
        pp.proj = P;
        pp.proj_clip = pc;
        rows_pass(pp, n, P);
        at::Tensor dm = w.dm.narrow(0, 0, n);
        linear_nt(dm, w.dp.narrow(0, off, n), wproj_t, gemv_rows);
        const at::Tensor dgates = w.dgates.narrow(0, gemm_on_grad_xg ? 0 : off, n);
        lstm::CellGradParams<scalar_t> cp;
        cp.act = base + layout.act + off * 4 * C;
        cp.c_raw = base + layout.c_raw + off * C;
        cp.c_prev = s > 0 ? base + layout.c_raw + sc.offset[s - 1] * C : c0s;
        cp.c_prev_clip = s > 0 ? cc : inf;
        cp.dm = w.dm.const_data_ptr<scalar_t>();
        cp.dc = dc;
        cp.dgates = dgates.mutable_data_ptr<scalar_t>();
        cp.dxg = dxg;
        cp.dxg_offset = dxg_offset.data() + off;
        cp.accumulate = !unique;
        cp.cell = C;
        cp.cell_clip = cc;
        rows_pass(cp, n, 4 * C);
        at::Tensor dh_active = w.dh.narrow(0, 0, n);
        linear_nt(dh_active, dgates, whh_t, gemv_rows);
      }
      // Weight gradients: one GEMM each.
      at::Tensor grad_w_proj_d = grad_w_proj.select(0, d);
      at::mm_out(grad_w_proj_d, w.dp.t(), view_at(saved_d, layout.m, N, C));
      // Each position's h_prev (h0, else the previous step's clipped projection), in the rows of
      // grad_xg (zero where none is read) or packed.
      scalar_t* hp = w.h_prev.mutable_data_ptr<scalar_t>();
      if (gemm_on_grad_xg) {
        for (const auto r : c10::irange(R)) {
          if (reads[r] == 0) {
            std::fill_n(hp + r * P, P, scalar_t(0));
          }
        }
      }
      for (const auto s : c10::irange(sc.steps())) {
        const int64_t off = sc.offset[s];
        for (const auto j : c10::irange(sc.running[s])) {
          scalar_t* row = hp + (gemm_on_grad_xg ? xg_row[off + j] : off + j) * P;
          if (s == 0) {
            if (h0_c.defined()) {
              std::memcpy(row, h0_c.const_data_ptr<scalar_t>() + (d * B + sc.order[j]) * P, P * sizeof(scalar_t));
            } else {
              std::fill_n(row, P, scalar_t(0));
            }
          } else {
            const scalar_t* raw = base + layout.p_raw + (sc.offset[s - 1] + j) * P;
            for (const auto k : c10::irange(P)) {
              row[k] = lstm::clip_to(raw[k], pc);
            }
          }
        }
      }
      at::Tensor grad_w_hh_d = grad_w_hh.select(0, d);
      at::mm_out(grad_w_hh_d, (gemm_on_grad_xg ? grad_xg_d : w.dgates).t(), w.h_prev);
      for (const auto b : c10::irange(B)) {
        const int64_t j = sc.rank[b];
        std::memcpy(grad_h0.mutable_data_ptr<scalar_t>() + (d * B + b) * P, dh + j * P, P * sizeof(scalar_t));
        std::memcpy(grad_c0.mutable_data_ptr<scalar_t>() + (d * B + b) * C, dc + j * C, C * sizeof(scalar_t));
      }
    };
    for_each_direction(concurrent, run);
  });
  return {grad_xg, grad_w_hh, grad_w_proj, grad_h0, grad_c0};
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(elmo_fast, CPU, m) {
  m.impl("lstm_layer_forward", &elmo_fast::lstm_layer_forward_cpu);
  m.impl("lstm_layer_backward", &elmo_fast::lstm_layer_backward_cpu);
}
