// The trainable LSTM layer's kernels and launchers, compiled for the CPU emulator (see emulator.h).
#include "emulator.h"

#include "cuda/lstm_layer_kernels.cuh"
