// The char_cnn kernels as a CUDA translation unit. They live in char_cnn_kernels.cuh so that the
// tests' CPU emulator (tests/cuda_emulation) compiles the same code; see that file.
#include "cuda/char_cnn_kernels.cuh"
