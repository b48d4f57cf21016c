// The lstm kernels and launchers, compiled for the CPU emulator (see emulator.h).
#include "emulator.h"

#include "cuda/lstm_kernels.cuh"
