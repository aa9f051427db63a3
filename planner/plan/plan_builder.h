// Lowers the communication plans of every data-parallel replica into one
// varipipe.v1.ExecutionPlan per rank (docs/plan_format.md): buffers with ids,
// exact tensor shapes and dtypes on every transfer, LoadInput where tokens or
// labels are needed, FreeBuffer after last use, and the iteration's
// AllReduceGradients and OptimizerStep.
//
// Tensors between stages (b micro-batch size, s padded input length, t
// padded target length, h hidden size, model dtype):
//   GPT, and T5 encoder stages:   [b, s, h]
//   T5 decoder stages:            [b, t, h] (decoder activations) and
//                                 [b, s, h] (encoder output); the first
//                                 decoder stage receives only the encoder
//                                 output and loads its decoder tokens.
// Gradients have the shapes of the activations they belong to. Loaded
// tensors are INT64: input tokens [b, s] (stage 0), decoder input tokens
// [b, t] (T5 first decoder stage), labels [b, s] (GPT) or [b, t] (T5) on the
// last stage. A compute op reads received tensors in transfer order, then
// loaded ones.
//
// Global rank: common/config/rank_layout.h; the stages a rank holds are
// pp_rank, pp_rank + pipeline, ... (looped placement). Serialization of the
// result is deterministic.
#ifndef VARIPIPE_PLANNER_PLAN_PLAN_BUILDER_H_
#define VARIPIPE_PLANNER_PLAN_PLAN_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "planner/comm/comm_planner.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::planner {

struct PlannedMicroBatch {
  std::vector<uint64_t> sample_ids;  // dataset sample ids, in row order
  uint32_t input_len = 0;            // padded
  uint32_t target_len = 0;           // padded; 0 for GPT
  uint64_t real_input_tokens = 0;
  uint64_t real_target_tokens = 0;
  std::vector<uint32_t> row_starts;  // packed rows (see MicroBatch.row_starts)
  // Packed rows only: how they compute attention (MicroBatch.packed_attention).
  v1::PackedAttention packed_attention = v1::PACKED_ATTENTION_UNSPECIFIED;
  // Per sample, parallel to sample_ids (MicroBatch.sample_input_lens ...):
  // the lengths after any truncation and where each sample starts in its row.
  std::vector<uint32_t> input_lens;
  std::vector<uint32_t> target_lens;
  std::vector<uint32_t> input_offsets;
  std::vector<uint32_t> target_offsets;
  // Per stage id: the profiled (uncalibrated) forward and backward time
  // (ForwardPass.profiled_ms, BackwardPass.profiled_ms); empty: unknown.
  std::vector<double> profiled_forward_ms;
  std::vector<double> profiled_backward_ms;
  // Per stage id: W's share of profiled_backward_ms under the backward split
  // rule (backward_split.h): a split backward's B reports the rest, its W
  // this (WeightGradPass.profiled_ms).
  std::vector<double> profiled_weight_ms;
  // Context parallelism (PlanBuildOptions::context > 1): MicroBatch.context.
  // A split micro-batch is laid out as the contract says (one row holding
  // the samples back to back, row_starts {0}, input_len the lanes' padded
  // local count A, target_len 0), so its tensors are [1, A, ...].
  bool context_split = false;
  uint32_t context_lane = 0;
  // The micro-batch's own recompute mode (MicroBatch.recompute) where it
  // differs from the plan's; empty: the plan's.
  std::string recompute;
};

// One pipeline replica, or with context parallelism one lane of a
// replica's context groups: micro_batches are then all the group's (every
// lane lists them), comm the lane's own programs.
struct ReplicaPlan {
  PipelineShape shape;                           // micro_batches == micro_batches.size()
  std::vector<PlannedMicroBatch> micro_batches;  // index = MicroBatch.id
  CommPlan comm;
};

struct PlanBuildOptions {
  std::string job_id;
  uint64_t iteration = 0;
  uint32_t pipeline = 1;
  uint32_t data_parallel = 1;
  // Context-parallel degree c (lanes per context group).
  uint32_t context = 1;
  bool encoder_decoder = false;
  // T5: stages [0, encoder_stages) are encoder stages.
  uint32_t encoder_stages = 0;
  // The job's resolved stage layout, recorded in every plan
  // (ExecutionPlan.stage_layers); empty: none recorded.
  LayerLayout layers;
  uint32_t hidden = 0;
  v1::DType dtype = v1::BFLOAT16;
  std::string recompute;         // "none", "selective", "full"
  std::string schedule;          // for reports
  std::string partition_method;  // for reports
  uint64_t global_target_tokens = 0;
  double predicted_iteration_ms = 0;
  double predicted_makespan_ms = 0;
  double predicted_overhead_ms = 0;
  uint64_t calibration_version = 0;
  // Per pipeline device: its all-reduce and optimizer step, calibrated and
  // profiled (empty: 0).
  std::vector<double> predicted_all_reduce_ms;
  std::vector<double> predicted_optimizer_ms;
  std::vector<double> profiled_all_reduce_ms;
  std::vector<double> profiled_optimizer_ms;
  // Per plan rank: the simulated activation peak (ExecutionPlan field).
  std::vector<double> predicted_activation_peak_bytes;
};

// One plan per plan rank (common/config/rank_layout.h), in rank order,
// ranks built on up to `threads` threads (the result does not depend on
// it). REQUIRES: replicas.size() == data_parallel x context, replica r's
// lane k at index r x context + k, each with `pipeline` devices. With
// context > 1 every plan records context_parallel and its context_rank,
// every micro-batch its ContextPlacement; transfers name the plan ranks of
// the same lane; AllReduceGradients names the data-parallel and
// context-parallel ranks of the pipeline rank.
absl::StatusOr<std::vector<v1::ExecutionPlan>> BuildExecutionPlans(
    const PlanBuildOptions& options, const std::vector<ReplicaPlan>& replicas, int threads = 1);

// Deterministic binary serialization (byte-identical for equal plans).
std::string SerializePlanDeterministically(const v1::ExecutionPlan& plan);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PLAN_PLAN_BUILDER_H_
