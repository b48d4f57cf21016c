// The host-side schedule of the CUDA LSTM ops (bilstm: lstm_cuda.cpp; lstm_layer_forward / _backward:
// lstm_layer_cuda.cpp), made from the lengths on the host. Rows are sorted by length, longest first
// (stable), so that the rows still running at step s are a prefix i < n_s, the same prefix for both
// directions; "packed" positions list (step, sorted row) pairs step-major: step s owns the n_s
// packed rows from offset_s. The forward direction is at t = s, the backward one at t = length - 1 - s
// (each row's own reversed time). Plain C++: no torch, no CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace elmo_fast {
namespace gpu {

struct LstmPlan {
  std::vector<int64_t> order;    // [B] sorted row i -> batch row b (lengths descending, stable)
  std::vector<int64_t> rank;     // [B] batch row b -> sorted row i
  std::vector<int64_t> length;   // [B] length of sorted row i
  std::vector<int64_t> running;  // [S] n_s, rows still running at step s (a prefix of the sorted rows)
  std::vector<int64_t> offset;   // [S + 1] first packed position of step s; offset[S] = total

  int64_t steps() const { return static_cast<int64_t>(running.size()); }
  int64_t total() const { return offset.back(); }
  // The time position of (sorted row i, step s) in direction d.
  int64_t position(int64_t d, int64_t i, int64_t s) const { return d == 0 ? s : length[i] - 1 - s; }
};

// lengths: [batch] values in [0, T] (the caller checked them).
inline LstmPlan make_lstm_plan(const int64_t* lengths, int64_t batch) {
  LstmPlan plan;
  plan.order.resize(batch);
  std::iota(plan.order.begin(), plan.order.end(), int64_t{0});
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
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

}  // namespace gpu
}  // namespace elmo_fast
