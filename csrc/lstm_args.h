// Argument checks of the `bilstm` op, shared by its CPU and CUDA bindings. Each binding first checks
// its own device type and the dtypes it supports (xg0's, and which dtype the GEMM weights may have),
// then calls check_bilstm_args for everything else. Likewise check_lstm_layer_args for the trainable
// layer ops `lstm_layer_forward` / `lstm_layer_backward`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "checks.h"

namespace elmo_fast {

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
             "the backward direction), got ", weights.size());
  ELMO_CHECK(weights[3].dim() == 2, "weights[3] (w_proj of layer 0, forward) must have 2 dims, got ",
             weights[3].dim());
  ELMO_CHECK_DIM(xg0, 3);
  ELMO_CHECK_DIM(token_index, 2);
  return BilstmDims{static_cast<int64_t>(weights.size()) / 8, weights[3].size(0), weights[3].size(1),
                    xg0.size(0), token_index.size(0), token_index.size(1)};
}

// xg0: [U, 2, 4C]; token_index: [B, T] int64; lengths: [B] int64; weights: 8L tensors, per (layer,
// direction) w_ih [4C, P], w_hh [4C, P], bias [4C], w_proj [P, C] (layer 0's w_ih and bias are
// folded into xg0 and not read); h0: [L, B, 2P], c0: [L, B, 2C], of xg0's dtype; clips >= 0 or None.
// Every weight has dtype `wdtype` (the binding decides which are allowed), a bias may also have
// xg0's dtype; weights, h0 and c0 live on xg0's device. Devices of token_index and lengths, and the
// values of lengths and token_index, are the binding's to check.
inline void check_bilstm_args(const BilstmDims& dims, const at::Tensor& xg0, const at::Tensor& lengths,
                              at::TensorList weights, at::ScalarType wdtype, std::optional<double> cell_clip,
                              std::optional<double> proj_clip, const std::optional<at::Tensor>& h0_opt,
                              const std::optional<at::Tensor>& c0_opt) {
  static constexpr char kOp[] = "bilstm";
  static constexpr const char* kWeightName[4] = {"w_ih", "w_hh", "bias", "w_proj"};
  const int64_t L = dims.L, P = dims.P, C = dims.C, U = dims.U, B = dims.B;
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
        const std::vector<int64_t> want = k == 2 ? std::vector<int64_t>{4 * C}
                                          : k == 3 ? std::vector<int64_t>{P, C}
                                                   : std::vector<int64_t>{4 * C, P};
        const char* dir = d == 0 ? "forward" : "backward";
        ELMO_CHECK(w.sizes() == at::IntArrayRef(want), "weights[", i, "] (", kWeightName[k], " of layer ", l, ", ",
                   dir, ") expected shape ", at::IntArrayRef(want), ", got ", w.sizes());
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
  for (const auto& [name, v] : {std::pair<const char*, std::optional<double>>{"cell_clip", cell_clip},
                                std::pair<const char*, std::optional<double>>{"proj_clip", proj_clip}}) {
    ELMO_CHECK(!v.has_value() || *v >= 0.0, name, " must be positive, 0 or None, got ", *v);
  }
}

// The sizes of a lstm_layer call.
struct LstmLayerDims {
  int64_t B;  // batch rows
  int64_t T;  // positions per row
  int64_t P;  // projection (output) width
  int64_t C;  // cell width
};

// The weights and states of `lstm_layer_forward` / `lstm_layer_backward` (op name kOp), for B rows:
// w_hh: [2, 4C, P], w_proj: [2, P, C] (P, C read from w_proj, checked first), h0: [2, B, P],
// c0: [2, B, C], all of dtype `dtype` on `device`; lengths: [B] int64 (values: the binding's);
// clips >= 0 or None.
inline LstmLayerDims check_lstm_layer_weights(const char* kOp, int64_t B, int64_t T, const at::Tensor& lengths,
                                              const at::Tensor& w_hh, const at::Tensor& w_proj,
                                              at::ScalarType dtype, at::Device device,
                                              std::optional<double> cell_clip, std::optional<double> proj_clip,
                                              const std::optional<at::Tensor>& h0_opt,
                                              const std::optional<at::Tensor>& c0_opt) {
  ELMO_CHECK(w_proj.dim() == 3 && w_proj.size(0) == 2, "w_proj must have shape [2, P, C] (forward, backward), got ",
             w_proj.sizes());
  const int64_t P = w_proj.size(1), C = w_proj.size(2);
  ELMO_CHECK_SHAPE(w_hh, 2, 4 * C, P);
  ELMO_CHECK_DIM(lengths, 1);
  ELMO_CHECK_SHAPE(lengths, B);
  ELMO_CHECK_DTYPE(lengths, at::kLong);
  for (const auto& [name, w] : {std::pair<const char*, const at::Tensor*>{"w_hh", &w_hh},
                                std::pair<const char*, const at::Tensor*>{"w_proj", &w_proj}}) {
    ELMO_CHECK(w->scalar_type() == dtype, name, " must have dtype ", dtype_name(dtype), ", got ",
               dtype_name(w->scalar_type()));
    ELMO_CHECK(w->device() == device, name, " must be on device ", device, ", got ", w->device());
  }
  if (h0_opt.has_value()) {
    const at::Tensor& h0 = *h0_opt;
    ELMO_CHECK_SHAPE(h0, 2, B, P);
    ELMO_CHECK(h0.scalar_type() == dtype && h0.device() == device, "h0 must have dtype ", dtype_name(dtype),
               " and device ", device, ", got ", dtype_name(h0.scalar_type()), " on ", h0.device());
  }
  if (c0_opt.has_value()) {
    const at::Tensor& c0 = *c0_opt;
    ELMO_CHECK_SHAPE(c0, 2, B, C);
    ELMO_CHECK(c0.scalar_type() == dtype && c0.device() == device, "c0 must have dtype ", dtype_name(dtype),
               " and device ", device, ", got ", dtype_name(c0.scalar_type()), " on ", c0.device());
  }
  for (const auto& [name, v] : {std::pair<const char*, std::optional<double>>{"cell_clip", cell_clip},
                                std::pair<const char*, std::optional<double>>{"proj_clip", proj_clip}}) {
    ELMO_CHECK(!v.has_value() || *v >= 0.0, name, " must be positive, 0 or None, got ", *v);
  }
  return LstmLayerDims{B, T, P, C};
}

}  // namespace elmo_fast
