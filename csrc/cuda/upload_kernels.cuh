// The upload kernel (upload.h): one block copies its launch's parameter values to device memory.
//
// Included once, by upload.cu (nvcc) or by the CPU emulator of the tests (tests/cuda_emulation, g++),
// which runs this very kernel and launcher on CPU tensors where no GPU is available.
#pragma once

#include <cstring>

#include "cuda/device_utils.cuh"
#include "cuda/upload.h"

namespace elmo_fast {
namespace gpu {
namespace {

constexpr int kUploadThreads = 128;

// grid: one block; thread x writes values x, x + kUploadThreads, ...
__global__ void __launch_bounds__(kUploadThreads) upload_kernel(const __grid_constant__ UploadParams p) {
  for (int64_t i = threadIdx.x; i < p.count; i += kUploadThreads) {
    p.dst[i] = p.values[i];
  }
}

}  // namespace

void upload_launch(int64_t* dst, const int64_t* host, int64_t count, cudaStream_t stream) {
  for (int64_t first = 0; first < count; first += kUploadValues) {
    UploadParams params;
    params.dst = dst + first;
    params.count = count - first < kUploadValues ? count - first : kUploadValues;
    std::memcpy(params.values, host + first, static_cast<size_t>(params.count) * sizeof(int64_t));
    ELMO_KERNEL_LAUNCH(upload_kernel, 1, kUploadThreads, stream, params);
  }
}

}  // namespace gpu
}  // namespace elmo_fast
