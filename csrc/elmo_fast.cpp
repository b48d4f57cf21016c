// The elmo_fast op library: every op schema is declared here, once. Each backend registers its
// kernels in its own file (csrc/cpu/*.cpp: TORCH_LIBRARY_IMPL(elmo_fast, CPU, m), csrc/cuda/*.cu:
// TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m)). Python reaches the ops through torch.ops.elmo_fast.*;
// elmo_fast/ops.py holds the typed wrappers and the fake (meta) implementations.
#include <Python.h>

#include <torch/library.h>

extern "C" {
// `import elmo_fast._C` needs a module init function, and importing is what loads this shared
// library, which runs the TORCH_LIBRARY static registrations below. The module itself has no
// methods (no pybind11): the ops are called through the dispatcher. WITH_CUDA tells Python
// whether CUDA kernels were compiled in, independent of whether a GPU is visible.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",     // name
      nullptr,  // doc
      -1,       // per-interpreter state: none
      nullptr,  // methods: none
  };
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) {
    return nullptr;
  }
#ifdef ELMO_FAST_WITH_CUDA
  const long with_cuda = 1;
#else
  const long with_cuda = 0;
#endif
  if (PyModule_AddIntConstant(module, "WITH_CUDA", with_cuda) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
}

TORCH_LIBRARY(elmo_fast, m) {
  // projected: [N, 2H] = [transform | gate], x: [N, H] -> [N, H]
  //   out = g * x + (1 - g) * relu(transform), g = sigmoid(gate)
  m.def("highway_gate(Tensor projected, Tensor x) -> Tensor");
  // x: [N, F] char CNN output; highway_weights: L x [2F, F] ([W_transform; -W_carry]);
  // highway_biases: L x [2F]; proj_weight: [P, F]; proj_bias: [P] -> [N, P]
  m.def("highway(Tensor x, Tensor[] highway_weights, Tensor[] highway_biases, Tensor proj_weight, "
        "Tensor proj_bias) -> Tensor");
  // char_ids: [N, 50] int64 in [0, V), char_embedding: [V, D], conv_weights[k]: [n_k, D, w_k],
  // conv_biases[k]: [n_k], activation: "relu" | "tanh" -> [N, sum n_k] in the weights' dtype
  //   out[:, k-th block] = act(max over the 50 - w_k + 1 windows of conv1d(embed(ids), W_k, b_k))
  m.def("char_cnn(Tensor char_ids, Tensor char_embedding, Tensor[] conv_weights, Tensor[] conv_biases, "
        "str activation) -> Tensor");
}
