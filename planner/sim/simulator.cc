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

// The wait-free replay of one order (see simulator.h), or of the c lanes of
// a context group (SimulateLanes): each step runs the op that can start
// earliest on any device. Devices are numbered lane * pipeline + device; a
// lane's transfers stay within the lane; a coupled (split) micro-batch's op
// runs on every lane's device of its stage at once.
class Replay {
 public:
  Replay(const PipelineShape& shape, std::vector<const DeviceOrder*> orders,
         std::vector<const StageCostTable*> costs, std::vector<const ClusterNetwork*> networks,
         std::vector<bool> coupled, double makespan_limit_ms)
      : shape_(shape),
        lanes_(static_cast<uint32_t>(orders.size())),
        devices_(lanes_ * shape.devices),
        lane_orders_(std::move(orders)),
        lane_costs_(std::move(costs)),
        networks_(std::move(networks)),
        coupled_(std::move(coupled)),
        give_up_above_ms_(makespan_limit_ms * (1 + kMakespanLimitMargin)),
        ledger_(devices_) {
    coupled_.resize(shape.micro_batches, false);
    const size_t keys = static_cast<size_t>(lanes_) * shape.stages() * shape.micro_batches;
    forward_ready_.assign(keys, kUnknown);
    backward_ready_.assign(keys, kUnknown);
    forward_end_.assign(keys, kUnknown);
    backward_end_.assign(keys, kUnknown);
    split_.assign(keys, false);
    for (uint32_t l = 0; l < lanes_; ++l) {
      for (const auto& ops : *lane_orders_[l]) {
        for (const Op& op : ops) {
          if (op.kind == OpKind::kWeight) split_[Key(l, op.stage, op.micro_batch)] = true;
        }
      }
    }
    // Without a limit nothing is compared: the sums are skipped (and the
    // per-op decrements never matter).
    work_left_ms_.assign(devices_, 0);
    for (uint32_t g = 0; g < devices_ && std::isfinite(give_up_above_ms_); ++g) {
      for (const Op& op : OrderOf(g)) work_left_ms_[g] += Duration(LaneOf(g), op);
      ledger_.Reserve(g, 4 * OrderOf(g).size());
    }
    for (uint32_t l = 0; l < lanes_; ++l) {
      for (uint32_t mb = 0; mb < shape.micro_batches; ++mb) forward_ready_[Key(l, 0, mb)] = 0;
    }
    lane_results_.resize(lanes_);
    for (SimulationResult& r : lane_results_) {
      r.busy_ms.assign(shape.devices, 0);
      r.peak_bytes.assign(shape.devices, 0);
      r.peak_in_flight.assign(shape.devices, 0);
    }
    next_.assign(devices_, 0);
    device_free_.assign(devices_, 0);
    in_flight_.assign(devices_, 0);
    channel_free_.assign(static_cast<size_t>(devices_) * devices_, 0);
    start_at_.assign(devices_, kNever);
  }

  // Fills lane_results(); false when the replay stopped (deadlock or limit).
  bool Run() {
    size_t remaining = 0;
    for (uint32_t g = 0; g < devices_; ++g) remaining += OrderOf(g).size();
    for (uint32_t l = 0; l < lanes_; ++l) {
      size_t ops = 0;
      for (const auto& o : *lane_orders_[l]) ops += o.size();
      lane_results_[l].ops.reserve(ops);
      lane_results_[l].transfers.reserve(ops);
    }
    for (uint32_t g = 0; g < devices_; ++g) Refresh(g);
    while (remaining > 0) {
      double start = 0;
      const int g = Earliest(&start);
      if (g < 0) {
        deadlock_ = Deadlock();
        return false;
      }
      // A coupled op runs on every lane's device of its stage together.
      const Op& op = OrderOf(g)[next_[g]];
      std::vector<uint32_t> ran;
      if (Coupled(op)) {
        const uint32_t d = static_cast<uint32_t>(g) % shape_.devices;
        for (uint32_t l = 0; l < lanes_; ++l) ran.push_back(l * shape_.devices + d);
      } else {
        ran.push_back(static_cast<uint32_t>(g));
      }
      std::vector<uint32_t> receivers;
      for (uint32_t device : ran) receivers.push_back(Execute(device, start));
      remaining -= ran.size();
      for (uint32_t device : ran) {
        // What the device still has to run starts no earlier than its clock.
        if (device_free_[device] + work_left_ms_[device] > give_up_above_ms_) {
          exceeded_ = true;
          return false;
        }
      }
      for (uint32_t device : ran) Refresh(device);
      for (uint32_t device : receivers) Refresh(device);
    }
    const std::vector<double> peaks = ledger_.Peaks();
    for (uint32_t l = 0; l < lanes_; ++l) {
      SimulationResult& r = lane_results_[l];
      r.completed = true;
      r.makespan_ms = makespan_ms_;
      r.bubble_fraction.resize(shape_.devices);
      for (uint32_t d = 0; d < shape_.devices; ++d) {
        r.peak_bytes[d] = peaks[l * shape_.devices + d];
        r.bubble_fraction[d] = makespan_ms_ > 0 ? 1 - r.busy_ms[d] / makespan_ms_ : 0;
      }
    }
    return true;
  }

