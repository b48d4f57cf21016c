// Argument checks of the LSTM ops, one set for the CPU and the CUDA bindings (as flash-attention's
// set_params_*: written once, every backend calls them), in the CPU op's words:
//   * `bilstm`: each binding checks its own device type and the dtypes it supports (xg0's, and which
//     dtype the GEMM weights may have), then check_bilstm_args for everything else and
//     bilstm_host_lengths for the lengths' values;
//   * `lstm_layer_forward` / `lstm_layer_backward`: each binding checks xg's / saved's device type, then
//     check_lstm_layer_forward_args / check_lstm_layer_backward_args (lengths, token_index and xg's
//     shape, read on the host; weights, states, gradients), and check_saved once the plan is made.
// Where lengths and token_index may live is one rule: on the CPU, or on the op's device (a CUDA
// binding then copies them to the host, a device sync), so a CPU op takes CPU tensors only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "packed_weight.h"

namespace elmo_fast {

// The clip of a `cell_clip` / `proj_clip` argument as a bound: as the reference, None or 0 means no
// clip (+inf).
inline double clip_bound(std::optional<double> v) {
  return !v.has_value() || *v == 0.0 ? std::numeric_limits<double>::infinity() : *v;
}

inline void check_clips(const char* kOp, std::optional<double> cell_clip, std::optional<double> proj_clip) {
  for (const auto& [name, v] : {std::pair<const char*, std::optional<double>>{"cell_clip", cell_clip},
                                std::pair<const char*, std::optional<double>>{"proj_clip", proj_clip}}) {
    ELMO_CHECK(!v.has_value() || *v >= 0.0, name, " must be positive, 0 or None, got ", *v);
  }
}

// The trainable layer's dtypes (both backends): float32 or float64.
inline void check_float_or_double(const char* kOp, const char* name, at::ScalarType dtype) {
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kDouble, name, " has dtype ", dtype_name(dtype),
             "; supported: float32, float64");
}

// `name` (lengths, token_index) on the CPU or on the op's `device`.
inline void check_on_host_or(const char* kOp, const char* name, const at::Tensor& t, c10::Device device) {
  ELMO_CHECK(t.device().is_cpu() || t.device() == device, name, " must be a CPU tensor",
             device.is_cpu() ? std::string() : " or on " + device.str(), ", got ", t.device());
}

// lengths [B] (already checked: dims, dtype, device) on the host, contiguous, with every value in
// [0, T] (checked).
inline at::Tensor host_lengths(const char* kOp, const at::Tensor& lengths, int64_t T) {
  at::Tensor host = lengths.to(at::kCPU).contiguous();
  const int64_t* len = host.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < host.size(0); ++b) {
    ELMO_CHECK(len[b] >= 0 && len[b] <= T, "lengths[", b, "] = ", len[b], " is out of range [0, T = ", T, "]");
  }
  return host;
}

// index [B, T] contiguous on the host, lengths [B] (checked): every position t < lengths[b] reads a
// row of `xg` ("xg0" / "xg"), which has `rows` rows.
inline void check_token_rows(const char* kOp, const int64_t* index, const int64_t* lengths, int64_t B, int64_t T,
                             int64_t rows, const char* xg) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < lengths[b]; ++t) {
      const int64_t u = index[b * T + t];
      ELMO_CHECK(u >= 0 && u < rows, "token_index[", b, ", ", t, "] = ", u, " is out of range for ", xg, " with ", rows,
                 " rows (positions before lengths[", b, "] = ", lengths[b], " must index ", xg, ")");
    }
  }
}

// The sizes a valid call implies.
struct BilstmDims {
  int64_t L;  // layers
  int64_t P;  // projection (LSTM output) width
  int64_t C;  // cell width
  int64_t U;  // rows of xg0 (distinct tokens)
  int64_t B;  // batch rows
  int64_t T;  // positions per row
};

