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

namespace {

// The cycles of Algorithm 1 (adaptive.h) over one device order.
class Cycles {
 public:
  Cycles(const PipelineShape& shape, const StageCostTable& costs,
         std::span<const uint32_t> injection_order, std::span<const double> limits)
      : shape_(shape),
        costs_(costs),
        limits_(limits),
        c_(shape.devices),
        forward_ready_(c_),
        backward_ready_(c_),
        forward_head_(c_, 0),
        backward_head_(c_, 0),
        memory_(c_, 0),
        held_transients_(c_),
        order_(c_),
        new_forward_(c_),
        new_backward_(c_) {
    for (uint32_t j = 0; j < c_; ++j) {
      forward_ready_[j].reserve(shape.micro_batches);
      backward_ready_[j].reserve(shape.micro_batches);
      order_[j].reserve(2 * static_cast<size_t>(shape.micro_batches));
    }
    forward_ready_[0].assign(injection_order.begin(), injection_order.end());
  }

  absl::StatusOr<DeviceOrder> Run() {
    for (size_t remaining = 2 * static_cast<size_t>(c_) * shape_.micro_batches; remaining > 0;) {
      size_t progress = 0;
      for (uint32_t j = 0; j < c_; ++j) {
        progress += Backward(j) ? 1 : 0;
        progress += Forward(j) ? 1 : 0;
      }
      Deliver();
      if (progress == 0) {
        // Cannot happen (a device holding nothing accepts a forward and the
        // last device turns forwards into backwards); guard against a bug.
        return absl::InternalError("adaptive schedule made no progress");
      }
      remaining -= progress;
    }
    return std::move(order_);
  }

 private:
  double Transient(uint32_t j, uint32_t mb) const {
    return costs_[j][mb].peak_bytes - costs_[j][mb].stored_bytes;
  }
  // What a forward leaves on its device until its backward: its stored
  // activation and the output it sends on (stage_costs.h).
  double Kept(uint32_t j, uint32_t mb) const {
    return costs_[j][mb].stored_bytes + SentOutputBytes(shape_, costs_, j, mb);
  }

  // Device j's first ready backward, if any.
  bool Backward(uint32_t j) {
    if (backward_head_[j] == backward_ready_[j].size()) return false;
    const uint32_t mb = backward_ready_[j][backward_head_[j]++];
    // The input gradient it sends stays until the end of the iteration.
    memory_[j] += SentGradientBytes(shape_, costs_, j, mb) - Kept(j, mb);
    std::vector<double>& held = held_transients_[j];
    held.erase(std::lower_bound(held.begin(), held.end(), Transient(j, mb)));
    order_[j].push_back({OpKind::kBackward, j, mb});
    if (j > 0) new_backward_[j - 1].push_back(mb);
    return true;
  }

  // Device j's first ready forward, if it is admitted (the memory check).
  bool Forward(uint32_t j) {
    if (forward_head_[j] == forward_ready_[j].size()) return false;
    const uint32_t mb = forward_ready_[j][forward_head_[j]];
    std::vector<double>& held = held_transients_[j];
    const double t = Transient(j, mb);
    const double reserve = held.empty() ? t : std::max(t, held.back());
    if (!held.empty() && memory_[j] + Kept(j, mb) + reserve > limits_[j]) return false;
    ++forward_head_[j];
    memory_[j] += Kept(j, mb);
    held.insert(std::upper_bound(held.begin(), held.end(), t), t);
    order_[j].push_back({OpKind::kForward, j, mb});
    (j + 1 < c_ ? new_forward_[j + 1] : new_backward_[j]).push_back(mb);
    return true;
  }

  // What a cycle made ready arrives for the next one.
  void Deliver() {
    for (uint32_t j = 0; j < c_; ++j) {
      forward_ready_[j].insert(forward_ready_[j].end(), new_forward_[j].begin(),
                               new_forward_[j].end());
      backward_ready_[j].insert(backward_ready_[j].end(), new_backward_[j].begin(),
                                new_backward_[j].end());
      new_forward_[j].clear();
      new_backward_[j].clear();
    }
  }

  const PipelineShape& shape_;
  const StageCostTable& costs_;
  std::span<const double> limits_;
  const uint32_t c_;
  // Per device, the micro-batches whose forward (backward) may run, in
  // arrival order; each queue receives every micro-batch once, so a queue is
  // a vector read from its head.
  std::vector<std::vector<uint32_t>> forward_ready_;
  std::vector<std::vector<uint32_t>> backward_ready_;
  std::vector<size_t> forward_head_;
  std::vector<size_t> backward_head_;
  std::vector<double> memory_;
  // Transients (peak - stored) of the micro-batches each device holds,
  // sorted. Until the next admission a device only runs backwards of these,
  // on at most what it holds now, so this is the headroom a forward must
  // leave.
  std::vector<std::vector<double>> held_transients_;
  DeviceOrder order_;
  std::vector<std::vector<uint32_t>> new_forward_;
  std::vector<std::vector<uint32_t>> new_backward_;
};

}  // namespace

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
  return Cycles(shape, costs, injection_order, memory_limit_bytes).Run();
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
