// The plan validator: runs on every set of plans the planner emits (and in
// tests). A plan that fails is a planner bug; it is reported with the rank,
// the instruction index and the reason, and never published.
//
// Checks, over all ranks' plans of one iteration:
//   1. Structure: format version, rank coordinates, buffer ids below
//      num_buffers; every buffer written once before it is read, never read
//      after it is freed, freed at most once; every Start has exactly one
//      Wait after it and every Wait a Start before it.
//   2. Compute: every micro-batch's forward and backward run exactly once on
//      every stage the rank holds, backward after forward, and a compute
//      reads a received tensor only after its RecvWait. A backward with
//      weight_grad_deferred has exactly one weight_grad of the same stage
//      and micro-batch after it, before any all_reduce or optimizer_step;
//      no other weight_grad exists.
//      With context parallelism (ExecutionPlan.context_parallel > 1) a
//      lane computes exactly the split micro-batches and the whole ones on
//      its lane (ContextPlacement), and every lane of a context group runs
//      the split micro-batches' forwards and backwards in the same order.
//      A micro-batch's own recompute mode (MicroBatch.recompute) is none,
//      selective or full, the same on every rank of its replica.
//   3. Deadlock freedom under the executor's semantics: each pair of ranks
//      has one ordered channel; the k-th transfer a rank starts on it pairs
//      with the peer's k-th, which must be the opposite direction with the
//      same kind, shapes and dtype; a transfer completes when both sides
//      have started it and every earlier transfer on the channel has
//      completed; Starts never block, a Wait blocks until its transfer has
//      completed; a split micro-batch's forward or backward (its attention's
//      collectives) blocks until every lane of the context group has
//      reached it. Every rank must reach its end.
//   4. Memory: the predicted peak of every rank is within the limit; given
//      the planner's costs, each rank's plan is also replayed on its own
//      (memory_replay.h) and its replayed peak must be within the limit.
//   5. Lengths (ValidateMicroBatchLengths): every micro-batch's padded
//      input_len and target_len within the job's data limits, which the
//      executor's plan check also requires.
#ifndef VARIPIPE_PLANNER_PLAN_VALIDATOR_H_
#define VARIPIPE_PLANNER_PLAN_VALIDATOR_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "planner/schedule/stage_costs.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::planner {

// `plans` indexed by rank. `peak_bytes` (per rank, may be empty) is checked
// against `memory_limit_bytes`. InvalidArgument naming rank, instruction and
// reason when a check fails; a deadlock lists where every stuck rank waits.
absl::Status ValidatePlans(std::span<const v1::ExecutionPlan> plans,
                           std::span<const double> peak_bytes = {}, double memory_limit_bytes = 0);
// Per-rank limits (each device's own room), checks spread over `threads`:
// ranks are checked one by one and the channel replay runs per group of
// ranks that exchange transfers (one pipeline replica each). The result
// does not depend on `threads`.
absl::Status ValidatePlans(std::span<const v1::ExecutionPlan> plans,
                           std::span<const double> peak_bytes,
                           std::span<const double> memory_limit_bytes, int threads);
// With `rank_costs[r]` (may be shorter than `plans`, or hold nullptr: rank
// not replayed), rank r's plan is replayed with those costs and refused,
// naming the rank, the instruction and the bytes, when its replayed peak
// exceeds memory_limit_bytes[r] by more than a relative 1e-9 (rounding).
absl::Status ValidatePlans(std::span<const v1::ExecutionPlan> plans,
                           std::span<const double> peak_bytes,
                           std::span<const double> memory_limit_bytes, int threads,
                           std::span<const StageCostTable* const> rank_costs);

// The job's limits on padded lengths.
struct LengthLimits {
  uint32_t max_input = 0;   // data.max_sequence_length (GPT: the sequence); 0: unchecked
  uint32_t max_target = 0;  // data.max_target_length (T5); 0: unchecked
};

// Check 5 over every rank's micro-batches: InvalidArgument naming the rank,
// the micro-batch, the field and the limit when an input_len or target_len
// exceeds it.
absl::Status ValidateMicroBatchLengths(std::span<const v1::ExecutionPlan> plans,
                                       const LengthLimits& limits);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PLAN_VALIDATOR_H_
