// Turns a plan's micro-batch (sample ids and padded lengths) into tensors:
// the real lengths of its rows, which every stage needs for its attention
// masks (read from the dataset's index), and the padded token ids and labels
// of LoadInput instructions, which only the stages that embed or compute the
// loss read. Each sample's lengths and its offset in its row come from the
// plan (MicroBatch.sample_input_lens ...; the planner's truncation, by the
// data limits or to fit memory), never re-derived here: a sample feeds the
// prefixes of its input and target of those lengths; the loss covers the
// tokens of LossTokenSpan of those lengths.
//
// A micro-batch split across a context group (MicroBatch.context.split,
// common/plan_contract/context_parallel_split.h) gives each lane one row of
// input_len = all_gather_count positions: the lane's local tokens of the
// samples' sequences packed back to back, then padding; each local token's
// label is the one the whole micro-batch gives its position (the sample's
// next token, or ignored at the sample's end and at unlabelled positions),
// padding's is ignored.
#ifndef VARIPIPE_EXECUTOR_DATA_MICRO_BATCH_LOADER_H_
#define VARIPIPE_EXECUTOR_DATA_MICRO_BATCH_LOADER_H_

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/plan_contract/context_parallel_split.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::executor {

// Label value of positions the loss ignores.
inline constexpr int64_t kIgnoredLabel = -1;

// What the attention masks and position embeddings of a micro-batch need.
// Unpacked micro-batches (one sample per row) give the real lengths only.
// Packed ones (several samples per row, back to back, MicroBatch.row_starts)
// also give, per position, the sample it belongs to within its row (0, 1,
// ...; -1 for padding) and its position inside that sample (restarting at 0
// for every sample; 0 for padding), for the input rows and (T5) the target
// rows; a sample's encoder and decoder segments carry the same number.
struct RowLengths {
  torch::Tensor input;   // int64 [b]: GPT sequence (input + target) / T5 input, per row
  torch::Tensor target;  // int64 [b]: T5 target; undefined for GPT
  torch::Tensor input_segments;    // packed: int64 [b, input_len]
  torch::Tensor input_positions;   // packed: int64 [b, input_len]
  torch::Tensor target_segments;   // packed T5: int64 [b, target_len]
  torch::Tensor target_positions;  // packed T5: int64 [b, target_len]
  // The positions the loss covers (the LABELS tensor's entries >= 0), as
  // flat indices into [b, padded] (GPT: input_len, T5: target_len),
  // ascending: int64 [labelled tokens]. From the plan's lengths alone
  // (LossTokenSpan), so the head gathers its rows without reading the
  // labels back from the device.
  torch::Tensor labelled_positions;
  // A split micro-batch (MicroBatch.context.split): this lane's split; the
  // row is [1, all_gather_count] and `input` holds the local token count.
  // Null otherwise.
  std::shared_ptr<const ContextParallelSplit> context_split;
};

// The lane of a context group that runs a plan (ExecutionPlan.context_parallel
// and .context_rank): which part of a split micro-batch it loads.
struct ContextLane {
  int group_size = 1;
  int index = 0;
  static ContextLane Of(const v1::ExecutionPlan& plan) {
    return {.group_size = static_cast<int>(std::max(1u, plan.context_parallel())),
            .index = static_cast<int>(plan.context_rank())};
  }
};

class MicroBatchLoader {
 public:
  // `dataset` must outlive the loader. `sampler` carries the maximum lengths
  // and the model kind.
  MicroBatchLoader(const SampleDataset* dataset, const SamplerOptions& sampler)
      : dataset_(dataset), sampler_(sampler) {}

  // FailedPrecondition when a row does not fit the micro-batch's padded
  // lengths (a plan made for other data or other maxima).
  absl::StatusOr<RowLengths> Lengths(const v1::MicroBatch& micro_batch,
                                     const ContextLane& lane = {}) const;

  // The tensor of one LoadInput buffer, shaped by `spec` ([b, padded] INT64).
  // In a packed row every sample's tokens, decoder inputs (shifted right
  // behind a start token, per sample) and labels (the sample's own loss
  // tokens; never a prediction across two samples) follow the previous
  // sample's. Errors name the micro-batch and the sample.
  absl::StatusOr<torch::Tensor> Load(const v1::MicroBatch& micro_batch,
                                     v1::LoadInput::Content content, const v1::TensorSpec& spec,
                                     const ContextLane& lane = {}) const;

 private:
  // One sample of a row: its id, the plan's lengths and where its input
  // (GPT: sequence) and target start in the row.
  struct Placed {
    uint64_t id = 0;
    SampleLengths lengths;
    uint32_t input_offset = 0;
    uint32_t target_offset = 0;
  };
  // The rows of a micro-batch (one sample each when unpacked): the plan
  // contract's PlaceSamples, with every sample within the dataset and its
  // real lengths.
  absl::StatusOr<std::vector<std::vector<Placed>>> Rows(const v1::MicroBatch& micro_batch) const;
  // A split micro-batch's samples (every one within the dataset and its
  // real lengths) and this lane's split of their sequences, whose
  // all_gather_count must be the micro-batch's input_len.
  struct Split {
    std::vector<Placed> samples;
    std::shared_ptr<const ContextParallelSplit> split;
  };
  absl::StatusOr<Split> SplitOf(const v1::MicroBatch& micro_batch, const ContextLane& lane) const;
  absl::StatusOr<RowLengths> SplitLengths(const v1::MicroBatch& micro_batch,
                                          const ContextLane& lane) const;
  absl::StatusOr<torch::Tensor> SplitLoad(const v1::MicroBatch& micro_batch,
                                          v1::LoadInput::Content content,
                                          const v1::TensorSpec& spec,
                                          const ContextLane& lane) const;

  const SampleDataset* dataset_;
  SamplerOptions sampler_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_DATA_MICRO_BATCH_LOADER_H_
