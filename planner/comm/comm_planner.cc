#include "planner/comm/comm_planner.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace varipipe::planner {
namespace {

// Sort key of a program entry: time, then comm before compute (a Start
// issued at the moment a compute begins comes first), then sequence.
struct Keyed {
  double time;
  int klass;
  uint64_t sequence;
  ProgramEntry entry;
};

// Op index: (stage, micro-batch, forward/backward/weight).
size_t OpKey(const PipelineShape& shape, const Op& op) {
  return (static_cast<size_t>(op.stage) * shape.micro_batches + op.micro_batch) * 3 +
         static_cast<size_t>(op.kind);
}

// An op of device `device`'s order, by its end time.
struct Ended {
  double end;
  uint32_t device;
  size_t index;
};

// Every op in order of end time (ties: device, position in its order).
absl::StatusOr<std::vector<Ended>> OpsByEnd(const PipelineShape& shape, const DeviceOrder& order,
                                            const std::vector<double>& end) {
  std::vector<Ended> ended;
  for (uint32_t d = 0; d < shape.devices; ++d) {
    for (size_t i = 0; i < order[d].size(); ++i) {
      const double e = end[OpKey(shape, order[d][i])];
      if (e < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("the simulation has no timing for ", order[d][i].ToString()));
      }
      ended.push_back({e, d, i});
    }
  }
  std::sort(ended.begin(), ended.end(), [](const Ended& a, const Ended& b) {
    return std::tie(a.end, a.device, a.index) < std::tie(b.end, b.device, b.index);
  });
  return ended;
}

// Transfers in the order their producers end, their Starts and each
// device's computes keyed by time; feeds: consumer op key -> transfer.
std::vector<std::vector<Keyed>> KeyedSteps(const PipelineShape& shape, const DeviceOrder& order,
                                           const std::vector<Ended>& ended,
                                           const std::vector<double>& start, CommPlan& plan,
                                           std::map<size_t, uint32_t>& feeds) {
  std::vector<std::vector<Keyed>> keyed(shape.devices);
  uint64_t sequence = 0;
  for (const Ended& e : ended) {
    const Op& op = order[e.device][e.index];
    if (op.kind == OpKind::kWeight) continue;  // W's result stays on its device
    const bool forward = op.kind == OpKind::kForward;
    if (forward ? op.stage + 1 >= shape.stages() : op.stage == 0) continue;
    const uint32_t consumer_stage = forward ? op.stage + 1 : op.stage - 1;
    const uint32_t to = shape.DeviceOf(consumer_stage);
    if (to == e.device) continue;  // same device: no transfer
    const uint32_t id = static_cast<uint32_t>(plan.transfers.size());
    plan.transfers.push_back({op, e.device, to});
    const uint64_t seq = sequence++;
    keyed[e.device].push_back({e.end, 0, seq, {ProgramStep::kSendStart, op, id}});
    keyed[to].push_back({e.end, 0, seq, {ProgramStep::kRecvStart, op, id}});
    feeds[OpKey(shape, Op{op.kind, consumer_stage, op.micro_batch})] = id;
  }
  for (uint32_t d = 0; d < shape.devices; ++d) {
    for (size_t i = 0; i < order[d].size(); ++i) {
      keyed[d].push_back(
          {start[OpKey(shape, order[d][i])], 1, i, {ProgramStep::kCompute, order[d][i], 0}});
    }
    std::stable_sort(keyed[d].begin(), keyed[d].end(), [](const Keyed& a, const Keyed& b) {
      return std::tie(a.time, a.klass, a.sequence) < std::tie(b.time, b.klass, b.sequence);
    });
  }
  return keyed;
}

// One device's program with its Waits: RecvWait before the consumer;
// activation SendWait before the sender's backward of the same (stage,
// micro-batch); gradient SendWaits at the end.
std::vector<ProgramEntry> ProgramWithWaits(const PipelineShape& shape,
                                           const std::vector<Keyed>& keyed, const CommPlan& plan,
                                           const std::map<size_t, uint32_t>& feeds) {
  std::vector<ProgramEntry> program;
  std::map<size_t, uint32_t> pending_activation_sends;  // forward op key -> transfer
  std::vector<uint32_t> gradient_sends;
  for (const Keyed& k : keyed) {
    const ProgramEntry& entry = k.entry;
    if (entry.step != ProgramStep::kCompute) {
      program.push_back(entry);
      if (entry.step != ProgramStep::kSendStart) continue;
      if (plan.transfers[entry.transfer].activation()) {
        pending_activation_sends[OpKey(shape, entry.op)] = entry.transfer;
      } else {
        gradient_sends.push_back(entry.transfer);
      }
      continue;
    }
    if (const auto it = feeds.find(OpKey(shape, entry.op)); it != feeds.end()) {
      program.push_back({ProgramStep::kRecvWait, entry.op, it->second});
    }
    if (entry.op.kind == OpKind::kBackward) {
      const Op forward{OpKind::kForward, entry.op.stage, entry.op.micro_batch};
      if (const auto it = pending_activation_sends.find(OpKey(shape, forward));
          it != pending_activation_sends.end()) {
        program.push_back({ProgramStep::kSendWait, forward, it->second});
        pending_activation_sends.erase(it);
      }
    }
    program.push_back(entry);
  }
  for (const auto& [unused, id] : pending_activation_sends) {
    program.push_back({ProgramStep::kSendWait, plan.transfers[id].producer, id});
  }
  for (uint32_t id : gradient_sends) {
    program.push_back({ProgramStep::kSendWait, plan.transfers[id].producer, id});
  }
  return program;
}

}  // namespace

absl::StatusOr<CommPlan> PlanCommunication(const PipelineShape& shape, const DeviceOrder& order,
                                           const SimulationResult& timeline) {
  if (!timeline.completed) {
    return absl::FailedPreconditionError("communication planning needs a completed simulation");
  }
  const size_t ops = static_cast<size_t>(shape.stages()) * shape.micro_batches * 3;
  std::vector<double> start(ops, -1);
  std::vector<double> end(ops, -1);
  for (const TimedOp& t : timeline.ops) {
    start[OpKey(shape, t.op)] = t.start_ms;
    end[OpKey(shape, t.op)] = t.end_ms;
  }
  absl::StatusOr<std::vector<Ended>> ended = OpsByEnd(shape, order, end);
  if (!ended.ok()) return ended.status();
  CommPlan plan;
  std::map<size_t, uint32_t> feeds;
  const std::vector<std::vector<Keyed>> keyed =
      KeyedSteps(shape, order, *ended, start, plan, feeds);
  plan.programs.resize(shape.devices);
  for (uint32_t d = 0; d < shape.devices; ++d) {
    plan.programs[d] = ProgramWithWaits(shape, keyed[d], plan, feeds);
  }
  return plan;
}

}  // namespace varipipe::planner
