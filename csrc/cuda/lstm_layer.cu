// The trainable LSTM layer's kernels as a CUDA translation unit. They live in lstm_layer_kernels.cuh so
// that the tests' CPU emulator (tests/cuda_emulation) compiles the same code; see that file.
#include "cuda/lstm_layer_kernels.cuh"
