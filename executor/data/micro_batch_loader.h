// Turns a plan's micro-batch (sample ids and padded lengths) into tensors:
// the real lengths of its rows, which every stage needs for its attention
// masks (read from the dataset's index), and the padded token ids and labels
// of LoadInput instructions, which only the stages that embed or compute the
// loss read. Samples are truncated exactly as the planner's sampler truncates
// them (TruncateSample), keeping prefixes; the loss covers the tokens of
// LossTokenSpan.
#ifndef VARIPIPE_EXECUTOR_DATA_MICRO_BATCH_LOADER_H_
#define VARIPIPE_EXECUTOR_DATA_MICRO_BATCH_LOADER_H_

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::executor {

// Label value of positions the loss ignores.
inline constexpr int64_t kIgnoredLabel = -1;

struct RowLengths {
  torch::Tensor input;   // int64 [b]: GPT sequence (input + target) / T5 input
  torch::Tensor target;  // int64 [b]: T5 target; undefined for GPT
};

class MicroBatchLoader {
 public:
  // `dataset` must outlive the loader. `sampler` carries the maximum lengths
  // and the model kind.
  MicroBatchLoader(const SampleDataset* dataset, const SamplerOptions& sampler)
      : dataset_(dataset), sampler_(sampler) {}

  // FailedPrecondition when a row does not fit the micro-batch's padded
  // lengths (a plan made for other data or other maxima); Unimplemented for
  // packed micro-batches (several samples per row).
  absl::StatusOr<RowLengths> Lengths(const v1::MicroBatch& micro_batch) const;

  // The tensor of one LoadInput buffer, shaped by `spec` ([b, padded] INT64).
  // Errors name the micro-batch and the sample.
  absl::StatusOr<torch::Tensor> Load(const v1::MicroBatch& micro_batch,
                                     v1::LoadInput::Content content,
                                     const v1::TensorSpec& spec) const;

 private:
  const SampleDataset* dataset_;
  SamplerOptions sampler_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_DATA_MICRO_BATCH_LOADER_H_
