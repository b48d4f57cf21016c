// The highway kernels as a CUDA translation unit. They live in highway_kernels.cuh so that the
// tests' CPU emulator (tests/cuda_emulation) compiles the same code; see that file.
#include "cuda/highway_kernels.cuh"
