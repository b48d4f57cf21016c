// A CPU emulator for the project's CUDA kernels, for machines without a GPU: each *_kernels.cuh is
// compiled by g++ after this header, and every launch runs the kernel once per CUDA thread, block
// after block. It is strict where a GPU would fail and a CPU would not:
//   * launch configurations CUDA rejects (a zero or too large grid, more than 1024 threads) fail;
//   * __syncthreads() reached a different number of times by the threads of one block fails;
//   * shared memory (ELMO_SHARED) holds garbage at the start of every block (0xFF bytes: NaN in every
//     float format, -1 in integers), as a GPU leaves whatever an earlier block wrote there;
//   * the threads of a block run in a shuffled order (ELMO_FAST_EMULATION_SCHEDULE=shuffle, the
//     default): each on its own fiber, one at a time, from one __syncthreads() to the next, in a fresh
//     random order between any two barriers, and the blocks of a grid in a random order too (seeded
//     by ELMO_FAST_EMULATION_SEED, default 0, and the launch's number: reproducible). A read of shared
//     memory another thread writes without a __syncthreads() between them (a race, a missing
//     barrier) sees the garbage, or the other thread's next value, in most orders;
//   * ELMO_FAST_EMULATION_SCHEDULE=threads: one host thread per CUDA thread, all running at once,
//     __syncthreads() a real barrier: for ThreadSanitizer (build.py's ELMO_FAST_EMULATION_TSAN=1), which
//     reports accesses no barrier orders; the default under a sanitizer (fibers confuse them).
// The bindings' stand-ins for the rest of CUDA are csrc/cuda/backend.h's (device guard, fresh
// allocations, host-to-device copies, graph capture). The build (build.py) compiles with
// -ffp-contract=fast and FMA on, so that a*b + c is fused as nvcc fuses it by default.
// Not emulated: warps, memory ordering between blocks, streams (kernels run at once, in order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace emu {

struct Fiber;

struct ThreadState {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
  std::barrier<>* barrier = nullptr;  // "threads": the block's barrier
  Fiber* fiber = nullptr;             // "shuffle": the running CUDA thread's fiber
  long syncs = 0;                     // "threads": __syncthreads() reached in this block
  uint64_t block_serial = 0;          // the block being run (a process-wide count)
};
inline thread_local ThreadState tls;

inline std::atomic<long> launches{0};
inline std::atomic<uint64_t> blocks_started{0};

// --- the schedule ---------------------------------------------------------------------------------

enum class Schedule { kShuffle, kThreads };

inline Schedule schedule() {
  const char* env = std::getenv("ELMO_FAST_EMULATION_SCHEDULE");
  if (env != nullptr && std::string(env) == "threads") {
    return Schedule::kThreads;
  }
  if (env != nullptr && std::string(env) == "shuffle") {
    return Schedule::kShuffle;
  }
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return Schedule::kThreads;
#else
  return Schedule::kShuffle;
#endif
}

inline uint64_t seed_of_launch(long launch) {
  const char* env = std::getenv("ELMO_FAST_EMULATION_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : 0;
  return seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(launch);
}

// One CUDA thread of the "shuffle" schedule: a user-level context on a stack of its own.
struct Fiber {
  ucontext_t context;
  ucontext_t* scheduler = nullptr;
  uint3 thread_idx{0, 0, 0};
  long syncs = 0;
  bool done = false;
  std::exception_ptr error;
};

// Fiber stacks, kept for the process (lazily committed): 128 KB each below a guard page.
inline char* fiber_stack(unsigned t, size_t* size) {
  constexpr size_t kStack = size_t{128} << 10;
  static std::vector<char*> stacks;  // the emulator runs one launch at a time
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (stacks.size() <= t) {
    void* p = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      throw std::runtime_error("emulator: cannot map a fiber stack");
    }
    mprotect(p, page, PROT_NONE);  // an overflow faults instead of writing over another stack
    stacks.push_back(static_cast<char*>(p) + page);
  }
  *size = kStack;
  return stacks[t];
}

// The body of the kernel being launched, type-erased for the fibers' entry point.
struct FiberBody {
  void (*run)(void*) = nullptr;
  void* arg = nullptr;
};
inline thread_local FiberBody fiber_body;

inline void fiber_entry() {
  Fiber* f = tls.fiber;
  try {
    fiber_body.run(fiber_body.arg);
  } catch (...) {
    f->error = std::current_exception();
  }
  f->done = true;  // returning resumes uc_link, the scheduler
}

inline void sync_threads() {
  if (tls.fiber != nullptr) {
    Fiber* f = tls.fiber;
    ++f->syncs;
    swapcontext(&f->context, f->scheduler);  // the scheduler resumes the block's other threads first
  } else {
    ++tls.syncs;
    tls.barrier->arrive_and_wait();
  }
}

// --- shared memory --------------------------------------------------------------------------------

// ELMO_SHARED(type, name, count): a block's shared array, one per kernel instantiation (the blocks
// of a launch run one after another), filled with 0xFF bytes by the first of a block's threads to
// declare it.
inline void fill_shared(void* array, size_t bytes) {
  static std::mutex mutex;
  static std::unordered_map<void*, uint64_t> filled;  // array -> the block it was last filled for
  const std::lock_guard<std::mutex> lock(mutex);
  uint64_t& block = filled[array];
  if (block != tls.block_serial) {
    std::memset(array, 0xFF, bytes);
    block = tls.block_serial;
  }
}

// --- launches -------------------------------------------------------------------------------------

struct LaunchError {
  std::mutex mutex;
  std::exception_ptr first;
  void record(std::exception_ptr e) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!first) {
      first = e;
    }
  }
};

inline std::string block_name(const uint3& b) {
  return "(" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) + ")";
}

