#include "planner/sim/weight_fill.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"

namespace varipipe::planner {
namespace {

constexpr double kUnknown = -1;
// How much of a W must fit into a device's expected idle time for the W to
// run there (the rest delays the next F or B).
constexpr double kGapShare = 0.5;

class Filler {
 public:
  Filler(const PipelineShape& shape, const DeviceOrder& order, const StageCostTable& costs,
         const ClusterNetwork& network, std::span<const double> limits)
      : shape_(shape), order_(order), costs_(costs), network_(network), limits_(limits) {
    const size_t keys = static_cast<size_t>(shape.stages()) * shape.micro_batches;
    forward_ready_.assign(keys, kUnknown);
    backward_ready_.assign(keys, kUnknown);
    forward_end_.assign(keys, kUnknown);
    for (uint32_t mb = 0; mb < shape.micro_batches; ++mb) forward_ready_[Key(0, mb)] = 0;
    const uint32_t devices = shape.devices;
    next_.assign(devices, 0);
    free_.assign(devices, 0);
    memory_.assign(devices, 0);
    held_.resize(devices);
    pending_.resize(devices);
    channel_free_.assign(static_cast<size_t>(devices) * devices, 0);
    out_.resize(devices);
  }

  absl::StatusOr<DeviceOrder> Run() {
    for (;;) {
      int best = -1;
      double best_at = std::numeric_limits<double>::infinity();
      bool best_weight = false;
      bool work_left = false;
      for (uint32_t d = 0; d < shape_.devices; ++d) {
        const bool has_next = next_[d] < order_[d].size();
        if (!has_next && pending_[d].empty()) continue;
        work_left = true;
        double at = 0;
        bool weight = false;
        if (!Decide(d, &at, &weight)) continue;
        if (at < best_at) {
          best_at = at;
          best = static_cast<int>(d);
          best_weight = weight;
        }
      }
      if (!work_left) return std::move(out_);
      if (best < 0) return absl::InternalError("zero-bubble fill: the order does not complete");
      if (best_weight) {
        RunWeight(static_cast<uint32_t>(best), best_at);
      } else {
        RunNext(static_cast<uint32_t>(best), best_at);
      }
    }
  }

 private:
  size_t Key(uint32_t stage, uint32_t mb) const {
    return static_cast<size_t>(stage) * shape_.micro_batches + mb;
  }
  double WeightMs(const Op& w) const { return costs_[w.stage][w.micro_batch].weight_ms; }
  double Transient(const Op& op) const {
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    return c.peak_bytes - c.stored_bytes;
  }

  // When device d's next F or B has its inputs; kUnknown: not produced yet.
  double Ready(uint32_t d) const {
    const Op& op = order_[d][next_[d]];
    const size_t key = Key(op.stage, op.micro_batch);
    if (op.kind == OpKind::kForward) return forward_ready_[key];
    if (forward_end_[key] == kUnknown || backward_ready_[key] == kUnknown) return kUnknown;
    return std::max(forward_end_[key], backward_ready_[key]);
  }

  // When device d's next F or B is expected to have its inputs: the known
  // time, or when its producer would deliver it if the producer is the next
  // F or B of its own device and can start; infinity when it is further off.
  double Expected(uint32_t d) const {
    const double ready = Ready(d);
    if (ready != kUnknown) return ready;
    const Op& op = order_[d][next_[d]];
    const bool forward = op.kind == OpKind::kForward;
    const Op producer{op.kind, forward ? op.stage - 1 : op.stage + 1, op.micro_batch};
    if (!forward && forward_end_[Key(op.stage, op.micro_batch)] == kUnknown) {
      return std::numeric_limits<double>::infinity();
    }
    const uint32_t pd = shape_.DeviceOf(producer.stage);
    if (next_[pd] >= order_[pd].size() || !(order_[pd][next_[pd]] == producer)) {
      return std::numeric_limits<double>::infinity();
    }
    const double producer_ready = Ready(pd);
    if (producer_ready == kUnknown) return std::numeric_limits<double>::infinity();
    const StageOpCost& c = costs_[producer.stage][producer.micro_batch];
    const double end =
        std::max(producer_ready, free_[pd]) + (forward ? c.forward_ms : c.input_grad_ms());
    return end +
           network_.Between(pd, d).TransferMs(forward ? c.activation_bytes : c.gradient_bytes);
  }

  // Whether device d's next F or B fits its limit with what it holds now (a
  // B split: also what it then keeps for its W).
  bool Fits(uint32_t d) const {
    const Op& op = order_[d][next_[d]];
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    if (op.kind == OpKind::kForward) {
      const double reserve =
          held_[d].empty() ? Transient(op) : std::max(Transient(op), *held_[d].rbegin());
      return memory_[d] + c.stored_bytes + reserve <= limits_[d];
    }
    return memory_[d] + Transient(op) <= limits_[d] && KeepFits(d, op);
  }
  bool KeepFits(uint32_t d, const Op& b) const {
    const StageOpCost& c = costs_[b.stage][b.micro_batch];
    return memory_[d] - c.stored_bytes + c.weight_stored_bytes <= limits_[d] &&
           memory_[d] + Transient(b) + c.split_backward_extra_bytes() <= limits_[d];
  }

