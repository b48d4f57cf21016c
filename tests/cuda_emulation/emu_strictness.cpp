// Test-only op library `elmo_fast_emu_test`: tiny kernels and bindings, each with a deliberate bug that
// a CPU runs without complaint and a GPU would not (broken=True) and its correct twin (broken=False),
// so that tests/bilm/test_cuda_emulator.py shows the emulator catching every bug class it claims to catch
// (emulator.h, csrc/cuda/backend.h). Also the switch of the emulated CUDA graph capture.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "checks.h"
#include "emulator.h"

#include "cuda/backend.h"
#include "cuda/device_utils.cuh"
#include "cuda/plan_upload.h"

namespace elmo_fast {
namespace gpu {
namespace {

constexpr int kBlock = 64;

// Shared memory read before anything wrote it: thread t writes s[t] only for t < written.
__global__ void shared_read_kernel(float* out, int written) {
  ELMO_SHARED(float, s, kBlock);
  const int t = static_cast<int>(threadIdx.x);
  if (t < written) {
    s[t] = static_cast<float>(t);
  }
  __syncthreads();
  out[blockIdx.x * kBlock + t] = s[t];
}

// A neighbour's shared value read with or without the barrier between its write and the read.
__global__ void neighbour_kernel(float* out, bool barrier) {
  ELMO_SHARED(float, s, kBlock);
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t + 1);
  if (barrier) {
    __syncthreads();
  }
  out[blockIdx.x * kBlock + t] = s[(t + 1) % kBlock];
}

// A barrier only the first half of the threads reaches (broken), or all of them.
__global__ void divergent_sync_kernel(float* out, bool broken) {
  const int t = static_cast<int>(threadIdx.x);
  if (!broken || t < kBlock / 2) {
    __syncthreads();
  }
  out[t] = 1.0f;
}

// Writes out[0, written).
__global__ void fill_kernel(float* out, int64_t written) {
  for (int64_t i = threadIdx.x; i < written; i += kBlock) {
    out[i] = 1.0f;
  }
}

// out[i] = in[i] + 1.
__global__ void add_one_kernel(const float* in, float* out, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += kBlock) {
    out[i] = in[i] + 1.0f;
  }
}

// a * b + c: one rounding when the compiler contracts it (nvcc does by default), two otherwise.
__global__ void multiply_add_kernel(const float* a, const float* b, const float* c, float* out) {
  out[0] = a[0] * b[0] + c[0];
}

at::Tensor shared_read(bool broken) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  at::Tensor out = at::zeros({2 * kBlock});
  ELMO_KERNEL_LAUNCH(shared_read_kernel, 2, kBlock, current_stream(), out.mutable_data_ptr<float>(),
                     broken ? kBlock / 2 : kBlock);
  return out;
}

at::Tensor neighbour_read(bool broken) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  at::Tensor out = at::zeros({2 * kBlock});
  ELMO_KERNEL_LAUNCH(neighbour_kernel, 2, kBlock, current_stream(), out.mutable_data_ptr<float>(), !broken);
  return out;
}

at::Tensor divergent_sync(bool broken) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  at::Tensor out = at::zeros({kBlock});
  ELMO_KERNEL_LAUNCH(divergent_sync_kernel, 1, kBlock, current_stream(), out.mutable_data_ptr<float>(), broken);
  return out;
}

// A fresh output the kernel does not write whole (broken: its last element).
at::Tensor fresh_output(bool broken) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  at::Tensor out = at::empty({100});
  ELMO_KERNEL_LAUNCH(fill_kernel, 1, kBlock, current_stream(), out.mutable_data_ptr<float>(), broken ? 99 : 100);
  return out;
}

// Values staged on the host and copied to the device; broken: the kernel is handed the host buffer.
at::Tensor host_buffer_in_kernel(const at::Tensor& values, bool broken) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  at::Tensor host = at::empty({values.numel()}, host_staging(at::kFloat));
  host.copy_(values.reshape({-1}));
  const at::Tensor dev = to_device_async(host, c10::Device(c10::kCPU));
  at::Tensor out = at::empty({values.numel()});
  ELMO_KERNEL_LAUNCH(add_one_kernel, 1, kBlock, current_stream(),
                     broken ? host.const_data_ptr<float>() : dev.const_data_ptr<float>(), out.mutable_data_ptr<float>(),
                     values.numel());
  return out;
}

// The device guard made before the argument's device check (broken) or after it.
at::Tensor guard_order(const at::Tensor& x, bool broken) {
  static constexpr char kOp[] = "guard_order";
  if (broken) {
    const DeviceGuard guard(x.device());
    ELMO_CHECK_GPU(x);
    return x.clone();
  }
  ELMO_CHECK_GPU(x);
  const DeviceGuard guard(x.device());
  return x.clone();
}

// int64 values uploaded as the LSTM bindings upload their plans (plan_upload.h), or (broken) always
// through host staging, which a CUDA graph capture does not permit.
at::Tensor upload_plan(const at::Tensor& values, bool broken) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  const at::Tensor v = values.contiguous();
  const std::vector<int64_t> host(v.const_data_ptr<int64_t>(), v.const_data_ptr<int64_t>() + v.numel());
  if (broken) {
    at::Tensor staged = at::empty({v.numel()}, host_staging(at::kLong));
    staged.copy_(v);
    return to_device_async(staged, c10::Device(c10::kCPU));
  }
  return plan_to_device(host, c10::Device(c10::kCPU));
}

at::Tensor multiply_add(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  const DeviceGuard guard(c10::Device(c10::kCPU));
  at::Tensor out = at::empty({1});
  ELMO_KERNEL_LAUNCH(multiply_add_kernel, 1, 1, current_stream(), a.const_data_ptr<float>(), b.const_data_ptr<float>(),
                     c.const_data_ptr<float>(), out.mutable_data_ptr<float>());
  return out;
}

void set_capturing(bool capturing) { emulated_capture() = capturing; }

}  // namespace
}  // namespace gpu
}  // namespace elmo_fast

TORCH_LIBRARY(elmo_fast_emu_test, m) {
  m.def("shared_read(bool broken) -> Tensor", &elmo_fast::gpu::shared_read);
  m.def("neighbour_read(bool broken) -> Tensor", &elmo_fast::gpu::neighbour_read);
  m.def("divergent_sync(bool broken) -> Tensor", &elmo_fast::gpu::divergent_sync);
  m.def("fresh_output(bool broken) -> Tensor", &elmo_fast::gpu::fresh_output);
  m.def("host_buffer_in_kernel(Tensor values, bool broken) -> Tensor", &elmo_fast::gpu::host_buffer_in_kernel);
  m.def("guard_order(Tensor x, bool broken) -> Tensor", &elmo_fast::gpu::guard_order);
  m.def("upload_plan(Tensor values, bool broken) -> Tensor", &elmo_fast::gpu::upload_plan);
  m.def("multiply_add(Tensor a, Tensor b, Tensor c) -> Tensor", &elmo_fast::gpu::multiply_add);
  m.def("set_capturing(bool capturing) -> ()", &elmo_fast::gpu::set_capturing);
}
