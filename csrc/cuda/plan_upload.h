// A host-made plan (int64 arrays: lstm_plan.h's order, rows and offsets) on the device, without waiting
// for the device, for the LSTM bindings:
//   * normally: staged in pinned memory and copied asynchronously (from pageable memory c10 would
//     copy synchronously); the caching host allocator keeps the block until the copy has read it;
//   * while the current stream captures a CUDA graph (ElmoBiLm(cuda_graphs=N) captures the bilstm op):
//     written by kernels that carry the values in their parameters (upload.h), since cudaHostAlloc is
//     not permitted during a capture and the graph would read a pinned block again at every replay,
//     long after the op returned it to the allocator.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "checks.h"
#include "cuda/backend.h"
#include "cuda/upload.h"

namespace elmo_fast {
namespace gpu {

// [host.size()] int64 on `device` (the current device, under the caller's guard), queued on the current
// stream.
inline at::Tensor plan_to_device(const std::vector<int64_t>& host, c10::Device device) {
  const int64_t n = static_cast<int64_t>(host.size());
  if (!stream_is_capturing()) {
    at::Tensor staged = at::empty({n}, host_staging(at::kLong));
    std::memcpy(staged.mutable_data_ptr<int64_t>(), host.data(), host.size() * sizeof(int64_t));
    return to_device_async(staged, device);
  }
  at::Tensor dev = at::empty({n}, at::TensorOptions().dtype(at::kLong).device(device));
  upload_launch(dev.mutable_data_ptr<int64_t>(), host.data(), n, current_stream());
  ELMO_GPU_LAUNCH_CHECK();
  return dev;
}

// Under capture the plan must come from host tensors: `name` on the device would need a device sync to
// read (not permitted while capturing); say so rather than fail inside CUDA.
inline void check_host_plan_under_capture(const char* kOp, const char* name, const at::Tensor& t) {
  ELMO_CHECK(t.device().is_cpu() || !stream_is_capturing(), name,
             " must be a CPU tensor while a CUDA graph is captured (reading it from the device would wait for "
             "the device), got ",
             t.device());
}

}  // namespace gpu
}  // namespace elmo_fast