  std::vector<SimulationResult>& lane_results() { return lane_results_; }
  const std::string& deadlock() const { return deadlock_; }
  bool exceeded() const { return exceeded_; }
  double makespan_ms() const { return makespan_ms_; }

 private:
  uint32_t LaneOf(uint32_t g) const { return g / shape_.devices; }
  const std::vector<Op>& OrderOf(uint32_t g) const {
    return (*lane_orders_[LaneOf(g)])[g % shape_.devices];
  }
  const StageCostTable& CostsOf(uint32_t lane) const { return *lane_costs_[lane]; }
  // A split micro-batch's forward or backward (its attention's collectives);
  // W is local to each lane.
  bool Coupled(const Op& op) const {
    return lanes_ > 1 && op.kind != OpKind::kWeight && coupled_[op.micro_batch];
  }

  size_t Key(uint32_t lane, uint32_t stage, uint32_t mb) const {
    return (static_cast<size_t>(lane) * shape_.stages() + stage) * shape_.micro_batches + mb;
  }

  double Duration(uint32_t lane, const Op& op) const {
    const StageOpCost& c = CostsOf(lane)[op.stage][op.micro_batch];
    return op.kind == OpKind::kForward                   ? c.forward_ms
           : op.kind == OpKind::kWeight                  ? c.weight_ms
           : split_[Key(lane, op.stage, op.micro_batch)] ? c.input_grad_ms()
                                                         : c.backward_ms;
  }

  // When the next op of device g has its inputs; kUnknown: not yet known.
  double Ready(uint32_t g) const {
    const uint32_t l = LaneOf(g);
    const Op& op = OrderOf(g)[next_[g]];
    if (op.kind == OpKind::kForward) return forward_ready_[Key(l, op.stage, op.micro_batch)];
    if (op.kind == OpKind::kWeight) return backward_end_[Key(l, op.stage, op.micro_batch)];
    const double own = forward_end_[Key(l, op.stage, op.micro_batch)];
    const double grad = backward_ready_[Key(l, op.stage, op.micro_batch)];
    return own == kUnknown || grad == kUnknown ? kUnknown : std::max(own, grad);
  }

  // Recomputes when device g's next op can start on its own (kNever: it
  // has none or its inputs are not produced yet). It changes only when g
  // runs an op or receives an input, so the replay refreshes just those.
  void Refresh(uint32_t g) {
    if (next_[g] >= OrderOf(g).size()) {
      start_at_[g] = kNever;
      return;
    }
    const double ready = Ready(g);
    start_at_[g] = ready == kUnknown ? kNever : std::max(ready, device_free_[g]);
  }

  // When device g's next op starts: its own start, or for a coupled op the
  // latest of every lane's (kNever unless every lane's device of the stage
  // is at the same op).
  double StartOf(uint32_t g) const {
    if (start_at_[g] == kNever) return kNever;
    const Op& op = OrderOf(g)[next_[g]];
    if (!Coupled(op)) return start_at_[g];
    const uint32_t d = g % shape_.devices;
    double start = 0;
    for (uint32_t l = 0; l < lanes_; ++l) {
      const uint32_t other = l * shape_.devices + d;
      if (start_at_[other] == kNever || !(OrderOf(other)[next_[other]] == op)) return kNever;
      start = std::max(start, start_at_[other]);
    }
    return start;
  }

  // The device whose next op starts earliest (ties: the lowest device); -1
  // when no next op can start.
  int Earliest(double* start) const {
    int best = -1;
    double best_start = kNever;
    for (uint32_t g = 0; g < devices_; ++g) {
      const double at = StartOf(g);
      if (at < best_start) {
        best_start = at;
        best = static_cast<int>(g);
      }
    }
    *start = best_start;
    return best;
  }

