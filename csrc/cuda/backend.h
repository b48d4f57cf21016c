// What the CUDA bindings (csrc/cuda/*.cpp) take from CUDA itself: the device guard, the current
// stream, the launch check, the device check of inputs, and where the kernels register.
//
// Normal builds: c10::cuda::CUDAGuard, c10::cuda::getCurrentCUDAStream(),
// C10_CUDA_KERNEL_LAUNCH_CHECK(), CUDA tensors, TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m).
// -DELMO_FAST_EMULATE_CUDA (only tests/cuda_emulation): CPU stand-ins and the op library
// `elmo_fast_emu` on the CPU key, so the same bindings and kernels run on CPU tensors, against the
// references, on machines without a GPU.
#pragma once

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#ifdef ELMO_FAST_EMULATE_CUDA

namespace elmo_fast {
namespace gpu {
struct DeviceGuard {
  explicit DeviceGuard(c10::Device) {}
};
inline cudaStream_t current_stream() { return nullptr; }
}  // namespace gpu
}  // namespace elmo_fast
#define ELMO_GPU_LAUNCH_CHECK() ((void)0)
#define ELMO_CHECK_GPU(x) ELMO_CHECK_CPU(x)
#define ELMO_GPU_LIBRARY elmo_fast_emu
#define ELMO_GPU_DISPATCH_KEY CPU

#else

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace elmo_fast {
namespace gpu {
using DeviceGuard = c10::cuda::CUDAGuard;
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }
}  // namespace gpu
}  // namespace elmo_fast
#define ELMO_GPU_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
#define ELMO_CHECK_GPU(x) ELMO_CHECK_CUDA(x)
#define ELMO_GPU_LIBRARY elmo_fast
#define ELMO_GPU_DISPATCH_KEY CUDA

#endif
