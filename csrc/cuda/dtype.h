// The element type of a kernel's tensors, shared by the kernels (.cu, no torch headers) and their
// bindings (.cpp, which map at::ScalarType onto it). Kernels load every type into its math type
// (float; double for kFloat64), compute there, and round once when they store.
#pragma once

namespace elmo_fast {
namespace gpu {

enum class Dtype : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
};

}  // namespace gpu
}  // namespace elmo_fast
