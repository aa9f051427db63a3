// The small jobs the executor's equivalence tests run: a GPT (MEGATRON or
// LLAMA) or T5 (MEGATRON or T5V11) of a few
// layers (hidden 32, fp32) on synthetic data, and the planner's plans for
// one of its iterations.
#ifndef VARIPIPE_TESTS_TESTING_TINY_JOB_H_
#define VARIPIPE_TESTS_TESTING_TINY_JOB_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/sample_dataset.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

struct TinyJob {
  bool t5 = false;
  // A LLAMA GPT (docs/models.md): 2 key/value heads for 4 query heads,
  // Llama 3.1 rotary scaling whose three frequency bands all occur.
  bool llama = false;
  bool tie_word_embeddings = false;  // LLAMA
  // A T5V11 T5 (docs/models.md; needs `t5`): 32 relative position buckets up
  // to distance 64, so exact, log-spaced and (in the encoder) clipped buckets
  // all occur.
  bool t5v11 = false;
  v1::ScheduleKind schedule = v1::ONE_F_ONE_B;
  v1::RecomputeMode recompute = v1::RECOMPUTE_NONE;
  v1::PartitionMethod method = v1::DYNAMIC_PROGRAMMING;
  // model.packed_attention; UNSPECIFIED: the default (the faster kernel per
  // packed micro-batch).
  v1::PackedAttention packed_attention = v1::PACKED_ATTENTION_UNSPECIFIED;
  uint32_t pipeline = 1;
  uint32_t data = 1;
  uint32_t chunks = 1;  // parallelism.virtual_chunks (interleaved 1F1B)
  uint32_t tensor = 1;  // parallelism.tensor
  bool sequence_parallel = false;
  // parallelism.context and .context_split (GPT and LLAMA).
  uint32_t context = 1;
  v1::ContextSplitPolicy context_split = v1::PER_MICRO_BATCH;
  // parallelism.stage_layout LISTED (empty: EVEN): each stage's layers, T5's
  // first `encoder_stages` of them its encoder's. The model then has as
  // many layers as the layout lists.
  std::vector<uint32_t> stage_layers;
  uint32_t encoder_stages = 0;
  // AdamW (adam_epsilon 1e-6, see tiny_job.cc) or plain SGD at a constant
  // learning rate without clipping.
  v1::Optimizer optimizer = v1::ADAMW;
  uint64_t iterations = 10;
  uint32_t max_sequence_length = 96;        // data.max_sequence_length
  uint32_t tokens_per_global_batch = 1200;  // data.tokens_per_global_batch
  bool truncate_long_samples = false;       // planner.truncate_long_samples
  uint32_t memory_mib = 0;                  // 0: 4 MiB (8 for T5 without recomputation)
};

// The job's config with defaults applied and validated (InvalidArgument
// naming the field otherwise).
absl::StatusOr<v1::JobConfig> TinyJobConfig(const TinyJob& job);

// The planner's plans (one per rank) for `iteration` of `config`'s data.
// The config's memory limit is raised by a quarter while no plan fits
// (GPipe keeps every micro-batch; some schedules need more room): the
// smallest limit that plans gives the most micro-batches. The executor
// ignores the limit. `limit_mib`, when set, receives the limit used.
absl::StatusOr<std::vector<v1::ExecutionPlan>> PlanTinyIteration(const v1::JobConfig& config,
                                                                 uint64_t iteration,
                                                                 const SampleDataset& dataset,
                                                                 uint64_t* limit_mib = nullptr);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_TINY_JOB_H_