  std::string Deadlock() const {
    std::vector<std::string> stuck;
    for (uint32_t g = 0; g < devices_; ++g) {
      if (next_[g] >= OrderOf(g).size()) continue;
      const uint32_t l = LaneOf(g);
      const Op& op = OrderOf(g)[next_[g]];
      const std::string needs =
          start_at_[g] != kNever && Coupled(op)
              ? std::string("the other lanes of its stage (split micro-batch)")
          : op.kind == OpKind::kForward
              ? absl::StrCat("the activation of ", op.stage - 1, "F", op.micro_batch)
          : op.kind == OpKind::kWeight
              ? absl::StrCat("its input gradient ", op.stage, "B", op.micro_batch)
          : forward_end_[Key(l, op.stage, op.micro_batch)] == kUnknown
              ? absl::StrCat("its own forward ", op.stage, "F", op.micro_batch)
              : absl::StrCat("the gradient of ", op.stage + 1, "B", op.micro_batch);
      const std::string device = lanes_ > 1
                                     ? absl::StrCat("lane ", l, " device ", g % shape_.devices)
                                     : absl::StrCat("device ", g);
      stuck.push_back(
          absl::StrCat(device, " waits at ", op.ToString(), " (op ", next_[g], ") for ", needs));
    }
    return absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; "));
  }

  // A transfer on the (from, to) channel once it is free; returns its end.
  double Send(const Op& producer, uint32_t from, uint32_t to, double bytes, double produced_at) {
    if (from == to) return produced_at;
    double& free_at = channel_free_[static_cast<size_t>(from) * devices_ + to];
    const double start = std::max(free_at, produced_at);
    const uint32_t l = LaneOf(from);
    const uint32_t a = from % shape_.devices;
    const uint32_t b = to % shape_.devices;
    const double end = start + networks_[l]->Between(a, b).TransferMs(bytes);
    free_at = end;
    lane_results_[l].transfers.push_back({producer, a, b, bytes, start, end});
    return end;
  }

  // Runs device g's next op from `start`: time, memory (stored from forward
  // start to backward end, or with a W: all but the W-kept bytes to B's end
  // and those to W's end; plus the running op's transient), and what it
  // makes ready. Returns the device that receives its output (g itself when
  // none travels).
  uint32_t Execute(uint32_t g, double start) {
    const uint32_t l = LaneOf(g);
    const uint32_t d = g % shape_.devices;
    const uint32_t base = l * shape_.devices;  // lane l's device 0
    const StageCostTable& costs = CostsOf(l);
    SimulationResult& r = lane_results_[l];
    const Op op = OrderOf(g)[next_[g]++];
    const size_t key = Key(l, op.stage, op.micro_batch);
    const StageOpCost& c = costs[op.stage][op.micro_batch];
    const bool split = split_[key];
    const double ms = Duration(l, op);
    const double end = start + ms;
    device_free_[g] = end;
    work_left_ms_[g] -= ms;
    r.busy_ms[d] += end - start;
    r.ops.push_back({op, d, start, end});
    makespan_ms_ = std::max(makespan_ms_, end);
    if (op.kind == OpKind::kWeight) {
      ledger_.Ends(g, end, -c.weight_stored_bytes);
      --in_flight_[g];
      return g;
    }
    // Tensors between stages (memory_ledger.h): an op's output stays on d
    // until its consumer takes it (on another device: the sent activation
    // until this stage's backward, the sent input gradient until the end of
    // the iteration); what an op consumes becomes its own when it starts.
    const double transient = c.peak_bytes - c.stored_bytes;
    const double sent_output = SentOutputBytes(shape_, costs, op.stage, op.micro_batch);
    const bool last = op.stage + 1 == shape_.stages();
    if (op.kind == OpKind::kForward) {
      r.peak_in_flight[d] = std::max(r.peak_in_flight[d], ++in_flight_[g]);
      const double input = op.stage > 0 ? costs[op.stage - 1][op.micro_batch].activation_bytes : 0;
      ledger_.Starts(g, start, c.stored_bytes + transient - input);
      ledger_.Ends(g, end, (last ? 0 : c.activation_bytes) - transient);
      forward_end_[key] = end;
      if (last) {
        backward_ready_[key] = end;  // the loss
        return g;
      }
      const uint32_t to = base + shape_.DeviceOf(op.stage + 1);
      if (sent_output > 0) ledger_.Received(to, g, end, sent_output);
      forward_ready_[Key(l, op.stage + 1, op.micro_batch)] =
          Send(op, g, to, c.activation_bytes, end);
      return to;
    }
    // The sent activation is released just before.
    const double output_grad = last ? 0 : costs[op.stage + 1][op.micro_batch].gradient_bytes;
    const double extra = split ? c.split_backward_extra_bytes() : 0.0;
    ledger_.Starts(g, start, transient + extra - sent_output - output_grad);
    ledger_.Ends(g, end,
                 (op.stage > 0 ? c.gradient_bytes : 0) - transient - extra -
                     (split ? c.stored_bytes - c.weight_stored_bytes : c.stored_bytes));
    backward_end_[key] = end;
    if (!split) --in_flight_[g];
    if (op.stage == 0) return g;
    const uint32_t to = base + shape_.DeviceOf(op.stage - 1);
    const double sent_gradient = SentGradientBytes(shape_, costs, op.stage, op.micro_batch);
    if (sent_gradient > 0) ledger_.Received(to, g, end, sent_gradient);
    backward_ready_[Key(l, op.stage - 1, op.micro_batch)] = Send(op, g, to, c.gradient_bytes, end);
    return to;
  }

