// Checks a received ExecutionPlan against the job config and the rank that is
// about to run it, before the interpreter allocates or touches anything: a
// plan is untrusted input (a file, or bytes from a planner daemon and Redis).
//
// What is checked (docs/plan_format.md, "What the executor checks"):
// - identity: format version, job id, iteration, rank, dp/pp coordinates,
//   the stage layout;
// - counts: num_buffers at most the number of buffer ids the instructions
//   name, every buffer id below it, every micro-batch and stage id in range,
//   peers and all-reduce groups inside the world;
// - repeated fields of one instruction have matching lengths (buffer ids,
//   tensors, contents), and no instruction is empty;
// - every tensor shape within the config's limits: token tensors
//   [rows, length] of int64, activations [rows, length, hidden_size] of a
//   float type, rows equal to the micro-batch's rows (at most the samples of
//   a global batch), lengths equal to the micro-batch's input or target
//   length (at most the config's maximum lengths);
// - recompute modes: the plan's and each micro-batch's (empty: the plan's)
//   none, selective or full;
// - split backwards (CheckWeightGradOrder);
// - context parallelism: context_parallel is the job's parallelism.context
//   and context_rank this executor's lane; every micro-batch either split
//   (its samples' sequences cut by ContextParallelSplit, input_len the
//   lane's all_gather_count, tensors one row) or whole on a lane of the
//   group; the instructions name only the split micro-batches and the
//   whole ones of this lane.
// The first violation is returned as INVALID_ARGUMENT naming the iteration,
// rank, instruction index and field, e.g.
//   plan of iteration 3 for rank 1: instruction #17 (send_start, micro-batch
//   2, stage 1): tensors[0].dims[2] is 4096 but model.hidden_size is 32
// It needs no LibTorch and allocates nothing sized by the plan.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_PLAN_CHECK_H_
#define VARIPIPE_EXECUTOR_RUNTIME_PLAN_CHECK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::executor {

// Who is about to run the plan. Unset fields are not compared.
struct PlanRecipient {
  std::optional<uint64_t> iteration;
  int rank = 0;
  int dp_rank = 0;
  int pp_rank = 0;
  // The lane in its context group (common/config/rank_layout.h); unset: 0
  // (the plan's context_rank must then be 0).
  int context_rank = 0;
  // The stage layout the executor's model was built with: a plan that
  // records another (ExecutionPlan.stage_layers) is refused, naming both.
  std::optional<LayerLayout> layers;
};

// Everything the executor relies on before it runs a plan: the header
// (format version, job, iteration, coordinates, stage layout), each
// micro-batch's samples and rows (docs/plan_format.md), every instruction's
// fields, buffer ids, peers and tensor shapes, and the weight-gradient
// order of the plan contract. INVALID_ARGUMENT naming the plan, the
// instruction and the field otherwise.
absl::Status CheckPlan(const v1::ExecutionPlan& plan, const v1::JobConfig& config,
                       const PlanRecipient& recipient);

// A plan that passed CheckPlan for the executor about to run it. Only
// CheckedPlan::Check makes one, and the interpreter runs nothing else, so
// nothing is checked twice.
class CheckedPlan {
 public:
  static absl::StatusOr<CheckedPlan> Check(std::shared_ptr<const v1::ExecutionPlan> plan,
                                           const v1::JobConfig& config,
                                           const PlanRecipient& recipient);

  const v1::ExecutionPlan& plan() const { return *plan_; }
  // Shares the plan (e.g. with the status endpoint).
  const std::shared_ptr<const v1::ExecutionPlan>& shared() const { return plan_; }

 private:
  explicit CheckedPlan(std::shared_ptr<const v1::ExecutionPlan> plan) : plan_(std::move(plan)) {}

  std::shared_ptr<const v1::ExecutionPlan> plan_;
};

// The plan contract's order of split backwards
// (plan_contract::CheckWeightGradOrder) as a status: INVALID_ARGUMENT naming
// the plan and the instruction. CheckPlan includes it, so a wrong order is
// refused before anything runs and never leaves gradients half accumulated.
absl::Status CheckWeightGradOrder(const v1::ExecutionPlan& plan);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_PLAN_CHECK_H_
