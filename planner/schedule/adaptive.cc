#include "planner/schedule/adaptive.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace varipipe::planner {

absl::StatusOr<DeviceOrder> AdaptiveSchedule(const PipelineShape& shape,
                                             const StageCostTable& costs,
                                             std::span<const uint32_t> injection_order,
                                             double memory_limit_bytes) {
  const std::vector<double> limits(shape.devices, memory_limit_bytes);
  return AdaptiveSchedule(shape, costs, injection_order, limits);
}

absl::StatusOr<DeviceOrder> AdaptiveSchedule(const PipelineShape& shape,
                                             const StageCostTable& costs,
                                             std::span<const uint32_t> injection_order,
                                             std::span<const double> memory_limit_bytes) {
  if (memory_limit_bytes.size() != shape.devices) {
    return absl::InvalidArgumentError("one memory limit per device is needed");
  }
  if (shape.chunks != 1) {
    return absl::InvalidArgumentError("the adaptive schedule needs one chunk per device");
  }
  if (injection_order.size() != shape.micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat("injection order has ", injection_order.size(),
                                                   " micro-batches, the pipeline ",
                                                   shape.micro_batches));
  }
  const uint32_t c = shape.devices;
  const uint32_t m = shape.micro_batches;
  // Per device, the micro-batches whose forward (backward) may run, in
  // arrival order; each queue receives every micro-batch once, so a queue is
  // a vector read from its head.
  std::vector<std::vector<uint32_t>> forward_ready(c);
  std::vector<std::vector<uint32_t>> backward_ready(c);
  std::vector<size_t> forward_head(c, 0);
  std::vector<size_t> backward_head(c, 0);
  for (uint32_t j = 0; j < c; ++j) {
    forward_ready[j].reserve(m);
    backward_ready[j].reserve(m);
  }
  forward_ready[0].assign(injection_order.begin(), injection_order.end());
  std::vector<double> memory(c, 0);
  // Transients (peak - stored) of the micro-batches each device holds,
  // sorted. Until the next admission a device only runs backwards of these,
  // on at most what it holds now, so this is the headroom a forward must
  // leave.
  std::vector<std::vector<double>> held_transients(c);
  const auto transient = [&](uint32_t j, uint32_t mb) {
    return costs[j][mb].peak_bytes - costs[j][mb].stored_bytes;
  };
  // What a forward leaves on its device until its backward: its stored
  // activation and the output it sends on (stage_costs.h).
  const auto kept = [&](uint32_t j, uint32_t mb) {
    return costs[j][mb].stored_bytes + SentOutputBytes(shape, costs, j, mb);
  };
  DeviceOrder order(c);
  for (uint32_t j = 0; j < c; ++j) order[j].reserve(2 * static_cast<size_t>(m));
  size_t remaining = 2 * static_cast<size_t>(c) * m;
  // What each round makes ready arrives for the next round.
  std::vector<std::vector<uint32_t>> new_forward(c);
  std::vector<std::vector<uint32_t>> new_backward(c);
  while (remaining > 0) {
    size_t progress = 0;
    for (uint32_t j = 0; j < c; ++j) {
      if (backward_head[j] < backward_ready[j].size()) {
        const uint32_t mb = backward_ready[j][backward_head[j]++];
        // The input gradient it sends stays until the end of the iteration.
        memory[j] += SentGradientBytes(shape, costs, j, mb) - kept(j, mb);
        std::vector<double>& held = held_transients[j];
        held.erase(std::lower_bound(held.begin(), held.end(), transient(j, mb)));
        order[j].push_back({OpKind::kBackward, j, mb});
        if (j > 0) new_backward[j - 1].push_back(mb);
        ++progress;
      }
      if (forward_head[j] < forward_ready[j].size()) {
        const uint32_t mb = forward_ready[j][forward_head[j]];
        std::vector<double>& held = held_transients[j];
        const double reserve =
            held.empty() ? transient(j, mb) : std::max(transient(j, mb), held.back());
        if (held.empty() || memory[j] + kept(j, mb) + reserve <= memory_limit_bytes[j]) {
          ++forward_head[j];
          memory[j] += kept(j, mb);
          const double t = transient(j, mb);
          held.insert(std::upper_bound(held.begin(), held.end(), t), t);
          order[j].push_back({OpKind::kForward, j, mb});
          (j + 1 < c ? new_forward[j + 1] : new_backward[j]).push_back(mb);
          ++progress;
        }
      }
    }
    for (uint32_t j = 0; j < c; ++j) {
      forward_ready[j].insert(forward_ready[j].end(), new_forward[j].begin(), new_forward[j].end());
      backward_ready[j].insert(backward_ready[j].end(), new_backward[j].begin(),
                               new_backward[j].end());
      new_forward[j].clear();
      new_backward[j].clear();
    }
    if (progress == 0) {
      // Cannot happen (a device holding nothing accepts a forward and the
      // last device turns forwards into backwards); guard against a bug.
      return absl::InternalError("adaptive schedule made no progress");
    }
    remaining -= progress;
  }
  return order;
}

std::vector<int> ClusterByValue(std::span<const double> values, int clusters) {
  const int n = static_cast<int>(values.size());
  std::vector<int> labels(n, 0);
  if (n == 0 || clusters <= 1) return labels;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const int k = std::min(clusters, n);
  std::vector<double> centre(k);
  for (int c = 0; c < k; ++c) centre[c] = sorted[(2 * c + 1) * n / (2 * k)];
  for (int round = 0; round < 100; ++round) {
    bool changed = false;
    for (int i = 0; i < n; ++i) {
      int best = 0;
      for (int c = 1; c < k; ++c) {
        if (std::abs(values[i] - centre[c]) < std::abs(values[i] - centre[best])) best = c;
      }
      changed |= labels[i] != best;
      labels[i] = best;
    }
    std::vector<double> sum(k, 0);
    std::vector<int> count(k, 0);
    for (int i = 0; i < n; ++i) {
      sum[labels[i]] += values[i];
      ++count[labels[i]];
    }
    for (int c = 0; c < k; ++c) {
      if (count[c] > 0) centre[c] = sum[c] / count[c];
    }
    if (!changed && round > 0) break;
  }
  // Relabel by increasing centre.
  std::vector<int> rank(k);
  std::iota(rank.begin(), rank.end(), 0);
  std::sort(rank.begin(), rank.end(), [&](int a, int b) { return centre[a] < centre[b]; });
  std::vector<int> relabel(k);
  for (int r = 0; r < k; ++r) relabel[rank[r]] = r;
  for (int& l : labels) l = relabel[l];
  return labels;
}

}  // namespace varipipe::planner
