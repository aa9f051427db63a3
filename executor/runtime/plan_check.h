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
// - split backwards (CheckWeightGradOrder).
// The first violation is returned as INVALID_ARGUMENT naming the iteration,
// rank, instruction index and field, e.g.
//   plan of iteration 3 for rank 1: instruction #17 (send_start, micro-batch
//   2, stage 1): tensors[0].dims[2] is 4096 but model.hidden_size is 32
// It needs no LibTorch and allocates nothing sized by the plan.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_PLAN_CHECK_H_
#define VARIPIPE_EXECUTOR_RUNTIME_PLAN_CHECK_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
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
  // The stage layout the executor's model was built with: a plan that
  // records another (ExecutionPlan.stage_layers) is refused, naming both.
  std::optional<LayerLayout> layers;
};

absl::Status CheckPlan(const v1::ExecutionPlan& plan, const v1::JobConfig& config,
                       const PlanRecipient& recipient);

// The order of split backwards (zero-bubble schedules), as the planner's
// validator requires it: every weight_grad follows a backward with
// weight_grad_deferred of the same stage and micro-batch, exactly one per
// such backward, and none is outstanding at an all_reduce or optimizer_step
// (they read the gradients) or at the end of the plan. INVALID_ARGUMENT
// naming the instruction otherwise. CheckPlan includes it; the interpreter
// runs it before the first instruction, so a wrong order never leaves
// gradients half accumulated.
absl::Status CheckWeightGradOrder(const v1::ExecutionPlan& plan);

// Rows of a micro-batch's tensors: one per sample, or one per packed row
// (row_starts). Its padded tokens are rows x (input_len + target_len).
uint64_t MicroBatchRows(const v1::MicroBatch& mb);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_PLAN_CHECK_H_
