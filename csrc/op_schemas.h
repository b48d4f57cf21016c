// Every op schema of the elmo_fast op library, declared once: csrc/elmo_fast.cpp defines the library
// with them, and the CPU emulator of the CUDA kernels (tests/cuda_emulation) defines its own op library
// (`elmo_fast_emu`) with the same schemas, on which the CUDA bindings compiled for the CPU register.
#pragma once

#include <torch/library.h>

namespace elmo_fast {

inline void define_ops(torch::Library& m) {
  // projected: [N, 2H] = [transform | gate], x: [N, H] -> [N, H]
  //   out = g * x + (1 - g) * relu(transform), g = sigmoid(gate)
  m.def("highway_gate(Tensor projected, Tensor x) -> Tensor");
  // highway_gate's gradients from grad [N, H]: -> grad_projected [N, 2H], grad_x [N, H]
  m.def("highway_gate_backward(Tensor grad, Tensor projected, Tensor x) -> (Tensor, Tensor)");
  // x: [N, F] char CNN output; highway_weights: L x [2F, F] ([W_transform; -W_carry]);
  // highway_biases: L x [2F]; proj_weight: [P, F]; proj_bias: [P] -> [N, P]
  // gemv_max_rows (CPU; None: the default): float GEMMs of at most this many rows take the op's own
  // GEMV (csrc/cpu/tuning.h); other devices ignore it
  m.def("highway(Tensor x, Tensor[] highway_weights, Tensor[] highway_biases, Tensor proj_weight, "
        "Tensor proj_bias, int? gemv_max_rows=None) -> Tensor");
  // char_ids: [N, L] int64 in [0, V) (ELMo's L is 50), char_embedding: [V, D], conv_weights[k]:
  // [n_k, D, w_k] (w_k <= L), conv_biases[k]: [n_k], activation: "relu" | "tanh" -> [N, sum n_k] in the
  // weights' dtype
  //   out[:, k-th block] = act(max over the L - w_k + 1 windows of conv1d(embed(ids), W_k, b_k))
  m.def("char_cnn(Tensor char_ids, Tensor char_embedding, Tensor[] conv_weights, Tensor[] conv_biases, "
        "str activation) -> Tensor");
  // char_cnn's gradients from grad_out [N, sum n_k] (other arguments: the forward's; the argmax
  // windows are recomputed): -> grad_embedding [V, D], grad_weights K x [n_k, D, w_k], grad_biases K x [n_k]
  m.def("char_cnn_backward(Tensor grad_out, Tensor char_ids, Tensor char_embedding, Tensor[] conv_weights, "
        "Tensor[] conv_biases, str activation) -> (Tensor, Tensor[], Tensor[])");
  // x [n, K] @ weight[N, K]^T + bias [N] -> [n, N], as F.linear (x, weight, bias of one dtype); few
  // rows against large weights stream the weights once (layer 0's input gates of a short batch), up to
  // gemv_max_rows rows (None: the default; csrc/cpu/tuning.h). CPU only, also: weight packed
  // (pack_weight) with float32 x and bias: a bf16 or float32 GEMM (the packed weight's dtype), float32 result
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, int? gemv_max_rows=None) -> Tensor");
  // weight [N, K] (float32, or bfloat16 with K even; N a multiple of 16) -> the same weight packed for
  // the CPU's BRGeMM micro-kernels, in its dtype: [N / nb, K / g, nb, g], g = 2 for bfloat16, 1 for
  // float32 (csrc/packed_weight.h). CPU only
  m.def("pack_weight(Tensor weight) -> Tensor");
  // dtype (float32, bfloat16) -> whether this CPU runs GEMMs of weights packed in it now (bfloat16:
  // oneDNN's BRGeMM micro-kernel, AVX-512 with BF16 or AMX, torch.backends.mkldnn enabled)
  m.def("packed_gemm_available(ScalarType dtype) -> bool");
  // ELMo's stacked projected biLSTM (forward and backward stacks, skip connections from layer 1):
  //   xg0: [U, 2, 4C] layer 0's input gates of distinct tokens (bias included), gates i, f, g, o
  //   token_index: [B, T] int64, the row of xg0 at each position (ignored at t >= lengths[b])
  //   lengths: [B] int64 in [0, T], any order
  //   weights: 8L tensors, weights[4 * (2l + d) + k]: w_ih [4C, P], w_hh [4C, P], bias [4C],
  //            w_proj [P, C] (layer 0's w_ih and bias unused: folded into xg0)
  //            (CPU: w_ih, w_hh and w_proj may all be packed, see pack_weight: bfloat16 ones, or
  //            float32 ones with float32 xg0)
  //   cell_clip, proj_clip: None or 0 = no clip;  h0: [L, B, 2P], c0: [L, B, 2C] or None (zeros)
  //   tuning: CPU: [gemv_rows_in_turn, gemv_rows_concurrent, concurrent_min_rows] (csrc/cpu/tuning.h),
  //           -1 or None for the defaults; other devices ignore it
  //   -> outputs [L, B, T, 2P] (0 at padding), h [L, B, 2P], c [L, B, 2C] (after each row's last step)
  m.def("bilstm(Tensor xg0, Tensor token_index, Tensor lengths, Tensor[] weights, float? cell_clip, "
        "float? proj_clip, Tensor? h0, Tensor? c0, int[]? tuning=None) -> (Tensor, Tensor, Tensor)");
  // One projected LSTM layer, both directions, trainable (oracle: reference.lstm_layer_pair_ref;
  // Python entry: elmo_fast.bilm.ops.lstm_layer, which returns (y, h, c)):
  //   xg: [2, B, T, 4C] input gates x W_ih^T + bias (forget-gate bias already +1), gates i, f, g, o,
  //       for direction 0 (forward in time) and 1 (from each row's own last token back to its
  //       first); positions t >= lengths[b] are never read
  //   lengths: [B] int64 in [0, T], any order;  w_hh: [2, 4C, P];  w_proj: [2, P, C]
  //   cell_clip, proj_clip: None or 0 = no clip;  h0: [2, B, P], c0: [2, B, C] or None (zeros)
  //   token_index: None, or [B, T] int64: then xg is [2, U, 4C] and position (b, t) reads its row
  //       token_index[b, t] (as bilstm's xg0; rows may repeat), so that packed gates need no padding
  //   tuning: as bilstm's (CPU; None for the defaults)
  //   -> y [2, B, T, P] (0 at padding), h [2, B, P], c [2, B, C] (after each row's last step),
  //      saved [2, N, 6C + P] (N = sum of lengths): what the backward reads (packed rows, see
  //      csrc/cpu/lstm_layer_cpu.cpp), not differentiable. Its autograd formula (elmo_fast/bilm/ops.py)
  //      runs lstm_layer_backward. (No op without `saved`: a composite dropping it would hide its
  //      data-dependent size from torch.compile, which then refuses to trace it.)
  m.def("lstm_layer_forward(Tensor xg, Tensor lengths, Tensor w_hh, Tensor w_proj, float? cell_clip, "
        "float? proj_clip, Tensor? h0, Tensor? c0, Tensor? token_index=None, int[]? tuning=None) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // Backpropagation through time of lstm_layer_forward. grad_y [2, B, T, P], grad_h [2, B, P],
  // grad_c [2, B, C]: None for zeros; xg_size: xg's shape; the other arguments are the forward's
  //   -> grad_xg (xg's shape; 0 where no position reads), grad_w_hh [2, 4C, P], grad_w_proj [2, P, C],
  //      grad_h0 [2, B, P], grad_c0 [2, B, C]
  m.def("lstm_layer_backward(Tensor? grad_y, Tensor? grad_h, Tensor? grad_c, Tensor saved, Tensor lengths, "
        "Tensor? token_index, SymInt[] xg_size, Tensor w_hh, Tensor w_proj, float? cell_clip, float? proj_clip, "
        "Tensor? h0, Tensor? c0, int[]? tuning=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

}  // namespace elmo_fast
