// Writing a few host values to device memory from inside kernel parameters: what a binding does with a
// host-made plan while a CUDA graph is being captured, where neither a pinned allocation (cudaHostAlloc
// is not permitted during a capture) nor a copy from pageable memory (a synchronization) may run. The
// values then live in the graph itself: a replay writes them again, nothing on the host has to outlive
// the capture (plan_upload.h picks this path).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace elmo_fast {
namespace gpu {

// Values per launch: 448 x 8 bytes plus the destination and count stay within the 4 KB of kernel
// parameters every CUDA architecture accepts.
constexpr int kUploadValues = 448;

struct UploadParams {
  int64_t* dst;                   // device memory, `count` values written
  int64_t count;                  // 1..kUploadValues
  int64_t values[kUploadValues];  // the values, in the launch's parameters
};

// dst[0, count) = host[0, count), as ceil(count / kUploadValues) launches on `stream`; nothing for
// count 0. Each launch is checked by the caller's ELMO_GPU_LAUNCH_CHECK after the last.
void upload_launch(int64_t* dst, const int64_t* host, int64_t count, cudaStream_t stream);

}  // namespace gpu
}  // namespace elmo_fast
