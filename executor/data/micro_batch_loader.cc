#include "executor/data/micro_batch_loader.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dataset/loss_tokens.h"
#include "common/status.h"

namespace varipipe::executor {
namespace {

absl::Status CheckUnpacked(const v1::MicroBatch& micro_batch) {
  if (micro_batch.row_starts_size() == 0) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "micro-batch ", micro_batch.id(),
      " is packed (several samples per row); the executor runs only unpacked micro-batches: "
      "plan with another partition method"));
}

}  // namespace

absl::StatusOr<RowLengths> MicroBatchLoader::Lengths(const v1::MicroBatch& micro_batch) const {
  VP_RETURN_IF_ERROR(CheckUnpacked(micro_batch));
  const int64_t rows = micro_batch.sample_ids_size();
  RowLengths lengths;
  lengths.input = torch::empty({rows}, torch::kInt64);
  if (sampler_.encoder_decoder) lengths.target = torch::empty({rows}, torch::kInt64);
  auto input = lengths.input.accessor<int64_t, 1>();
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t id = micro_batch.sample_ids(static_cast<int>(r));
    if (id >= dataset_->size()) {
      return absl::OutOfRangeError(absl::StrCat("micro-batch ", micro_batch.id(), ": sample ", id,
                                                " is beyond the ", dataset_->size(), " samples of ",
                                                dataset_->Describe()));
    }
    const SampleLengths s = TruncateSample(dataset_->Lengths(id), sampler_);
    const uint32_t sequence = sampler_.encoder_decoder ? s.input : s.input + s.target;
    if (sequence == 0 || sequence > micro_batch.input_len() ||
        (sampler_.encoder_decoder && (s.target == 0 || s.target > micro_batch.target_len()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "micro-batch ", micro_batch.id(), ": sample ", id, " (", s.input, " input and ",
          s.target, " target tokens) does not fit the planned padded lengths ",
          micro_batch.input_len(), "/", micro_batch.target_len(),
          "; was the plan made for this dataset and these maximum lengths?"));
    }
    input[r] = sequence;
    if (sampler_.encoder_decoder) lengths.target[r] = static_cast<int64_t>(s.target);
  }
  return lengths;
}

absl::StatusOr<torch::Tensor> MicroBatchLoader::Load(const v1::MicroBatch& micro_batch,
                                                     v1::LoadInput::Content content,
                                                     const v1::TensorSpec& spec) const {
  VP_RETURN_IF_ERROR(CheckUnpacked(micro_batch));
  const int64_t rows = micro_batch.sample_ids_size();
  const bool t5 = sampler_.encoder_decoder;
  const int64_t padded = (content == v1::LoadInput::INPUT_TOKENS) ? micro_batch.input_len()
                         : t5                                     ? micro_batch.target_len()
                                                                  : micro_batch.input_len();
  if (spec.dims_size() != 2 || spec.dims(0) != rows || spec.dims(1) != padded ||
      spec.dtype() != v1::INT64) {
    return absl::FailedPreconditionError(absl::StrCat(
        "micro-batch ", micro_batch.id(), ": LoadInput ", v1::LoadInput::Content_Name(content),
        " expects an INT64 [", rows, ", ", padded, "] tensor but the plan says ",
        spec.ShortDebugString()));
  }
  if (content == v1::LoadInput::DECODER_INPUT_TOKENS && !t5) {
    return absl::FailedPreconditionError("DECODER_INPUT_TOKENS in a plan for a decoder-only model");
  }
  const int64_t fill = content == v1::LoadInput::LABELS ? kIgnoredLabel : 0;
  torch::Tensor tensor = torch::full({rows, padded}, fill, torch::kInt64);
  auto out = tensor.accessor<int64_t, 2>();
  std::vector<int64_t> input;
  std::vector<int64_t> target;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t id = micro_batch.sample_ids(static_cast<int>(r));
    if (id >= dataset_->size()) {
      return absl::OutOfRangeError(absl::StrCat("micro-batch ", micro_batch.id(), ": sample ", id,
                                                " is beyond the dataset"));
    }
    VP_RETURN_IF_ERROR(dataset_->ReadSample(id, &input, &target));
    const SampleLengths s = TruncateSample(
        {static_cast<uint32_t>(input.size()), static_cast<uint32_t>(target.size())}, sampler_);
    input.resize(s.input);
    target.resize(s.target);
    // GPT: the sequence is input ++ target.
    std::vector<int64_t> sequence = input;
    if (!t5) sequence.insert(sequence.end(), target.begin(), target.end());
    const int64_t limit = t5 && content != v1::LoadInput::INPUT_TOKENS
                              ? static_cast<int64_t>(target.size())
                              : static_cast<int64_t>(sequence.size());
    if (limit > padded) {
      return absl::FailedPreconditionError(absl::StrCat("micro-batch ", micro_batch.id(),
                                                        ": sample ", id, " has ", limit,
                                                        " tokens, more than the padded ", padded));
    }
    switch (content) {
      case v1::LoadInput::INPUT_TOKENS:
        for (size_t j = 0; j < sequence.size(); ++j) out[r][static_cast<int64_t>(j)] = sequence[j];
        break;
      case v1::LoadInput::DECODER_INPUT_TOKENS:
        // Targets shifted right behind a start token (id 0).
        for (size_t j = 0; j + 1 < target.size(); ++j) {
          out[r][static_cast<int64_t>(j + 1)] = target[j];
        }
        break;
      case v1::LoadInput::LABELS: {
        // Position p - 1 (GPT) or p (T5) predicts token p of the span.
        const LossSpan span = LossTokenSpan(s, t5);
        for (uint32_t p = span.begin; p < span.end; ++p) {
          if (t5) {
            out[r][p] = target[p];
          } else {
            out[r][p - 1] = sequence[p];
          }
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("micro-batch ", micro_batch.id(),
                                                       ": LoadInput with unknown content ",
                                                       static_cast<int>(content)));
    }
  }
  return tensor;
}

}  // namespace varipipe::executor
