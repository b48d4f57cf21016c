// What the CUDA bindings (csrc/cuda/*.cpp) take from CUDA itself: the device guard, the current
// stream, the launch check, the device check of inputs, graph capture, host staging, and where the
// kernels register (ELMO_GPU_REGISTER).
//
// Normal builds: c10::cuda::CUDAGuard, c10::cuda::getCurrentCUDAStream(),
// C10_CUDA_KERNEL_LAUNCH_CHECK(), CUDA tensors, TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m).
// -DELMO_FAST_EMULATE_CUDA (only tests/cuda_emulation): CPU stand-ins and the op library
// `elmo_fast_emu` on the CPU key, so the same bindings and kernels run on CPU tensors, against the
// references, on machines without a GPU. The stand-ins are strict where a GPU would fail and a CPU
// would not: see the emulation branch below.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

// Besides: host_staging(dtype), the options of host buffers whose contents (schedules made on the
// host) a binding copies to the device with to_device_async(host, device). Normal builds: pinned
// memory and a non_blocking copy, so that the host never waits for the device (from pageable
// memory c10 copies synchronously). stream_is_capturing(): whether the current stream is capturing
// a CUDA graph, during which no pinned memory may be allocated (plan_upload.h).

#ifdef ELMO_FAST_EMULATE_CUDA

#include <c10/util/Exception.h>

namespace elmo_fast {
namespace gpu {

// A CUDA graph capture, as the tests declare it (the emulator library's test op
// elmo_fast_emu_test::set_capturing): the bindings must then take the capture-safe paths, and host
// staging, which CUDA refuses during a capture, fails.
inline bool& emulated_capture() {
  static bool capturing = false;
  return capturing;
}
inline bool stream_is_capturing() { return emulated_capture(); }

// CUDAGuard rejects a device that is not a GPU; the emulated GPU is the CPU, so this one rejects any
// other device (the tests pass `meta` tensors as "not on the GPU"). While it lives, every fresh
// allocation (at::empty and friends, in the binding and in the ATen ops it runs) is filled with
// garbage, NaN or the integer maximum (deterministic mode's fill), as GPU memory is never zeroed: an
// element a kernel fails to write shows up.
class DeviceGuard {
 public:
  explicit DeviceGuard(c10::Device device)
      : was_deterministic_(at::globalContext().deterministicAlgorithms()),
        was_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()),
        was_filling_(at::globalContext().deterministicFillUninitializedMemory()) {
    TORCH_CHECK(device.is_cpu(), "emulated CUDAGuard: expected a device of the emulated GPU (cpu), got ", device);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/!was_deterministic_ || was_warn_only_);
    at::globalContext().setDeterministicFillUninitializedMemory(true);
  }
  ~DeviceGuard() {
    at::globalContext().setDeterministicFillUninitializedMemory(was_filling_);
    at::globalContext().setDeterministicAlgorithms(was_deterministic_, was_warn_only_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  bool was_deterministic_, was_warn_only_, was_filling_;
};

inline cudaStream_t current_stream() { return nullptr; }
inline at::TensorOptions host_staging(at::ScalarType dtype) {
  TORCH_CHECK(!stream_is_capturing(), "emulated CUDA: pinned host memory allocated while a CUDA graph is captured "
                                      "(cudaHostAlloc is not permitted during a capture)");
  return at::TensorOptions().dtype(dtype);
}
// The copy happens now (a clone: the "device" tensor never aliases the host buffer); then the host
// buffer is scribbled over (NaN, the integer maximum), as if the asynchronous copy had run and the
// buffer had gone back to the allocator: a kernel handed the host pointer instead of the device one,
// or host code reading the buffer after the copy as if it still held the plan, gets garbage.
inline at::Tensor to_device_async(const at::Tensor& host, c10::Device device) {
  TORCH_CHECK(device.is_cpu(), "emulated CUDA: a copy to ", device, ", not the emulated GPU (cpu)");
  at::Tensor dev = host.clone(at::MemoryFormat::Contiguous);
  if (at::isFloatingType(host.scalar_type())) {
    host.fill_(std::numeric_limits<double>::quiet_NaN());
  } else if (host.scalar_type() == at::kLong) {
    host.fill_(std::numeric_limits<int64_t>::max());
  } else if (host.scalar_type() == at::kInt) {
    host.fill_(std::numeric_limits<int32_t>::max());
  }
  return dev;
}
}  // namespace gpu
}  // namespace elmo_fast
#define ELMO_GPU_LAUNCH_CHECK() ((void)0)
// The emulated GPU's tensors are CPU tensors; the message is CUDA's.
#define ELMO_CHECK_GPU(x) \
  TORCH_CHECK((x).device().is_cpu(), kOp, ": ", #x " must be a CUDA tensor (emulated: cpu), got ", (x).device())
// ELMO_GPU_REGISTER(m) { m.impl(...); }: the bindings' registration, here on the CPU key of the
// emulator's library, and on the Meta key too, so that an input on `meta` (the tests' stand-in for "not
// on the GPU": the emulated GPU is the CPU) reaches the binding and its device checks, as a CPU tensor
// reaches a CUDA binding.
#define ELMO_GPU_REGISTER(m)                                                          \
  static void register_gpu_kernels(torch::Library& m);                                \
  TORCH_LIBRARY_IMPL(elmo_fast_emu, CPU, library) { register_gpu_kernels(library); }  \
  TORCH_LIBRARY_IMPL(elmo_fast_emu, Meta, library) { register_gpu_kernels(library); } \
  static void register_gpu_kernels(torch::Library& m)

#else

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace elmo_fast {
namespace gpu {
using DeviceGuard = c10::cuda::CUDAGuard;
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }
inline bool stream_is_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}
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
// ELMO_GPU_REGISTER(m) { m.impl(...); }: the bindings' registration on the CUDA key.
#define ELMO_GPU_REGISTER(m) TORCH_LIBRARY_IMPL(elmo_fast, CUDA, m)

#endif
