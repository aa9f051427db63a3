#include "planner/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/sim/memory_ledger.h"

namespace varipipe::planner {
namespace {

constexpr double kUnknown = -1;
constexpr double kNever = std::numeric_limits<double>::infinity();

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
  std::vector<int> weights(n, 0);
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
      std::vector<int>& seen = op.kind == OpKind::kForward    ? forwards
                               : op.kind == OpKind::kBackward ? backwards
                                                              : weights;
      if (++seen[key] > 1) {
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

namespace {

// The wait-free replay of one order (see simulator.h): each step runs the
// op that can start earliest on any device.
class Replay {
 public:
  Replay(const PipelineShape& shape, const DeviceOrder& order, const StageCostTable& costs,
         const ClusterNetwork& network, double makespan_limit_ms)
      : shape_(shape),
        order_(order),
        costs_(costs),
        network_(network),
        give_up_above_ms_(makespan_limit_ms * (1 + kMakespanLimitMargin)),
        ledger_(shape.devices) {
    const uint32_t devices = shape.devices;
    const size_t keys = static_cast<size_t>(shape.stages()) * shape.micro_batches;
    forward_ready_.assign(keys, kUnknown);
    backward_ready_.assign(keys, kUnknown);
    forward_end_.assign(keys, kUnknown);
    backward_end_.assign(keys, kUnknown);
    split_.assign(keys, false);
    for (const auto& ops : order) {
      for (const Op& op : ops) {
        if (op.kind == OpKind::kWeight) split_[Key(op.stage, op.micro_batch)] = true;
      }
    }
    // Without a limit nothing is compared: the sums are skipped (and the
    // per-op decrements never matter).
    work_left_ms_.assign(devices, 0);
    for (uint32_t d = 0; d < devices && std::isfinite(give_up_above_ms_); ++d) {
      for (const Op& op : order[d]) work_left_ms_[d] += Duration(op);
      ledger_.Reserve(d, 4 * order[d].size());
    }
    for (uint32_t mb = 0; mb < shape.micro_batches; ++mb) forward_ready_[Key(0, mb)] = 0;
    r_.busy_ms.assign(devices, 0);
    r_.peak_bytes.assign(devices, 0);
    r_.peak_in_flight.assign(devices, 0);
    next_.assign(devices, 0);
    device_free_.assign(devices, 0);
    in_flight_.assign(devices, 0);
    channel_free_.assign(static_cast<size_t>(devices) * devices, 0);
    start_at_.assign(devices, kNever);
  }

  SimulationResult Run() {
    size_t remaining = 0;
    for (const auto& ops : order_) remaining += ops.size();
    r_.ops.reserve(remaining);
    r_.transfers.reserve(remaining);
    for (uint32_t d = 0; d < shape_.devices; ++d) Refresh(d);
    for (; remaining > 0; --remaining) {
      double start = 0;
      const int d = Earliest(&start);
      if (d < 0) {
        r_.deadlock = Deadlock();
        return std::move(r_);
      }
      const uint32_t receiver = Execute(static_cast<uint32_t>(d), start);
      // What d still has to run starts no earlier than its clock.
      if (device_free_[d] + work_left_ms_[d] > give_up_above_ms_) {
        SimulationResult exceeded;
        exceeded.exceeded = true;
        return exceeded;
      }
      Refresh(static_cast<uint32_t>(d));
      Refresh(receiver);
    }
    r_.completed = true;
    r_.peak_bytes = ledger_.Peaks();
    r_.bubble_fraction.resize(shape_.devices);
    for (uint32_t d = 0; d < shape_.devices; ++d) {
      r_.bubble_fraction[d] = r_.makespan_ms > 0 ? 1 - r_.busy_ms[d] / r_.makespan_ms : 0;
    }
    return std::move(r_);
  }

 private:
  size_t Key(uint32_t stage, uint32_t mb) const {
    return static_cast<size_t>(stage) * shape_.micro_batches + mb;
  }

  double Duration(const Op& op) const {
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    return op.kind == OpKind::kForward             ? c.forward_ms
           : op.kind == OpKind::kWeight            ? c.weight_ms
           : split_[Key(op.stage, op.micro_batch)] ? c.input_grad_ms()
                                                   : c.backward_ms;
  }

  // When the next op of device d has its inputs; kUnknown: not yet known.
  double Ready(uint32_t d) const {
    const Op& op = order_[d][next_[d]];
    if (op.kind == OpKind::kForward) return forward_ready_[Key(op.stage, op.micro_batch)];
    if (op.kind == OpKind::kWeight) return backward_end_[Key(op.stage, op.micro_batch)];
    const double own = forward_end_[Key(op.stage, op.micro_batch)];
    const double grad = backward_ready_[Key(op.stage, op.micro_batch)];
    return own == kUnknown || grad == kUnknown ? kUnknown : std::max(own, grad);
  }

  // Recomputes when device d's next op can start (kNever: it has none or
  // its inputs are not produced yet). It changes only when d runs an op or
  // receives an input, so the replay refreshes just those two devices.
  void Refresh(uint32_t d) {
    if (next_[d] >= order_[d].size()) {
      start_at_[d] = kNever;
      return;
    }
    const double ready = Ready(d);
    start_at_[d] = ready == kUnknown ? kNever : std::max(ready, device_free_[d]);
  }

  // The device whose next op starts earliest (ties: the lowest device); -1
  // when no next op can start.
  int Earliest(double* start) const {
    int best = -1;
    double best_start = kNever;
    for (uint32_t d = 0; d < shape_.devices; ++d) {
      if (start_at_[d] < best_start) {
        best_start = start_at_[d];
        best = static_cast<int>(d);
      }
    }
    *start = best_start;
    return best;
  }

  std::string Deadlock() const {
    std::vector<std::string> stuck;
    for (uint32_t d = 0; d < shape_.devices; ++d) {
      if (next_[d] >= order_[d].size()) continue;
      const Op& op = order_[d][next_[d]];
      const std::string needs =
          op.kind == OpKind::kForward
              ? absl::StrCat("the activation of ", op.stage - 1, "F", op.micro_batch)
          : op.kind == OpKind::kWeight
              ? absl::StrCat("its input gradient ", op.stage, "B", op.micro_batch)
          : forward_end_[Key(op.stage, op.micro_batch)] == kUnknown
              ? absl::StrCat("its own forward ", op.stage, "F", op.micro_batch)
              : absl::StrCat("the gradient of ", op.stage + 1, "B", op.micro_batch);
      stuck.push_back(absl::StrCat("device ", d, " waits at ", op.ToString(), " (op ", next_[d],
                                   ") for ", needs));
    }
    return absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; "));
  }

  // A transfer on the (from, to) channel once it is free; returns its end.
  double Send(const Op& producer, uint32_t from, uint32_t to, double bytes, double produced_at) {
    if (from == to) return produced_at;
    double& free_at = channel_free_[static_cast<size_t>(from) * shape_.devices + to];
    const double start = std::max(free_at, produced_at);
    const double end = start + network_.Between(from, to).TransferMs(bytes);
    free_at = end;
    r_.transfers.push_back({producer, from, to, bytes, start, end});
    return end;
  }

  // Runs device d's next op from `start`: time, memory (stored from forward
  // start to backward end, or with a W: all but the W-kept bytes to B's end
  // and those to W's end; plus the running op's transient), and what it
  // makes ready. Returns the device that receives its output (d itself when
  // none travels).
  uint32_t Execute(uint32_t d, double start) {
    const Op op = order_[d][next_[d]++];
    const size_t key = Key(op.stage, op.micro_batch);
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    const bool split = split_[key];
    const double ms = Duration(op);
    const double end = start + ms;
    device_free_[d] = end;
    work_left_ms_[d] -= ms;
    r_.busy_ms[d] += end - start;
    r_.ops.push_back({op, d, start, end});
    r_.makespan_ms = std::max(r_.makespan_ms, end);
    if (op.kind == OpKind::kWeight) {
      ledger_.Ends(d, end, -c.weight_stored_bytes);
      --in_flight_[d];
      return d;
    }
    // Tensors between stages (memory_ledger.h): an op's output stays on d
    // until its consumer takes it (on another device: the sent activation
    // until this stage's backward, the sent input gradient until the end of
    // the iteration); what an op consumes becomes its own when it starts.
    const double transient = c.peak_bytes - c.stored_bytes;
    const double sent_output = SentOutputBytes(shape_, costs_, op.stage, op.micro_batch);
    const bool last = op.stage + 1 == shape_.stages();
    if (op.kind == OpKind::kForward) {
      r_.peak_in_flight[d] = std::max(r_.peak_in_flight[d], ++in_flight_[d]);
      const double input = op.stage > 0 ? costs_[op.stage - 1][op.micro_batch].activation_bytes : 0;
      ledger_.Starts(d, start, c.stored_bytes + transient - input);
      ledger_.Ends(d, end, (last ? 0 : c.activation_bytes) - transient);
      forward_end_[key] = end;
      if (last) {
        backward_ready_[key] = end;  // the loss
        return d;
      }
      const uint32_t to = shape_.DeviceOf(op.stage + 1);
      if (sent_output > 0) ledger_.Received(to, d, end, sent_output);
      forward_ready_[Key(op.stage + 1, op.micro_batch)] = Send(op, d, to, c.activation_bytes, end);
      return to;
    }
    // The sent activation is released just before.
    const double output_grad = last ? 0 : costs_[op.stage + 1][op.micro_batch].gradient_bytes;
    const double extra = split ? c.split_backward_extra_bytes() : 0.0;
    ledger_.Starts(d, start, transient + extra - sent_output - output_grad);
    ledger_.Ends(d, end,
                 (op.stage > 0 ? c.gradient_bytes : 0) - transient - extra -
                     (split ? c.stored_bytes - c.weight_stored_bytes : c.stored_bytes));
    backward_end_[key] = end;
    if (!split) --in_flight_[d];
    if (op.stage == 0) return d;
    const uint32_t to = shape_.DeviceOf(op.stage - 1);
    const double sent_gradient = SentGradientBytes(shape_, costs_, op.stage, op.micro_batch);
    if (sent_gradient > 0) ledger_.Received(to, d, end, sent_gradient);
    backward_ready_[Key(op.stage - 1, op.micro_batch)] = Send(op, d, to, c.gradient_bytes, end);
    return to;
  }

  const PipelineShape& shape_;
  const DeviceOrder& order_;
  const StageCostTable& costs_;
  const ClusterNetwork& network_;
  // When the input of F(s, mb) / the gradient of B(s, mb) is on its device.
  std::vector<double> forward_ready_;
  std::vector<double> backward_ready_;
  std::vector<double> forward_end_;
  std::vector<double> backward_end_;
  std::vector<bool> split_;  // the (stage, micro-batch) has a W
  std::vector<size_t> next_;
  std::vector<double> device_free_;
  std::vector<uint32_t> in_flight_;
  std::vector<double> channel_free_;  // [from * devices + to]
  std::vector<double> start_at_;      // per device, see Refresh
  std::vector<double> work_left_ms_;  // per device: durations of its ops still to run
  const double give_up_above_ms_;
  MemoryLedger ledger_;
  SimulationResult r_;
};

}  // namespace

SimulationResult Simulate(const PipelineShape& shape, const DeviceOrder& order,
                          const StageCostTable& costs, const ClusterNetwork& network,
                          double makespan_limit_ms) {
  return Replay(shape, order, costs, network, makespan_limit_ms).Run();
}

}  // namespace varipipe::planner
