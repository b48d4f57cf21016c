// The elmo_fast op library: every op schema is declared once, in op_schemas.h. Each backend registers
// its kernels in its own file (csrc/cpu/*.cpp: TORCH_LIBRARY_IMPL(elmo_fast, CPU, m), csrc/cuda/*.cpp:
// TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m), launching the kernels of csrc/cuda/*.cu). Python reaches the
// ops through torch.ops.elmo_fast.*; elmo_fast/bilm/ops.py holds the typed wrappers and the fake (meta)
// implementations.
#include <Python.h>

#include <torch/library.h>

#include "op_schemas.h"

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

TORCH_LIBRARY(elmo_fast, m) { elmo_fast::define_ops(m); }
