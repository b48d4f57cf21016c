// The upload kernel as a CUDA translation unit. It lives in upload_kernels.cuh so that the tests' CPU
// emulator (tests/cuda_emulation) compiles the same code; see that file.
#include "cuda/upload_kernels.cuh"