inline uint3 thread_index(unsigned t, dim3 block) {
  return {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
}

template <typename Body>
void run_shuffled(const char* name, dim3 grid, dim3 block, Body& body, uint64_t seed, LaunchError& error) {
  const unsigned threads = block.x * block.y * block.z;
  std::mt19937_64 rng(seed);
  std::vector<uint3> blocks;
  blocks.reserve(static_cast<size_t>(grid.x) * grid.y * grid.z);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blocks.push_back({x, y, z});
      }
    }
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<Fiber> fibers(threads);
  std::vector<unsigned> live, next;
  ucontext_t scheduler;
  const FiberBody saved_body = fiber_body;
  fiber_body = {[](void* b) { (*static_cast<Body*>(b))(); }, &body};
  tls.block_dim = block;
  tls.grid_dim = grid;
  for (const uint3& b : blocks) {
    tls.block_idx = b;
    tls.block_serial = ++blocks_started;
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = fibers[t];
      f = Fiber{};
      f.scheduler = &scheduler;
      f.thread_idx = thread_index(t, block);
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = fiber_stack(t, &f.context.uc_stack.ss_size);
      f.context.uc_link = &scheduler;
      makecontext(&f.context, fiber_entry, 0);
    }
    live.resize(threads);
    std::iota(live.begin(), live.end(), 0u);
    while (!live.empty()) {  // one phase: every live thread runs to its next barrier, in a new order
      std::shuffle(live.begin(), live.end(), rng);
      next.clear();
      for (const unsigned t : live) {
        tls.fiber = &fibers[t];
        tls.thread_idx = fibers[t].thread_idx;
        swapcontext(&scheduler, &fibers[t].context);
        if (!fibers[t].done) {
          next.push_back(t);
        }
      }
      live.swap(next);
    }
    tls.fiber = nullptr;
    for (unsigned t = 0; t < threads; ++t) {
      if (fibers[t].error) {
        error.record(fibers[t].error);
      }
    }
    for (unsigned t = 1; t < threads; ++t) {
      if (fibers[t].syncs != fibers[0].syncs) {
        error.record(std::make_exception_ptr(std::runtime_error(
            std::string("emulated launch of ") + name + ": threads of block " + block_name(b) +
            " reached __syncthreads() " + std::to_string(fibers[0].syncs) + " and " +
            std::to_string(fibers[t].syncs) + " times")));
      }
    }
    if (error.first) {
      break;
    }
  }
  fiber_body = saved_body;
}

template <typename Body>
void run_threads(const char* name, dim3 grid, dim3 block, Body& body, LaunchError& error) {
  const unsigned threads = block.x * block.y * block.z;
  std::barrier<> barrier(threads);
  std::vector<long> syncs(threads, 0);
  std::atomic<uint64_t> serial{++blocks_started};  // the block's number, renewed by thread 0 per block
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tls.thread_idx = thread_index(t, block);
      tls.block_dim = block;
      tls.grid_dim = grid;
      tls.barrier = &barrier;
      tls.fiber = nullptr;
      for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
          for (unsigned x = 0; x < grid.x; ++x) {
            tls.block_idx = {x, y, z};
            tls.block_serial = serial.load();
            tls.syncs = 0;
            try {
              body();
            } catch (...) {
              error.record(std::current_exception());
            }
            syncs[t] = tls.syncs;
            barrier.arrive_and_wait();  // the block is done: every thread's sync count is in
            if (t == 0) {
              for (unsigned u = 1; u < threads; ++u) {
                if (syncs[u] != syncs[0]) {
                  error.record(std::make_exception_ptr(std::runtime_error(
                      std::string("emulated launch of ") + name + ": threads of block " +
                      block_name(tls.block_idx) + " reached __syncthreads() " + std::to_string(syncs[0]) +
                      " and " + std::to_string(syncs[u]) + " times")));
                  break;
                }
              }
              serial.store(++blocks_started);
            }
            barrier.arrive_and_wait();  // thread 0 has read the counts before the next block
          }
        }
      }
      barrier.arrive_and_drop();  // threads that reached fewer barriers do not wait for this one
    });
  }
  for (auto& th : pool) {
    th.join();
  }
}

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
  const long number = launches++;
  LaunchError error;
  if (schedule() == Schedule::kShuffle) {
    run_shuffled(name, grid, block, body, seed_of_launch(number), error);
  } else {
    run_threads(name, grid, block, body, error);
  }
  if (error.first) {
    std::rethrow_exception(error.first);
  }
}

}  // namespace emu

// The CUDA built-ins, for the kernels only (defined after the CUDA headers declared theirs).
#define threadIdx (::emu::tls.thread_idx)
#define blockIdx (::emu::tls.block_idx)
#define blockDim (::emu::tls.block_dim)
#define gridDim (::emu::tls.grid_dim)
#define __syncthreads() ::emu::sync_threads()
// Kernels declare shared memory with ELMO_SHARED (device_utils.cuh), which the emulator fills with
// garbage per block; a bare __shared__ would escape that, so it does not compile here.
#undef __shared__
#define __shared__ ELMO_SHARED_is_required_for_shared_memory_under_the_emulator
#define ELMO_SHARED(type, name, count)   \
  alignas(16) static type name[count]; \
  ::emu::fill_shared(name, sizeof(name))
#define __launch_bounds__(...)
#define ELMO_KERNEL_LAUNCH_NAMED(name, kernel, grid, block, stream, ...) \
  ::emu::launch(name, dim3(grid), dim3(block), [&] { kernel(__VA_ARGS__); })
#define ELMO_KERNEL_LAUNCH(kernel, grid, block, stream, ...) \
  ELMO_KERNEL_LAUNCH_NAMED(#kernel, kernel, grid, block, stream, __VA_ARGS__)
