#include "planner/sim/weight_fill.h"

#include <algorithm>
#include <cmath>
#include <limits>

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
         const ClusterNetwork& network, std::span<const double> limits, double makespan_limit_ms)
      : shape_(shape),
        order_(order),
        costs_(costs),
        network_(network),
        limits_(limits),
        give_up_above_ms_(makespan_limit_ms * (1 + kMakespanLimitMargin)) {
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
    pending_head_.assign(devices, 0);
    channel_free_.assign(static_cast<size_t>(devices) * devices, 0);
    decisions_.assign(devices, Decision());
    out_.resize(devices);
    work_left_ms_.assign(devices, 0);
    for (uint32_t d = 0; d < devices; ++d) {
      ops_left_ += order[d].size();
      out_[d].reserve(order[d].size() + order[d].size() / 2);
      pending_[d].reserve(order[d].size() / 2);
      if (!std::isfinite(give_up_above_ms_)) continue;  // nothing is compared
      for (const Op& op : order[d]) {
        const StageOpCost& c = costs_[op.stage][op.micro_batch];
        work_left_ms_[d] += op.kind == OpKind::kForward ? c.forward_ms : c.backward_ms;
      }
    }
  }

  // std::nullopt: the makespan would exceed the limit.
  absl::StatusOr<std::optional<DeviceOrder>> Run() {
    for (;;) {
      int best = -1;
      double best_at = std::numeric_limits<double>::infinity();
      bool best_weight = false;
      if (ops_left_ == 0) return std::move(out_);
      for (uint32_t d = 0; d < shape_.devices; ++d) {
        Decision& decision = decisions_[d];
        if (!decision.known) decision = Decide(d);
        if (decision.at < best_at) {
          best_at = decision.at;
          best = static_cast<int>(d);
          best_weight = decision.weight;
        }
      }
      if (best < 0) return absl::InternalError("zero-bubble fill: the order does not complete");
      const uint32_t ran = static_cast<uint32_t>(best);
      const uint32_t receiver = best_weight ? RunWeight(ran, best_at) : RunNext(ran, best_at);
      --ops_left_;
      if (free_[ran] + work_left_ms_[ran] > give_up_above_ms_) return std::nullopt;
      Forget(ran, receiver);
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
  // `*reads`: the producer's device when its state was consulted.
  double Expected(uint32_t d, int* reads) const {
    const double ready = Ready(d);
    if (ready != kUnknown) return ready;
    const Op& op = order_[d][next_[d]];
    const bool forward = op.kind == OpKind::kForward;
    const Op producer{op.kind, forward ? op.stage - 1 : op.stage + 1, op.micro_batch};
    if (!forward && forward_end_[Key(op.stage, op.micro_batch)] == kUnknown) {
      return std::numeric_limits<double>::infinity();
    }
    const uint32_t pd = shape_.DeviceOf(producer.stage);
    *reads = static_cast<int>(pd);
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

  // The transfer buffers an op leaves on its device (stage_costs.h).
  double SentOutput(const Op& op) const {
    return SentOutputBytes(shape_, costs_, op.stage, op.micro_batch);
  }
  double SentGradient(const Op& op) const {
    return SentGradientBytes(shape_, costs_, op.stage, op.micro_batch);
  }

  // Whether device d's next F or B fits its limit with what it holds now (a
  // B split: also what it then keeps for its W).
  bool Fits(uint32_t d) const {
    const Op& op = order_[d][next_[d]];
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    if (op.kind == OpKind::kForward) {
      const double reserve =
          held_[d].empty() ? Transient(op) : std::max(Transient(op), held_[d].back());
      return memory_[d] + c.stored_bytes + SentOutput(op) + reserve <= limits_[d];
    }
    return memory_[d] - SentOutput(op) + Transient(op) <= limits_[d] && KeepFits(d, op);
  }
  // What device d holds while B runs and after it, split.
  bool KeepFits(uint32_t d, const Op& b) const {
    const StageOpCost& c = costs_[b.stage][b.micro_batch];
    const double during = memory_[d] - SentOutput(b);
    return during - c.stored_bytes + c.weight_stored_bytes + SentGradient(b) <= limits_[d] &&
           during + Transient(b) + c.split_backward_extra_bytes() <= limits_[d];
  }

  // What a device does next and from when. It reads the device's own state,
  // the inputs of its next op and at most one other device (`reads`, see
  // Expected), so it stays valid until one of those runs or receives (Forget).
  struct Decision {
    bool known = false;
    // Infinity: it has nothing left or waits for an input not produced yet.
    double at = std::numeric_limits<double>::infinity();
    bool weight = false;  // runs its oldest pending W
    int reads = -1;
  };
  Decision Decide(uint32_t d) const {
    Decision out{.known = true};
    if (next_[d] >= order_[d].size()) {  // the tail: pending Ws
      if (!HasPending(d)) return out;
      out.at = free_[d];
      out.weight = true;
      return out;
    }
    const double ready = Ready(d);
    // A W runs in the gap when most of it fits before the input arrives.
    const bool gap = HasPending(d) &&
                     Expected(d, &out.reads) - free_[d] >= kGapShare * WeightMs(OldestPending(d));
    if (HasPending(d) && (gap || !Fits(d))) {
      out.at = free_[d];
      out.weight = true;
      return out;
    }
    if (ready == kUnknown) return out;
    out.at = std::max(ready, free_[d]);
    return out;
  }

  // Device `ran` ran an op whose output went to `receiver`: the decisions
  // that read either of them are stale.
  void Forget(uint32_t ran, uint32_t receiver) {
    for (uint32_t d = 0; d < shape_.devices; ++d) {
      const int reads = decisions_[d].reads;
      if (d == ran || d == receiver || reads == static_cast<int>(ran) ||
          reads == static_cast<int>(receiver)) {
        decisions_[d].known = false;
      }
    }
  }

  bool HasPending(uint32_t d) const { return pending_head_[d] < pending_[d].size(); }
  const Op& OldestPending(uint32_t d) const { return pending_[d][pending_head_[d]]; }

  // Sorted transients of the micro-batches device d holds.
  void Hold(uint32_t d, double transient) {
    std::vector<double>& held = held_[d];
    held.insert(std::upper_bound(held.begin(), held.end(), transient), transient);
  }
  void Release(uint32_t d, double transient) {
    std::vector<double>& held = held_[d];
    held.erase(std::lower_bound(held.begin(), held.end(), transient));
  }

  double Send(uint32_t from, uint32_t to, double bytes, double produced_at) {
    if (from == to) return produced_at;
    double& free_at = channel_free_[static_cast<size_t>(from) * shape_.devices + to];
    const double start = std::max(free_at, produced_at);
    free_at = start + network_.Between(from, to).TransferMs(bytes);
    return free_at;
  }

  // Each returns the device that receives the op's output (d when none).
  uint32_t RunWeight(uint32_t d, double start) {
    const Op op = OldestPending(d);
    ++pending_head_[d];
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    free_[d] = start + c.weight_ms;
    work_left_ms_[d] -= c.weight_ms;
    memory_[d] -= c.weight_stored_bytes;
    out_[d].push_back(op);
    return d;
  }

  uint32_t RunNext(uint32_t d, double start) {
    const Op op = order_[d][next_[d]++];
    const size_t key = Key(op.stage, op.micro_batch);
    const StageOpCost& c = costs_[op.stage][op.micro_batch];
    out_[d].push_back(op);
    if (op.kind == OpKind::kForward) {
      const double end = start + c.forward_ms;
      free_[d] = end;
      work_left_ms_[d] -= c.forward_ms;
      memory_[d] += c.stored_bytes + SentOutput(op);
      Hold(d, Transient(op));
      forward_end_[key] = end;
      if (op.stage + 1 == shape_.stages()) {
        backward_ready_[key] = end;
        return d;
      }
      const uint32_t to = shape_.DeviceOf(op.stage + 1);
      forward_ready_[Key(op.stage + 1, op.micro_batch)] = Send(d, to, c.activation_bytes, end);
      return to;
    }
    // Split unless what B keeps would not fit even with no W pending: then
    // the whole backward (no W).
    const bool split = KeepFits(d, op);
    // A split B leaves its W's time in work_left_ms_ until the W runs.
    const double ms = split ? c.input_grad_ms() : c.backward_ms;
    const double end = start + ms;
    free_[d] = end;
    work_left_ms_[d] -= ms;
    memory_[d] += SentGradient(op) - SentOutput(op) -
                  (split ? c.stored_bytes - c.weight_stored_bytes : c.stored_bytes);
    Release(d, Transient(op));
    if (split) {
      pending_[d].push_back({OpKind::kWeight, op.stage, op.micro_batch});
      ++ops_left_;
    }
    if (op.stage == 0) return d;
    const uint32_t to = shape_.DeviceOf(op.stage - 1);
    backward_ready_[Key(op.stage - 1, op.micro_batch)] = Send(d, to, c.gradient_bytes, end);
    return to;
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
  std::vector<std::vector<double>> held_;  // sorted transients of F-not-B micro-batches
  // Ws whose B ran, oldest first from pending_head_ on.
  std::vector<std::vector<Op>> pending_;
  std::vector<size_t> pending_head_;
  std::vector<double> channel_free_;
  std::vector<Decision> decisions_;  // per device, see Decide
  size_t ops_left_ = 0;              // F and B not run yet, and pending Ws
  // Per device: the durations of its F and B still to run (whole) and of
  // its pending Ws.
  std::vector<double> work_left_ms_;
  const double give_up_above_ms_;
  DeviceOrder out_;
};

}  // namespace

absl::StatusOr<DeviceOrder> FillWeightGradients(const PipelineShape& shape,
                                                const DeviceOrder& order,
                                                const StageCostTable& costs,
                                                const ClusterNetwork& network,
                                                std::span<const double> memory_limit_bytes) {
  absl::StatusOr<std::optional<DeviceOrder>> filled = FillWeightGradientsWithin(
      shape, order, costs, network, memory_limit_bytes, std::numeric_limits<double>::infinity());
  if (!filled.ok()) return filled.status();
  return **std::move(filled);
}

absl::StatusOr<std::optional<DeviceOrder>> FillWeightGradientsWithin(
    const PipelineShape& shape, const DeviceOrder& order, const StageCostTable& costs,
    const ClusterNetwork& network, std::span<const double> memory_limit_bytes,
    double makespan_limit_ms) {
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
  return Filler(shape, order, costs, network, memory_limit_bytes, makespan_limit_ms).Run();
}

}  // namespace varipipe::planner