// The number of layers and P, C from weights[3] (w_proj of layer 0, forward), checked first: every
// other shape follows from them. Call before the dtype checks that read weights[1].
inline BilstmDims bilstm_dims(const at::Tensor& xg0, const at::Tensor& token_index, at::TensorList weights) {
  static constexpr char kOp[] = "bilstm";
  ELMO_CHECK(!weights.empty() && weights.size() % 8 == 0,
             "weights must hold 8 tensors per layer (w_ih, w_hh, bias, w_proj of the forward, then "
             "the backward direction), got ",
             weights.size());
  const std::vector<int64_t> proj = weight_sizes(weights[3]);  // a packed weight's [P, C] too
  ELMO_CHECK(proj.size() == 2, "weights[3] (w_proj of layer 0, forward) must have 2 dims, got ", weights[3].dim());
  ELMO_CHECK_DIM(xg0, 3);
  ELMO_CHECK_DIM(token_index, 2);
  return BilstmDims{static_cast<int64_t>(weights.size()) / 8,
                    proj[0],
                    proj[1],
                    xg0.size(0),
                    token_index.size(0),
                    token_index.size(1)};
}

// xg0: [U, 2, 4C]; token_index: [B, T] int64 on xg0's device; lengths: [B] int64 on the CPU or xg0's
// device; weights: 8L tensors, per (layer, direction) w_ih [4C, P], w_hh [4C, P], bias [4C], w_proj
// [P, C] (layer 0's w_ih and bias are folded into xg0 and not read); h0: [L, B, 2P], c0: [L, B, 2C], of
// xg0's dtype; clips >= 0 or None. Every weight has dtype `wdtype` (the binding decides which are
// allowed), a bias may also have xg0's dtype; weights, h0 and c0 live on xg0's device. The values of
// lengths: bilstm_host_lengths; of token_index: the binding's (the CPU op checks them, the CUDA op
// clamps them as the reference does, since reading them would cost a device sync). With `packed_ok`
// (the CPU op), w_ih, w_hh and w_proj may each be packed (packed_weight.h).
inline void check_bilstm_args(const BilstmDims& dims, const at::Tensor& xg0, const at::Tensor& token_index,
                              const at::Tensor& lengths, at::TensorList weights, at::ScalarType wdtype,
                              std::optional<double> cell_clip, std::optional<double> proj_clip,
                              const std::optional<at::Tensor>& h0_opt, const std::optional<at::Tensor>& c0_opt,
                              bool packed_ok = false) {
  static constexpr char kOp[] = "bilstm";
  static constexpr const char* kWeightName[4] = {"w_ih", "w_hh", "bias", "w_proj"};
  const int64_t L = dims.L, P = dims.P, C = dims.C, U = dims.U, B = dims.B;
  ELMO_CHECK_DTYPE(token_index, at::kLong);
  ELMO_CHECK_DTYPE(lengths, at::kLong);
  ELMO_CHECK_SAME_DEVICE(token_index, xg0);
  check_on_host_or(kOp, "lengths", lengths, xg0.device());
  ELMO_CHECK(xg0.size(1) == 2 && xg0.size(2) == 4 * C, "xg0 expected shape [U, 2, 4C] = [", U, ", 2, ", 4 * C,
             "] (C = ", C, " from weights[3] = w_proj [P, C]), got ", xg0.sizes());
  ELMO_CHECK_DIM(lengths, 1);
  ELMO_CHECK_SHAPE(lengths, B);
  const at::ScalarType dtype = xg0.scalar_type();
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t d = 0; d < 2; ++d) {
      for (int64_t k = 0; k < 4; ++k) {
        if (l == 0 && (k == 0 || k == 2)) {
          continue;  // layer 0's w_ih and bias are folded into xg0
        }
        const int64_t i = 4 * (2 * l + d) + k;
        const at::Tensor& w = weights[i];
        const std::vector<int64_t> want = k == 2   ? std::vector<int64_t>{4 * C}
                                          : k == 3 ? std::vector<int64_t>{P, C}
                                                   : std::vector<int64_t>{4 * C, P};
        const char* dir = d == 0 ? "forward" : "backward";
        const bool packed = is_packed_weight(w) && k != 2;
        ELMO_CHECK(!packed || packed_ok, "weights[", i, "] (", kWeightName[k], " of layer ", l, ", ", dir,
                   ") is packed (pack_weight): only the CPU op takes packed weights");
        ELMO_CHECK(weight_sizes(w) == want, "weights[", i, "] (", kWeightName[k], " of layer ", l, ", ", dir,
                   ") expected shape ", at::IntArrayRef(want), packed ? " (packed)" : "", ", got ",
                   at::IntArrayRef(weight_sizes(w)));
        ELMO_CHECK(w.scalar_type() == wdtype || (k == 2 && w.scalar_type() == dtype), "weights[", i, "] (",
                   kWeightName[k], " of layer ", l, ", ", dir, ") must have the dtype of the other weights (",
                   dtype_name(wdtype), "), got ", dtype_name(w.scalar_type()));
        ELMO_CHECK(w.device() == xg0.device(), "weights[", i, "] (", kWeightName[k], ") must be on xg0's device ",
                   xg0.device(), ", got ", w.device());
      }
    }
  }
  if (h0_opt.has_value()) {
    const at::Tensor& h0 = *h0_opt;
    ELMO_CHECK_SHAPE(h0, L, B, 2 * P);
    ELMO_CHECK_SAME_DTYPE(h0, xg0);
    ELMO_CHECK_SAME_DEVICE(h0, xg0);
  }
  if (c0_opt.has_value()) {
    const at::Tensor& c0 = *c0_opt;
    ELMO_CHECK_SHAPE(c0, L, B, 2 * C);
    ELMO_CHECK_SAME_DTYPE(c0, xg0);
    ELMO_CHECK_SAME_DEVICE(c0, xg0);
  }
  check_clips(kOp, cell_clip, proj_clip);
}

