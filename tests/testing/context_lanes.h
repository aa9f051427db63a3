// The tests' own lowering of plans onto context-parallel lanes, for the
// executor's cells while (and besides) the planner's: one iteration's plans
// of a job without context parallelism (one per (replica, pipeline rank)),
// turned into the plans of the same job with c lanes (one per plan rank,
// common/config/rank_layout.h), as the shared contract of issue 47 lays
// them out:
// - every lane's plan lists all the replica's micro-batches; each is split
//   across the lanes or whole on one lane, as `placement` says;
// - a split micro-batch is one row of all_gather_count positions
//   (ContextParallelSplit of its samples' sequences), its tensors [1, A] and
//   [1, A, hidden];
// - a lane keeps the instructions of the split micro-batches and of its own
//   whole ones, in the original order: every micro-batch is a slot of one
//   schedule projected onto each lane, so split micro-batches run in the
//   same relative order on every lane;
// - peers are the same lane's plan ranks, gradient groups every replica's
//   lanes (DataParallelGroup), buffer ids renumbered densely.
#ifndef VARIPIPE_TESTS_TESTING_CONTEXT_LANES_H_
#define VARIPIPE_TESTS_TESTING_CONTEXT_LANES_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

// How the lanes run a micro-batch (of any replica).
using ContextPlacementFn = std::function<v1::ContextPlacement(const v1::MicroBatch&)>;

// Every micro-batch split.
v1::ContextPlacement SplitAll(const v1::MicroBatch& mb);
// Even ids split, odd ids whole on lane (id / 2) % `lanes`.
ContextPlacementFn SplitEvenIds(uint32_t lanes);

// `plans`: one iteration's plans of `config` with parallelism.context 1, by
// plan rank. `context` (>= 2): the lanes. Returns the plans by plan rank of
// the job with parallelism.context `context`.
absl::StatusOr<std::vector<v1::ExecutionPlan>> LowerToContextLanes(
    const std::vector<v1::ExecutionPlan>& plans, const v1::JobConfig& config, uint32_t context,
    const ContextPlacementFn& placement);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_CONTEXT_LANES_H_
