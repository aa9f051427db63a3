// Choosing a job's (tensor, context, pipeline, data) layout for a number of
// GPUs: every factorisation of the GPUs (the context degree c in {1, 2, 4,
// 8}; 1 only for T5) is checked against the model and the cluster, planned
// on a sample of the job's mini-batches with the job's own planner (cost
// model, memory limit, schedules, recompute modes), and ranked by predicted
// real tokens per second (varipipe-plan --search-parallelism;
// docs/planner-cli.md). A layout with c > 1 is planned with the
// per-micro-batch choice (context_split PER_MICRO_BATCH) and, beside it,
// with static context parallelism (ALWAYS: every micro-batch split), whose
// result it reports as the static alternative.
//
// A layout is refused, with its reason, when
//   - its tensor group would span nodes (tensor above cluster.devices_per_node:
//     every layer's all-reduces would cross the inter-node link; Megatron's
//     PTD-P rule of thumb keeps tensor parallelism within a node),
//   - its context group (c x tensor consecutive GPUs) would span nodes (every
//     layer's key/value all-gather would cross the inter-node link, which
//     the split costs do not price),
//   - the config refuses it (the degree must divide the heads, key/value
//     heads and MLP width; no more stages than layers; ...),
//   - or no plan fits the device memory for some sampled mini-batch (the
//     planner's reason: model state alone, or every candidate's peak).
#ifndef VARIPIPE_PLANNER_TOOLS_PARALLELISM_SEARCH_H_
#define VARIPIPE_PLANNER_TOOLS_PARALLELISM_SEARCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/planner.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

struct ParallelismLayout {
  uint32_t tensor = 1;
  uint32_t pipeline = 1;
  uint32_t data = 1;
  uint32_t context = 1;
  std::string ToString() const;  // "t8 p4 d2"; "t1 c4 p4 d1" with context
};

struct ParallelismCandidate {
  ParallelismLayout layout;
  bool feasible = false;
  std::string reason;  // why it was refused; empty when feasible
  // Means over the sampled mini-batches (feasible layouts only).
  double iteration_ms = 0;
  double tokens_per_second = 0;  // real tokens of the mini-batch / iteration
  double bubble_fraction = 0;
  double peak_activation_bytes = 0;  // the largest rank's predicted peak
  // The most common choice over the sample.
  std::string schedule;
  std::string recompute;
  // Context > 1: micro-batches split across the context group, and of all
  // (summed over the sample); and the same layout under static context
  // parallelism (every micro-batch split).
  int split_micro_batches = 0;
  int micro_batches = 0;
  bool static_feasible = false;
  std::string static_reason;  // why static context parallelism does not fit
  double static_tokens_per_second = 0;
};

struct ParallelismSearchOptions {
  uint32_t gpus = 0;
  // Consecutive ranks per node (cluster.devices_per_node when 0).
  uint32_t gpus_per_node = 0;
  // With sequence parallelism wherever tensor > 1 and context is 1 (the
  // two do not run together).
  bool sequence_parallel = true;
  // Context degrees to try (those the model allows; T5: 1 only).
  std::vector<uint32_t> context_degrees = {1, 2, 4, 8};
  // Called after each layout, for progress output.
  std::function<void(const ParallelismCandidate&)> progress;
};

// Every (tensor, context, pipeline, data) with their product = gpus,
// evaluated on `sample` (mini-batches of `base`'s
// data; the global mini-batch does not depend on the layout). Feasible
// layouts first, fastest first; then the refused ones. InvalidArgument when
// gpus is 0.
absl::StatusOr<std::vector<ParallelismCandidate>> SearchParallelism(
    const v1::JobConfig& base, const std::vector<MiniBatch>& sample,
    const ParallelismSearchOptions& options);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_TOOLS_PARALLELISM_SEARCH_H_
