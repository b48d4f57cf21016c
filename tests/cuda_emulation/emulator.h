// A CPU emulator for the project's CUDA kernels, for machines without a GPU: each *_kernels.cuh is
// compiled by g++ after this header, and every launch runs the kernel once per CUDA thread, one
// host thread per thread of a block (so __syncthreads() is a real barrier and __shared__ arrays are
// shared by the block), blocks one after another. It checks what a GPU would refuse or get wrong:
//   * launch configurations CUDA rejects (a zero or too large grid, more than 1024 threads);
//   * __syncthreads() reached a different number of times by the threads of one block.
// Not emulated: warps, memory ordering between blocks, streams (kernels run at once, in order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace emu {

struct ThreadState {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
  std::barrier<>* barrier = nullptr;
  long syncs = 0;
};
inline thread_local ThreadState tls;

inline void sync_threads() {
  ++tls.syncs;
  tls.barrier->arrive_and_wait();
}

inline std::atomic<long> launches{0};

template <typename Body>
void launch(const char* name, dim3 grid, dim3 block, Body body) {
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error(std::string("emulated launch of ") + name + ": " + why + " (grid " +
                             std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
                             ", block " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" +
                             std::to_string(block.z) + ")");
  };
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    fail("invalid grid (cudaErrorInvalidConfiguration)");
  }
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64) {
    fail("invalid block (cudaErrorInvalidConfiguration)");
  }
  ++launches;
  std::barrier<> barrier(threads);
  std::vector<long> syncs(threads, 0);
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tls.thread_idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      tls.block_dim = block;
      tls.grid_dim = grid;
      tls.barrier = &barrier;
      for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
          for (unsigned x = 0; x < grid.x; ++x) {
            tls.block_idx = {x, y, z};
            tls.syncs = 0;
            try {
              body();
            } catch (...) {
              const std::lock_guard<std::mutex> lock(error_mutex);
              if (!error) error = std::current_exception();
            }
            syncs[t] = tls.syncs;
            barrier.arrive_and_wait();  // the block is done: every thread's sync count is in
            if (t == 0) {
              for (unsigned u = 1; u < threads; ++u) {
                if (syncs[u] != syncs[0]) {
                  const std::lock_guard<std::mutex> lock(error_mutex);
                  if (!error) {
                    error = std::make_exception_ptr(std::runtime_error(
                        std::string("emulated launch of ") + name + ": threads of block (" + std::to_string(x) +
                        ", " + std::to_string(y) + ") reached __syncthreads() " + std::to_string(syncs[0]) +
                        " and " + std::to_string(syncs[u]) + " times"));
                  }
                  break;
                }
              }
            }
            barrier.arrive_and_wait();  // thread 0 has read the counts before the next block
          }
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace emu

// The CUDA built-ins, for the kernels only (defined after the CUDA headers declared theirs).
#define threadIdx (::emu::tls.thread_idx)
#define blockIdx (::emu::tls.block_idx)
#define blockDim (::emu::tls.block_dim)
#define gridDim (::emu::tls.grid_dim)
#define __syncthreads() ::emu::sync_threads()
#undef __shared__
#define __shared__ static  // one array per kernel instantiation, shared by the block's host threads
#define __launch_bounds__(...)
#define ELMO_KERNEL_LAUNCH(kernel, grid, block, stream, ...) \
  ::emu::launch(#kernel, dim3(grid), dim3(block), [&] { kernel(__VA_ARGS__); })
