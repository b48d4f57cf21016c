// The op library of the emulation build, `elmo_fast_emu`: the schemas of csrc/op_schemas.h, the real
// library's (the emulation tests compare them when it is loaded). The bindings of csrc/cuda/*.cpp,
// compiled with -DELMO_FAST_EMULATE_CUDA, register their kernels here on CPU.
#include <torch/library.h>

#include "op_schemas.h"

TORCH_LIBRARY(elmo_fast_emu, m) {
  elmo_fast::define_ops(m);
}
