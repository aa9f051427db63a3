#include "executor/data/micro_batch_loader.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dataset/loss_tokens.h"
#include "common/plan_contract/sample_placement.h"
#include "common/status.h"

namespace varipipe::executor {

absl::StatusOr<std::vector<std::vector<MicroBatchLoader::Placed>>> MicroBatchLoader::Rows(
    const v1::MicroBatch& micro_batch) const {
  const std::string name = absl::StrCat("micro-batch ", micro_batch.id());
  // The rows and spans as the plan contract lays them out (the plan check
  // refused plans that break it; this names the field for plans fed
  // directly).
  std::vector<std::vector<plan_contract::SamplePlacement>> placements;
  if (const auto violation =
          plan_contract::PlaceSamples(micro_batch, sampler_.encoder_decoder, &placements)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": ", violation->Describe(), "; was the plan made by this planner?"));
  }
  std::vector<std::vector<Placed>> rows(placements.size());
  for (size_t r = 0; r < placements.size(); ++r) {
    for (const plan_contract::SamplePlacement& p : placements[r]) {
      if (p.sample_id >= dataset_->size()) {
        return absl::OutOfRangeError(absl::StrCat(name, ": sample ", p.sample_id, " is beyond the ",
                                                  dataset_->size(), " samples of ",
                                                  dataset_->Describe()));
      }
      // The plan's lengths and offsets, never re-derived: a plan may shorten
      // a sample (truncation keeps prefixes) but never lengthen it.
      const SampleLengths real = dataset_->Lengths(p.sample_id);
      const SampleLengths planned{p.input_tokens, p.target_tokens};
      if (planned.input > real.input || planned.target > real.target) {
        return absl::FailedPreconditionError(
            absl::StrCat(name, ": sample_input_lens[", p.index, "]/sample_target_lens[", p.index,
                         "] give sample ", p.sample_id, " ", planned.input, " input and ",
                         planned.target, " target tokens but it has only ", real.input, " and ",
                         real.target, "; was the plan made for this dataset?"));
      }
      rows[r].push_back(Placed{p.sample_id, planned, p.input_offset, p.target_offset});
    }
  }
  return rows;
}

absl::StatusOr<RowLengths> MicroBatchLoader::Lengths(const v1::MicroBatch& micro_batch) const {
  VP_ASSIGN_OR_RETURN(const std::vector<std::vector<Placed>> rows, Rows(micro_batch));
  const bool t5 = sampler_.encoder_decoder;
  const bool packed = micro_batch.row_starts_size() > 0;
  const int64_t b = static_cast<int64_t>(rows.size());
  RowLengths lengths;
  lengths.input = torch::zeros({b}, torch::kInt64);
  if (t5) lengths.target = torch::zeros({b}, torch::kInt64);
  if (packed) {
    lengths.input_segments = torch::full({b, micro_batch.input_len()}, -1, torch::kInt64);
    lengths.input_positions = torch::zeros({b, micro_batch.input_len()}, torch::kInt64);
    if (t5) {
      lengths.target_segments = torch::full({b, micro_batch.target_len()}, -1, torch::kInt64);
      lengths.target_positions = torch::zeros({b, micro_batch.target_len()}, torch::kInt64);
    }
  }
  auto input = lengths.input.accessor<int64_t, 1>();
  // Labels are [b, padded]: position p - 1 (GPT) or p (T5) of a sample
  // predicts its token p (as Load's LABELS).
  const int64_t label_width = t5 ? micro_batch.target_len() : micro_batch.input_len();
  std::vector<int64_t> labelled;
  for (int64_t r = 0; r < b; ++r) {
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const Placed& p = rows[r][k];
      const uint32_t sequence = t5 ? p.lengths.input : p.lengths.input + p.lengths.target;
      input[r] += sequence;
      if (t5) lengths.target.accessor<int64_t, 1>()[r] += p.lengths.target;
      const LossSpan span = LossTokenSpan(p.lengths, t5);
      const int64_t first = r * label_width + (t5 ? static_cast<int64_t>(p.target_offset)
                                                  : static_cast<int64_t>(p.input_offset) - 1);
      for (uint32_t q = span.begin; q < span.end; ++q) labelled.push_back(first + q);
      if (!packed) continue;
      // Segment k of the row, positions restarting at 0.
      const auto fill = [&](torch::Tensor& segments, torch::Tensor& positions, uint32_t offset,
                            uint32_t count) {
        const int64_t begin = offset;
        const int64_t end = begin + count;
        segments[r].slice(0, begin, end).fill_(static_cast<int64_t>(k));
        positions[r].slice(0, begin, end).copy_(
            torch::arange(static_cast<int64_t>(count), torch::kInt64));
      };
      fill(lengths.input_segments, lengths.input_positions, p.input_offset, sequence);
      if (t5) fill(lengths.target_segments, lengths.target_positions, p.target_offset,
                   p.lengths.target);
    }
  }
  // Samples follow each other in a row, rows in order: ascending.
  lengths.labelled_positions = torch::tensor(labelled, torch::kInt64);
  return lengths;
}