  // What device d does next and from when; false when it must wait for an
  // input not produced yet.
  bool Decide(uint32_t d, double* at, bool* weight) const {
    if (next_[d] >= order_[d].size()) {  // the tail: pending Ws
      *at = free_[d];
      *weight = true;
      return true;
    }
    const double ready = Ready(d);
    // A W runs in the gap when most of it fits before the input arrives.
    const bool gap =
        !pending_[d].empty() && Expected(d) - free_[d] >= kGapShare * WeightMs(pending_[d].front());
    if (!pending_[d].empty() && (gap || !Fits(d))) {
      *at = free_[d];
      *weight = true;
      return true;
    }
    if (ready == kUnknown) return false;
    *at = std::max(ready, free_[d]);
    *weight = false;
    return true;
  }

  double Send(uint32_t from, uint32_t to, double bytes, double produced_at) {
    if (from == to) return produced_at;
    double& free_at = channel_free_[static_cast<size_t>(from) * shape_.devices + to];
    const double start = std::max(free_at, produced_at);
    free_at = start + network_.Between(from, to).TransferMs(bytes);
    return free_at;
  }

  void RunWeight(uint32_t d, double start) {
    const Op op = pending_[d].front();
    pending_[d].pop_front();
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    free_[d] = start + c.weight_ms;
    memory_[d] -= c.weight_stored_bytes;
    out_[d].push_back(op);
  }

  void RunNext(uint32_t d, double start) {
    const Op op = order_[d][next_[d]++];
    const size_t key = Key(op.stage, op.micro_batch);
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    out_[d].push_back(op);
    if (op.kind == OpKind::kForward) {
      const double end = start + c.forward_ms;
      free_[d] = end;
      memory_[d] += c.stored_bytes;
      held_[d].insert(Transient(op));
      forward_end_[key] = end;
      if (op.stage + 1 < shape_.stages()) {
        forward_ready_[Key(op.stage + 1, op.micro_batch)] =
            Send(d, shape_.DeviceOf(op.stage + 1), c.activation_bytes, end);
      } else {
        backward_ready_[key] = end;
      }
      return;
    }
    // Split unless what B keeps would not fit even with no W pending: then
    // the whole backward (no W).
    const bool split = KeepFits(d, op);
    const double end = start + (split ? c.input_grad_ms() : c.backward_ms);
    free_[d] = end;
    memory_[d] -= split ? c.stored_bytes - c.weight_stored_bytes : c.stored_bytes;
    held_[d].erase(held_[d].find(Transient(op)));
    if (split) pending_[d].push_back({OpKind::kWeight, op.stage, op.micro_batch});
    if (op.stage > 0) {
      backward_ready_[Key(op.stage - 1, op.micro_batch)] =
          Send(d, shape_.DeviceOf(op.stage - 1), c.gradient_bytes, end);
    }
  }

  const PipelineShape& shape_;
  const DeviceOrder& order_;
  const StageCostTable& costs_;
  const ClusterNetwork& network_;
  std::span<const double> limits_;
  std::vector<double> forward_ready_;
  std::vector<double> backward_ready_;
  std::vector<double> forward_end_;
  std::vector<size_t> next_;
  std::vector<double> free_;
  std::vector<double> memory_;
  std::vector<std::multiset<double>> held_;  // transients of F-not-B micro-batches
  std::vector<std::deque<Op>> pending_;      // Ws whose B ran, oldest first
  std::vector<double> channel_free_;
  DeviceOrder out_;
};

}  // namespace

absl::StatusOr<DeviceOrder> FillWeightGradients(const PipelineShape& shape,
                                                const DeviceOrder& order,
                                                const StageCostTable& costs,
                                                const ClusterNetwork& network,
                                                std::span<const double> memory_limit_bytes) {
  if (memory_limit_bytes.size() != shape.devices) {
    return absl::InvalidArgumentError("one memory limit per device is needed");
  }
  if (const std::string problem = CheckScheduleCoverage(shape, order); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("zero-bubble fill: ", problem));
  }
  for (const std::vector<Op>& ops : order) {
    for (const Op& op : ops) {
      if (op.kind == OpKind::kWeight) {
        return absl::InvalidArgumentError(
            absl::StrCat("zero-bubble fill: the order already has ", op.ToString()));
      }
    }
  }
  return Filler(shape, order, costs, network, memory_limit_bytes).Run();
}

}  // namespace varipipe::planner
