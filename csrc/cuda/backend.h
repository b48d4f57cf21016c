// What the CUDA bindings (csrc/cuda/*.cpp) take from CUDA itself: the device guard, the current
// stream, the launch check, the device check of inputs, and where the kernels register.
//
// Normal builds: c10::cuda::CUDAGuard, c10::cuda::getCurrentCUDAStream(),
// C10_CUDA_KERNEL_LAUNCH_CHECK(), CUDA tensors, TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m).
// -DELMO_FAST_EMULATE_CUDA (only tests/cuda_emulation): CPU stand-ins and the op library
// `elmo_fast_emu` on the CPU key, so the same bindings and kernels run on CPU tensors, against the
// references, on machines without a GPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

// Besides: host_staging(dtype), the options of host buffers whose contents (schedules made on the
// host) a binding copies to the device with to_device_async(host, device). Normal builds: pinned
// memory and a non_blocking copy, so that the host never waits for the device (from pageable
// memory c10 copies synchronously) and a CUDA graph can capture the copy (PyTorch keeps pinned
// blocks allocated during a capture alive with the graph; a replay copies them again).

#ifdef ELMO_FAST_EMULATE_CUDA

namespace elmo_fast {
namespace gpu {
struct DeviceGuard {
  explicit DeviceGuard(c10::Device) {}
};
inline cudaStream_t current_stream() { return nullptr; }
inline at::TensorOptions host_staging(at::ScalarType dtype) { return at::TensorOptions().dtype(dtype); }
inline at::Tensor to_device_async(const at::Tensor& host, c10::Device device) {
  return host.to(at::TensorOptions().dtype(host.scalar_type()).device(device), /*non_blocking=*/true);
}
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
inline at::TensorOptions host_staging(at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).pinned_memory(true);
}
// The caching host allocator records the copy on the current stream: the pinned block is not reused
// before the copy has read it.
inline at::Tensor to_device_async(const at::Tensor& host, c10::Device device) {
  return host.to(at::TensorOptions().dtype(host.scalar_type()).device(device), /*non_blocking=*/true);
}
}  // namespace gpu
}  // namespace elmo_fast
#define ELMO_GPU_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
#define ELMO_CHECK_GPU(x) ELMO_CHECK_CUDA(x)
#define ELMO_GPU_LIBRARY elmo_fast
#define ELMO_GPU_DISPATCH_KEY CUDA

#endif
