// The highway kernels and launchers, compiled for the CPU emulator (see emulator.h).
#include "emulator.h"

#include "cuda/highway_kernels.cuh"