// bilstm's lengths (checked by check_bilstm_args) on the host, contiguous, values checked in [0, T].
inline at::Tensor bilstm_host_lengths(const BilstmDims& dims, const at::Tensor& lengths) {
  return host_lengths("bilstm", lengths, dims.T);
}

// What the host reads of a lstm_layer call's lengths and token_index, and the shapes they imply.
struct GateRows {
  at::Tensor lengths;  // [B] int64, contiguous, on the CPU
  at::Tensor index;    // [B, T] int64, contiguous, on the CPU; undefined for a dense xg
  int64_t batch = 0;   // B
  int64_t time = 0;    // T
  int64_t rows = 0;    // R, rows of xg per direction: B T (dense) or U (token_index)

  const int64_t* length() const { return lengths.const_data_ptr<int64_t>(); }
  // xg's row (per direction) that position (b, t) reads.
  int64_t row(int64_t b, int64_t t) const {
    return index.defined() ? index.const_data_ptr<int64_t>()[b * time + t] : b * time + t;
  }
};

// C of a lstm_layer call, from w_proj [2, P, C] (checked first: the other shapes follow from it).
inline int64_t lstm_layer_cell(const char* kOp, const at::Tensor& w_proj) {
  ELMO_CHECK(w_proj.dim() == 3 && w_proj.size(0) == 2, "w_proj must have shape [2, P, C] (forward, backward), got ",
             w_proj.sizes());
  return w_proj.size(2);
}

// xg_size: [2, B, T, 4C], or [2, U, 4C] with token_index [B, T]; lengths: [B] int64 with values in
// [0, T]; token_index (when given): int64, in [0, U) at every position t < lengths[b]. lengths and
// token_index live on the CPU or on the op's `device` (then they are copied to the host).
inline GateRows check_gate_rows(const char* kOp, at::IntArrayRef xg_size, const at::Tensor& lengths,
                                const std::optional<at::Tensor>& token_index, int64_t C, c10::Device device) {
  ELMO_CHECK_DIM(lengths, 1);
  ELMO_CHECK_DTYPE(lengths, at::kLong);
  check_on_host_or(kOp, "lengths", lengths, device);
  GateRows g;
  g.batch = lengths.size(0);
  const int64_t B = g.batch;
  if (token_index.has_value()) {
    ELMO_CHECK(token_index->dim() == 2 && token_index->size(0) == B, "token_index must have shape [B, T] = [", B,
               ", T], got ", token_index->sizes());
    ELMO_CHECK(token_index->scalar_type() == at::kLong, "token_index must have dtype int64, got ",
               dtype_name(token_index->scalar_type()));
    check_on_host_or(kOp, "token_index", *token_index, device);
    g.time = token_index->size(1);
    ELMO_CHECK(xg_size.size() == 3 && xg_size[0] == 2 && xg_size[2] == 4 * C,
               "xg with token_index expected shape [2, U, 4C] = [2, U, ", 4 * C, "] (C = ", C,
               " from w_proj [2, P, C]), got ", xg_size);
    g.rows = xg_size[1];
  } else {
    ELMO_CHECK(xg_size.size() == 4 && xg_size[0] == 2 && xg_size[1] == B && xg_size[3] == 4 * C,
               "xg expected shape [2, B, T, 4C] = [2, ", B, ", T, ", 4 * C, "] (B from lengths, C = ", C,
               " from w_proj [2, P, C]), got ", xg_size);
    g.time = xg_size[2];
    g.rows = B * g.time;
  }
  g.lengths = host_lengths(kOp, lengths, g.time);
  if (token_index.has_value()) {
    g.index = token_index->to(at::kCPU).contiguous();
    check_token_rows(kOp, g.index.const_data_ptr<int64_t>(), g.length(), B, g.time, g.rows, "xg");
  }
  return g;
}

