// The op library of the emulation build, `elmo_fast_emu`: the schemas of csrc/elmo_fast.cpp (the
// emulation tests compare them with the real library's when it is loaded). The bindings of
// csrc/cuda/*.cpp, compiled with -DELMO_FAST_EMULATE_CUDA, register their kernels here on CPU.
#include <torch/library.h>

TORCH_LIBRARY(elmo_fast_emu, m) {
  m.def("highway_gate(Tensor projected, Tensor x) -> Tensor");
  m.def("highway_gate_backward(Tensor grad, Tensor projected, Tensor x) -> (Tensor, Tensor)");
  m.def("highway(Tensor x, Tensor[] highway_weights, Tensor[] highway_biases, Tensor proj_weight, "
        "Tensor proj_bias) -> Tensor");
  m.def("char_cnn(Tensor char_ids, Tensor char_embedding, Tensor[] conv_weights, Tensor[] conv_biases, "
        "str activation) -> Tensor");
  m.def("char_cnn_backward(Tensor grad_out, Tensor char_ids, Tensor char_embedding, Tensor[] conv_weights, "
        "Tensor[] conv_biases, str activation) -> (Tensor, Tensor[], Tensor[])");
  m.def(
      "bilstm(Tensor xg0, Tensor token_index, Tensor lengths, Tensor[] weights, float? cell_clip, "
      "float? proj_clip, Tensor? h0, Tensor? c0) -> (Tensor, Tensor, Tensor)");
  m.def("lstm_layer_forward(Tensor xg, Tensor lengths, Tensor w_hh, Tensor w_proj, float? cell_clip, "
        "float? proj_clip, Tensor? h0, Tensor? c0, Tensor? token_index=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("lstm_layer_backward(Tensor? grad_y, Tensor? grad_h, Tensor? grad_c, Tensor saved, Tensor lengths, "
        "Tensor? token_index, SymInt[] xg_size, Tensor w_hh, Tensor w_proj, float? cell_clip, float? proj_clip, "
        "Tensor? h0, Tensor? c0) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}
