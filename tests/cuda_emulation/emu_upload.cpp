// The upload kernel and launcher, compiled for the CPU emulator (see emulator.h).
#include "emulator.h"

#include "cuda/upload_kernels.cuh"