  const PipelineShape& shape_;
  const uint32_t lanes_;
  const uint32_t devices_;  // lanes x pipeline devices
  const std::vector<const DeviceOrder*> lane_orders_;
  const std::vector<const StageCostTable*> lane_costs_;
  const std::vector<const ClusterNetwork*> networks_;
  std::vector<bool> coupled_;  // per micro-batch: split across the lanes
  // Per (lane, stage, micro-batch): when the input of F / the gradient of B
  // is on its device.
  std::vector<double> forward_ready_;
  std::vector<double> backward_ready_;
  std::vector<double> forward_end_;
  std::vector<double> backward_end_;
  std::vector<bool> split_;  // the (lane, stage, micro-batch) has a W
  std::vector<size_t> next_;
  std::vector<double> device_free_;
  std::vector<uint32_t> in_flight_;
  std::vector<double> channel_free_;  // [from * devices + to]
  std::vector<double> start_at_;      // per device, see Refresh
  std::vector<double> work_left_ms_;  // per device: durations of its ops still to run
  const double give_up_above_ms_;
  MemoryLedger ledger_;
  std::vector<SimulationResult> lane_results_;
  double makespan_ms_ = 0;
  std::string deadlock_;
  bool exceeded_ = false;
};

}  // namespace

SimulationResult Simulate(const PipelineShape& shape, const DeviceOrder& order,
                          const StageCostTable& costs, const ClusterNetwork& network,
                          double makespan_limit_ms) {
  Replay replay(shape, {&order}, {&costs}, {&network}, {}, makespan_limit_ms);
  if (replay.Run()) return std::move(replay.lane_results()[0]);
  SimulationResult stopped;
  stopped.exceeded = replay.exceeded();
  stopped.deadlock = replay.deadlock();
  if (!stopped.exceeded) {
    // What ran before the deadlock, as before: ops, transfers and busy time.
    SimulationResult& partial = replay.lane_results()[0];
    stopped.ops = std::move(partial.ops);
    stopped.transfers = std::move(partial.transfers);
    stopped.busy_ms = std::move(partial.busy_ms);
    stopped.peak_bytes = std::move(partial.peak_bytes);
    stopped.peak_in_flight = std::move(partial.peak_in_flight);
    stopped.makespan_ms = replay.makespan_ms();
  }
  return stopped;
}

LaneSimulationResult SimulateLanes(const LanePipelines& lanes, double makespan_limit_ms) {
  LaneSimulationResult out;
  std::vector<const DeviceOrder*> orders;
  std::vector<const StageCostTable*> costs;
  std::vector<const ClusterNetwork*> networks;
  for (size_t l = 0; l < lanes.orders.size(); ++l) {
    orders.push_back(&lanes.orders[l]);
    costs.push_back(&lanes.costs[l]);
    networks.push_back(&lanes.networks[l < lanes.networks.size() ? l : 0]);
  }
  Replay replay(lanes.shape, std::move(orders), std::move(costs), std::move(networks), lanes.split,
                makespan_limit_ms);
  out.completed = replay.Run();
  out.exceeded = replay.exceeded();
  out.deadlock = replay.deadlock();
  if (out.exceeded) return out;
  out.makespan_ms = replay.makespan_ms();
  out.lanes = std::move(replay.lane_results());
  for (SimulationResult& lane : out.lanes) {
    lane.completed = out.completed;
    lane.deadlock = out.deadlock;
  }
  return out;
}

}  // namespace varipipe::planner
