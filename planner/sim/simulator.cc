#include "planner/sim/simulator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::planner {
namespace {

constexpr double kUnknown = -1;

}  // namespace

double SimulationResult::MaxPeakBytes() const {
  return peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

double SimulationResult::MeanBubbleFraction() const {
  if (bubble_fraction.empty()) return 0;
  double sum = 0;
  for (double b : bubble_fraction) sum += b;
  return sum / bubble_fraction.size();
}

std::string CheckScheduleCoverage(const PipelineShape& shape, const DeviceOrder& order) {
  if (order.size() != shape.devices) {
    return absl::StrCat("schedule has ", order.size(), " devices, the pipeline ", shape.devices);
  }
  const size_t n = static_cast<size_t>(shape.stages()) * shape.micro_batches;
  std::vector<int> forwards(n, 0);
  std::vector<int> backwards(n, 0);
  for (uint32_t d = 0; d < order.size(); ++d) {
    for (const Op& op : order[d]) {
      if (op.stage >= shape.stages() || op.micro_batch >= shape.micro_batches) {
        return absl::StrCat("device ", d, " runs ", op.ToString(), ", outside the pipeline");
      }
      if (shape.DeviceOf(op.stage) != d) {
        return absl::StrCat("device ", d, " runs ", op.ToString(), " of stage ", op.stage,
                            ", which lives on device ", shape.DeviceOf(op.stage));
      }
      const size_t key = static_cast<size_t>(op.stage) * shape.micro_batches + op.micro_batch;
      if (++(op.kind == OpKind::kForward ? forwards : backwards)[key] > 1) {
        return absl::StrCat(op.ToString(), " runs more than once");
      }
    }
  }
  for (size_t key = 0; key < n; ++key) {
    if (forwards[key] == 0 || backwards[key] == 0) {
      const Op missing{forwards[key] == 0 ? OpKind::kForward : OpKind::kBackward,
                       static_cast<uint32_t>(key / shape.micro_batches),
                       static_cast<uint32_t>(key % shape.micro_batches)};
      return absl::StrCat(missing.ToString(), " never runs");
    }
  }
  return "";
}

SimulationResult Simulate(const PipelineShape& shape, const DeviceOrder& order,
                          const StageCostTable& costs, const ClusterNetwork& network) {
  const uint32_t devices = shape.devices;
  const uint32_t stages = shape.stages();
  const uint32_t m = shape.micro_batches;
  const auto key = [m](uint32_t stage, uint32_t mb) { return static_cast<size_t>(stage) * m + mb; };
  // When the input of F(s, mb) / the gradient of B(s, mb) is on its device.
  std::vector<double> forward_ready(static_cast<size_t>(stages) * m, kUnknown);
  std::vector<double> backward_ready(static_cast<size_t>(stages) * m, kUnknown);
  std::vector<double> forward_end(static_cast<size_t>(stages) * m, kUnknown);
  for (uint32_t mb = 0; mb < m; ++mb) forward_ready[key(0, mb)] = 0;

  SimulationResult r;
  r.busy_ms.assign(devices, 0);
  r.peak_bytes.assign(devices, 0);
  r.peak_in_flight.assign(devices, 0);
  std::vector<size_t> next(devices, 0);
  std::vector<double> device_free(devices, 0);
  std::vector<double> memory(devices, 0);
  std::vector<uint32_t> in_flight(devices, 0);
  // channel_free[from * devices + to]
  std::vector<double> channel_free(static_cast<size_t>(devices) * devices, 0);

  size_t remaining = 0;
  for (const auto& ops : order) remaining += ops.size();
  r.ops.reserve(remaining);

  const auto send = [&](const Op& producer, uint32_t from, uint32_t to, double bytes,
                        double produced_at) {
    if (from == to) return produced_at;
    double& free_at = channel_free[static_cast<size_t>(from) * devices + to];
    const double start = std::max(free_at, produced_at);
    const double end = start + network.Between(from, to).TransferMs(bytes);
    free_at = end;
    r.transfers.push_back({producer, from, to, bytes, start, end});
    return end;
  };

  while (remaining > 0) {
    int best = -1;
    double best_start = std::numeric_limits<double>::infinity();
    for (uint32_t d = 0; d < devices; ++d) {
      if (next[d] >= order[d].size()) continue;
      const Op& op = order[d][next[d]];
      double ready;
      if (op.kind == OpKind::kForward) {
        ready = forward_ready[key(op.stage, op.micro_batch)];
      } else {
        const double own = forward_end[key(op.stage, op.micro_batch)];
        const double grad = backward_ready[key(op.stage, op.micro_batch)];
        ready = own == kUnknown || grad == kUnknown ? kUnknown : std::max(own, grad);
      }
      if (ready == kUnknown) continue;
      const double start = std::max(ready, device_free[d]);
      if (start < best_start) {
        best_start = start;
        best = static_cast<int>(d);
      }
    }
    if (best < 0) {
      std::vector<std::string> stuck;
      for (uint32_t d = 0; d < devices; ++d) {
        if (next[d] < order[d].size()) {
          const Op& op = order[d][next[d]];
          const bool fwd = op.kind == OpKind::kForward;
          const std::string needs =
              fwd ? absl::StrCat("the activation of ", op.stage - 1, "F", op.micro_batch)
              : forward_end[key(op.stage, op.micro_batch)] == kUnknown
                  ? absl::StrCat("its own forward ", op.stage, "F", op.micro_batch)
                  : absl::StrCat("the gradient of ", op.stage + 1, "B", op.micro_batch);
          stuck.push_back(absl::StrCat("device ", d, " waits at ", op.ToString(), " (op ", next[d],
                                       ") for ", needs));
        }
      }
      r.deadlock = absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; "));
      return r;
    }
    const uint32_t d = static_cast<uint32_t>(best);
    const Op op = order[d][next[d]++];
    --remaining;
    const StageOpCost& c = costs[op.stage][op.micro_batch];
    const bool forward = op.kind == OpKind::kForward;
    const double end = best_start + (forward ? c.forward_ms : c.backward_ms);
    device_free[d] = end;
    r.busy_ms[d] += end - best_start;
    r.ops.push_back({op, d, best_start, end});
    r.makespan_ms = std::max(r.makespan_ms, end);
    // Memory: stored from forward start to backward end, plus the running
    // op's transient.
    const double transient = c.peak_bytes - c.stored_bytes;
    if (forward) {
      memory[d] += c.stored_bytes;
      r.peak_in_flight[d] = std::max(r.peak_in_flight[d], ++in_flight[d]);
    }
    r.peak_bytes[d] = std::max(r.peak_bytes[d], memory[d] + transient);
    if (forward) {
      forward_end[key(op.stage, op.micro_batch)] = end;
      if (op.stage + 1 < stages) {
        forward_ready[key(op.stage + 1, op.micro_batch)] =
            send(op, d, shape.DeviceOf(op.stage + 1), c.activation_bytes, end);
      } else {
        backward_ready[key(op.stage, op.micro_batch)] = end;  // the loss
      }
    } else {
      memory[d] -= c.stored_bytes;
      --in_flight[d];
      if (op.stage > 0) {
        backward_ready[key(op.stage - 1, op.micro_batch)] =
            send(op, d, shape.DeviceOf(op.stage - 1), c.gradient_bytes, end);
      }
    }
  }
  r.completed = true;
  r.bubble_fraction.resize(devices);
  for (uint32_t d = 0; d < devices; ++d) {
    r.bubble_fraction[d] = r.makespan_ms > 0 ? 1 - r.busy_ms[d] / r.makespan_ms : 0;
  }
  return r;
}

}  // namespace varipipe::planner
