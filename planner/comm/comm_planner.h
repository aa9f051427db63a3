// Communication planning (DynaPipe section 6): lowers per-device compute
// orders and their simulated timeline into per-device programs of compute
// ops and transfer Start/Wait events.
//
// Invariants of the result:
//   (1) Each pair of devices starts its transfers in the same order: when an
//       op's output must travel, the sender's SendStart and the receiver's
//       RecvStart are emitted together, at the op's simulated end time, and
//       both programs are ordered by (time, global sequence).
//   (2) Compute ops keep their schedule order on every device.
//   (3) Every Start has exactly one Wait after it: a RecvWait immediately
//       before the compute that consumes the tensor; an activation SendWait
//       just before the backward of the same micro-batch and stage on the
//       sender (when its buffer is released); gradient SendWaits at the end.
// Transfers between stages on the same device are not transfers at all. A
// split backward's B sends the input gradient as the whole backward does; W
// ops send nothing.
#ifndef VARIPIPE_PLANNER_COMM_COMM_PLANNER_H_
#define VARIPIPE_PLANNER_COMM_COMM_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/schedule/op.h"
#include "planner/sim/simulator.h"

namespace varipipe::planner {

struct PlannedTransfer {
  Op producer;        // forward: activation of producer.stage -> stage + 1;
                      // backward: gradient of producer.stage -> stage - 1
  uint32_t from = 0;  // device
  uint32_t to = 0;    // device
  bool activation() const { return producer.kind == OpKind::kForward; }
  // Stage whose compute consumes the tensor.
  uint32_t consumer_stage() const { return activation() ? producer.stage + 1 : producer.stage - 1; }
};

enum class ProgramStep : uint8_t { kCompute, kSendStart, kRecvStart, kSendWait, kRecvWait };

struct ProgramEntry {
  ProgramStep step = ProgramStep::kCompute;
  Op op;                  // kCompute: the op
  uint32_t transfer = 0;  // other steps: index into CommPlan::transfers
};

struct CommPlan {
  std::vector<PlannedTransfer> transfers;
  std::vector<std::vector<ProgramEntry>> programs;  // per device
};

// REQUIRES: `timeline` is a completed simulation of `order` on `shape`.
absl::StatusOr<CommPlan> PlanCommunication(const PipelineShape& shape, const DeviceOrder& order,
                                           const SimulationResult& timeline);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COMM_COMM_PLANNER_H_
