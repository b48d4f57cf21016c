// The host-side plan of the LSTM ops (bilstm, lstm_layer_forward, lstm_layer_backward), one for both
// backends: the CPU kernels (csrc/cpu/lstm_cpu.cpp, lstm_layer_cpu.cpp) walk it step by step, the CUDA
// bindings (csrc/cuda/lstm_cuda.cpp, lstm_layer_cuda.cpp) size their launches from it and copy the
// per-position arrays they build with it to the device.
//
// Rows are sorted by length, longest first (stable), so that the rows still running at step s are a
// prefix i < n_s, the same prefix for both directions: direction 0 (forward) is at position t = s,
// direction 1 (backward) at t = length - 1 - s, each row's own reversed time. "Packed" positions list
// the (step, sorted row) pairs step-major, as a PackedSequence: step s owns the n_s packed rows from
// offset_s, so nothing is computed or stored for padding. Plain C++: no torch, no CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace elmo_fast {

struct LstmPlan {
  int64_t batch = 0;             // B
  int64_t time = 0;              // T, positions per row in the op's inputs and outputs
  std::vector<int64_t> order;    // [B] sorted row i -> batch row b (lengths descending, stable)
  std::vector<int64_t> rank;     // [B] batch row b -> sorted row i
  std::vector<int64_t> length;   // [B] length of sorted row i (descending)
  std::vector<int64_t> running;  // [S] n_s, rows still running at step s (S = the longest length)
  std::vector<int64_t> offset;   // [S + 1] first packed position of step s; offset[S] = sum of lengths

  int64_t steps() const { return static_cast<int64_t>(running.size()); }
  int64_t total() const { return offset.back(); }
  // Rows running at the first step: the most any step has (0 for no steps).
  int64_t first_running() const { return running.empty() ? 0 : running.front(); }
  // The position t of (sorted row i, step s) in direction d.
  int64_t position(int64_t d, int64_t i, int64_t s) const { return d == 0 ? s : length[i] - 1 - s; }

  // fn(r, i, b, t) for every packed position r in [0, total()) of direction d, in order: sorted row
  // i, batch row b = order[i], position t = position(d, i, s).
  template <typename Fn>
  void for_each_position(int64_t d, Fn&& fn) const {
    for (int64_t s = 0; s < steps(); ++s) {
      for (int64_t i = 0; i < running[s]; ++i) {
        fn(offset[s] + i, i, order[i], position(d, i, s));
      }
    }
  }

  // [total()] value(b, t) of every packed position of direction d, e.g. its element offset in a
  // [2, B, T, .] tensor or the row of the input gates it reads.
  template <typename Fn>
  std::vector<int64_t> per_position(int64_t d, Fn&& value) const {
    std::vector<int64_t> out(static_cast<size_t>(total()));
    for_each_position(d, [&](int64_t r, int64_t, int64_t b, int64_t t) { out[r] = value(b, t); });
    return out;
  }
};

// lengths: [batch] values in [0, time] (the caller checked them).
inline LstmPlan make_lstm_plan(const int64_t* lengths, int64_t batch, int64_t time) {
  LstmPlan plan;
  plan.batch = batch;
  plan.time = time;
  plan.order.resize(batch);
  std::iota(plan.order.begin(), plan.order.end(), int64_t{0});
  std::stable_sort(plan.order.begin(), plan.order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  plan.rank.resize(batch);
  plan.length.resize(batch);
  for (int64_t i = 0; i < batch; ++i) {
    plan.rank[plan.order[i]] = i;
    plan.length[i] = lengths[plan.order[i]];
  }
  const int64_t steps = batch == 0 ? 0 : plan.length[0];
  plan.running.resize(steps);
  plan.offset.assign(steps + 1, 0);
  int64_t n = batch;
  for (int64_t s = 0; s < steps; ++s) {
    while (n > 0 && plan.length[n - 1] <= s) {
      --n;
    }
    plan.running[s] = n;
    plan.offset[s + 1] = plan.offset[s] + n;
  }
  return plan;
}

}  // namespace elmo_fast