// The sizes of a lstm_layer call.
struct LstmLayerDims {
  int64_t B;  // batch rows
  int64_t T;  // positions per row
  int64_t P;  // projection (output) width
  int64_t C;  // cell width
};

// The weights and states of `lstm_layer_forward` / `lstm_layer_backward` (op name kOp), for the rows
// of `gr`: w_hh: [2, 4C, P], w_proj: [2, P, C] (P, C read from w_proj, checked first), h0: [2, B, P],
// c0: [2, B, C], all of dtype `dtype` on `device`; clips >= 0 or None.
inline LstmLayerDims check_lstm_layer_weights(const char* kOp, const GateRows& gr, const at::Tensor& w_hh,
                                              const at::Tensor& w_proj, at::ScalarType dtype, at::Device device,
                                              std::optional<double> cell_clip, std::optional<double> proj_clip,
                                              const std::optional<at::Tensor>& h0_opt,
                                              const std::optional<at::Tensor>& c0_opt) {
  const int64_t B = gr.batch, T = gr.time;
  const int64_t P = w_proj.size(1), C = lstm_layer_cell(kOp, w_proj);
  ELMO_CHECK_SHAPE(w_hh, 2, 4 * C, P);
  for (const auto& [name, w] : {std::pair<const char*, const at::Tensor*>{"w_hh", &w_hh},
                                std::pair<const char*, const at::Tensor*>{"w_proj", &w_proj}}) {
    ELMO_CHECK(w->scalar_type() == dtype, name, " must have dtype ", dtype_name(dtype), ", got ",
               dtype_name(w->scalar_type()));
    ELMO_CHECK(w->device() == device, name, " must be on device ", device, ", got ", w->device());
  }
  for (const auto& [name, state, width] :
       {std::tuple<const char*, const std::optional<at::Tensor>*, int64_t>{"h0", &h0_opt, P},
        std::tuple<const char*, const std::optional<at::Tensor>*, int64_t>{"c0", &c0_opt, C}}) {
    if (state->has_value()) {
      const at::Tensor& x = **state;
      ELMO_CHECK(x.sizes() == at::IntArrayRef({2, B, width}), name, " expected shape ", at::IntArrayRef({2, B, width}),
                 ", got ", x.sizes());
      ELMO_CHECK(x.scalar_type() == dtype && x.device() == device, name, " must have dtype ", dtype_name(dtype),
                 " and device ", device, ", got ", dtype_name(x.scalar_type()), " on ", x.device());
    }
  }
  check_clips(kOp, cell_clip, proj_clip);
  return LstmLayerDims{B, T, P, C};
}

