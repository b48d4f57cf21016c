// The char_cnn kernels and launchers, compiled for the CPU emulator (see emulator.h).
#include "emulator.h"

#include "cuda/char_cnn_kernels.cuh"
