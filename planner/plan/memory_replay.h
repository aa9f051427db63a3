// Check 4 of the plan validator (validator.h), independent of the
// simulator: a rank's activation memory replayed from its plan's own
// instructions, in their order. Buffers are sized from their TensorSpecs;
// what the model's ops keep comes from the planner's per-stage costs
// (stage_costs.h). The rules are the simulator's (planner/sim/
// memory_ledger.h), applied to the instruction stream:
//   - load_input and recv_start allocate their buffers; free_buffer frees
//     them;
//   - a forward takes its input buffers as its own, holds its stored bytes
//     plus its transient while it runs, keeps the stored bytes and
//     allocates its outputs;
//   - a backward takes its output-gradient buffers as its own, holds its
//     transient (a deferred one: also what it keeps beyond its stored bytes)
//     while it runs, then frees its stored bytes (a deferred one: all but
//     what its weight_grad needs) and allocates its input gradients;
//   - a weight_grad frees what its backward kept for it.
// The peak is the largest level after any instruction.
#ifndef VARIPIPE_PLANNER_PLAN_MEMORY_REPLAY_H_
#define VARIPIPE_PLANNER_PLAN_MEMORY_REPLAY_H_

#include "absl/status/statusor.h"
#include "planner/schedule/stage_costs.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::planner {

struct ReplayedPeak {
  double bytes = 0;
  int instruction = -1;  // index of the instruction after which it is reached
};

// `costs[stage][micro_batch]` for every (stage, micro-batch) the plan
// computes (the replica's costs, backward split applied). InvalidArgument
// naming the instruction when the plan reads a buffer it never allocated or
// computes outside `costs`.
absl::StatusOr<ReplayedPeak> ReplayActivationMemory(const v1::ExecutionPlan& plan,
                                                    const StageCostTable& costs);

// Bytes of a tensor of this spec (0 for an unknown dtype).
double TensorSpecBytes(const v1::TensorSpec& spec);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PLAN_MEMORY_REPLAY_H_