// lstm_layer_backward's output gradients: grad_y [2, B, T, P], grad_h [2, B, P], grad_c [2, B, C], each
// None (zeros) or of `dtype` on `device`.
inline void check_lstm_layer_grads(const char* kOp, const LstmLayerDims& dims, const std::optional<at::Tensor>& grad_y,
                                   const std::optional<at::Tensor>& grad_h, const std::optional<at::Tensor>& grad_c,
                                   at::ScalarType dtype, at::Device device) {
  const int64_t B = dims.B, T = dims.T, P = dims.P, C = dims.C;
  for (const auto& [name, g, shape] :
       {std::tuple<const char*, const std::optional<at::Tensor>*, std::vector<int64_t>>{
            "grad_y", &grad_y, {2, B, T, P}},
        std::tuple<const char*, const std::optional<at::Tensor>*, std::vector<int64_t>>{"grad_h", &grad_h, {2, B, P}},
        std::tuple<const char*, const std::optional<at::Tensor>*, std::vector<int64_t>>{
            "grad_c", &grad_c, {2, B, C}}}) {
    if (g->has_value()) {
      ELMO_CHECK((*g)->sizes() == at::IntArrayRef(shape), name, " expected shape ", at::IntArrayRef(shape), ", got ",
                 (*g)->sizes());
      ELMO_CHECK((*g)->scalar_type() == dtype && (*g)->device() == device, name, " must have dtype ", dtype_name(dtype),
                 " on ", device);
    }
  }
}

// saved: lstm_layer_forward's record for N = sum of lengths packed positions, [2, N, 6C + P] contiguous.
inline void check_saved(const char* kOp, const at::Tensor& saved, int64_t N, const LstmLayerDims& dims) {
  const int64_t P = dims.P, C = dims.C;
  ELMO_CHECK(saved.size(0) == 2 && saved.size(1) == N && saved.size(2) == 6 * C + P && saved.is_contiguous(),
             "saved must be lstm_layer_forward's contiguous [2, N, 6C + P] = [2, ", N, ", ", 6 * C + P,
             "] (N = sum of lengths), got shape ", saved.sizes());
}

// A checked lstm_layer_forward / lstm_layer_backward call: what the host reads of its rows, its sizes.
struct LstmLayerArgs {
  GateRows rows;
  LstmLayerDims dims;
};

// lstm_layer_forward's arguments (see the schema in op_schemas.h), all but xg's device type, which the
// binding checks first.
inline LstmLayerArgs check_lstm_layer_forward_args(const at::Tensor& xg, const at::Tensor& lengths,
                                                   const at::Tensor& w_hh, const at::Tensor& w_proj,
                                                   std::optional<double> cell_clip, std::optional<double> proj_clip,
                                                   const std::optional<at::Tensor>& h0,
                                                   const std::optional<at::Tensor>& c0,
                                                   const std::optional<at::Tensor>& token_index) {
  static constexpr char kOp[] = "lstm_layer_forward";
  check_float_or_double(kOp, "xg", xg.scalar_type());
  GateRows rows = check_gate_rows(kOp, xg.sizes(), lengths, token_index, lstm_layer_cell(kOp, w_proj), xg.device());
  const LstmLayerDims dims =
      check_lstm_layer_weights(kOp, rows, w_hh, w_proj, xg.scalar_type(), xg.device(), cell_clip, proj_clip, h0, c0);
  return {std::move(rows), dims};
}

// lstm_layer_backward's arguments, all but saved's device type (the binding's, checked first) and saved's
// size, which check_saved checks against the plan.
inline LstmLayerArgs check_lstm_layer_backward_args(
    const std::optional<at::Tensor>& grad_y, const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_c, const at::Tensor& saved, const at::Tensor& lengths,
    const std::optional<at::Tensor>& token_index, at::IntArrayRef xg_size, const at::Tensor& w_hh,
    const at::Tensor& w_proj, std::optional<double> cell_clip, std::optional<double> proj_clip,
    const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0) {
  static constexpr char kOp[] = "lstm_layer_backward";
  ELMO_CHECK_DIM(saved, 3);
  check_float_or_double(kOp, "saved", saved.scalar_type());
  GateRows rows = check_gate_rows(kOp, xg_size, lengths, token_index, lstm_layer_cell(kOp, w_proj), saved.device());
  const LstmLayerDims dims = check_lstm_layer_weights(kOp, rows, w_hh, w_proj, saved.scalar_type(), saved.device(),
                                                      cell_clip, proj_clip, h0, c0);
  check_lstm_layer_grads(kOp, dims, grad_y, grad_h, grad_c, saved.scalar_type(), saved.device());
  return {std::move(rows), dims};
}

}  // namespace elmo_fast