absl::StatusOr<torch::Tensor> MicroBatchLoader::Load(const v1::MicroBatch& micro_batch,
                                                     v1::LoadInput::Content content,
                                                     const v1::TensorSpec& spec) const {
  VP_ASSIGN_OR_RETURN(const std::vector<std::vector<Placed>> rows, Rows(micro_batch));
  const int64_t b = static_cast<int64_t>(rows.size());
  const bool t5 = sampler_.encoder_decoder;
  const int64_t padded = (content == v1::LoadInput::INPUT_TOKENS) ? micro_batch.input_len()
                         : t5                                     ? micro_batch.target_len()
                                                                  : micro_batch.input_len();
  if (spec.dims_size() != 2 || spec.dims(0) != b || spec.dims(1) != padded ||
      spec.dtype() != v1::INT64) {
    return absl::FailedPreconditionError(absl::StrCat(
        "micro-batch ", micro_batch.id(), ": LoadInput ", v1::LoadInput::Content_Name(content),
        " expects an INT64 [", b, ", ", padded, "] tensor but the plan says ",
        spec.ShortDebugString()));
  }
  if (content == v1::LoadInput::DECODER_INPUT_TOKENS && !t5) {
    return absl::FailedPreconditionError("DECODER_INPUT_TOKENS in a plan for a decoder-only model");
  }
  const int64_t fill = content == v1::LoadInput::LABELS ? kIgnoredLabel : 0;
  torch::Tensor tensor = torch::full({b, padded}, fill, torch::kInt64);
  auto out = tensor.accessor<int64_t, 2>();
  std::vector<int64_t> input;
  std::vector<int64_t> target;
  for (int64_t r = 0; r < b; ++r) {
    for (const Placed& p : rows[r]) {
      VP_RETURN_IF_ERROR(dataset_->ReadSample(p.id, &input, &target));
      input.resize(p.lengths.input);
      target.resize(p.lengths.target);
      // GPT: the sequence is input ++ target.
      std::vector<int64_t> sequence = input;
      if (!t5) sequence.insert(sequence.end(), target.begin(), target.end());
      const int64_t in = p.input_offset;   // where the sample's sequence starts in the row
      const int64_t tg = p.target_offset;  // T5: where its target starts
      switch (content) {
        case v1::LoadInput::INPUT_TOKENS:
          for (size_t j = 0; j < sequence.size(); ++j) {
            out[r][in + static_cast<int64_t>(j)] = sequence[j];
          }
          break;
        case v1::LoadInput::DECODER_INPUT_TOKENS:
          // The sample's targets shifted right behind a start token (id 0).
          for (size_t j = 0; j + 1 < target.size(); ++j) {
            out[r][tg + static_cast<int64_t>(j) + 1] = target[j];
          }
          break;
        case v1::LoadInput::LABELS: {
          // Position p - 1 (GPT) or p (T5) of the sample predicts its token p.
          const LossSpan span = LossTokenSpan(p.lengths, t5);
          for (uint32_t q = span.begin; q < span.end; ++q) {
            if (t5) {
              out[r][tg + q] = target[q];
            } else {
              out[r][in + q - 1] = sequence[q];
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
  }
  return tensor;
}

}  // namespace varipipe::executor
