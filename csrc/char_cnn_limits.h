// The one limit on the character CNN's rows, shared by the CPU and CUDA ops (and, through
// elmo_fast._C.CHAR_CNN_MAX_CHARS, by the op's fake in elmo_fast/bilm/ops.py). Torch-free: the CUDA
// kernels' headers include it.
#pragma once

namespace elmo_fast {

// L, the character ids per token (a row of char_ids): 1 <= L <= kCharCnnMaxChars on every backend.
// allennlp's and bilm-tf's L is 50; ELMoForManyLangs' is its config's max_characters_per_token (50
// in its released models). The CUDA kernel stages a few tokens' ids in shared memory, 8 x 64 ints.
constexpr int kCharCnnMaxChars = 64;

}  // namespace elmo_fast
