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

absl::StatusOr<MicroBatchLoader::Split> MicroBatchLoader::SplitOf(const v1::MicroBatch& micro_batch,
                                                                  const ContextLane& lane) const {
  const std::string name = absl::StrCat("micro-batch ", micro_batch.id());
  if (sampler_.encoder_decoder) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": a T5 micro-batch cannot be split across a context group"));
  }
  if (lane.group_size <= 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": context.split is set but the plan's context_parallel is ", lane.group_size));
  }
  const int n = micro_batch.sample_ids_size();
  if (micro_batch.sample_input_lens_size() != n || micro_batch.sample_target_lens_size() != n) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": sample_input_lens and sample_target_lens need one entry per sample"));
  }
  Split out;
  std::vector<int64_t> lengths;
  for (int i = 0; i < n; ++i) {
    const uint64_t id = micro_batch.sample_ids(i);
    if (id >= dataset_->size()) {
      return absl::OutOfRangeError(absl::StrCat(name, ": sample ", id, " is beyond the ",
                                                dataset_->size(), " samples of ",
                                                dataset_->Describe()));
    }
    const SampleLengths real = dataset_->Lengths(id);
    const SampleLengths planned{micro_batch.sample_input_lens(i),
                                micro_batch.sample_target_lens(i)};
    if (planned.input > real.input || planned.target > real.target) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, ": sample_input_lens[", i, "]/sample_target_lens[", i, "] give sample ", id, " ",
          planned.input, " input and ", planned.target, " target tokens but it has only ",
          real.input, " and ", real.target, "; was the plan made for this dataset?"));
    }
    out.samples.push_back(Placed{id, planned, 0, 0});
    lengths.push_back(static_cast<int64_t>(planned.input) + planned.target);
  }
  absl::StatusOr<ContextParallelSplit> split =
      ContextParallelSplit::Of(lengths, lane.group_size, lane.index);
  if (!split.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": ", split.status().message()));
  }
  if (split->all_gather_count() != static_cast<int64_t>(micro_batch.input_len())) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": input_len is ", micro_batch.input_len(), " but the split over ", lane.group_size,
        " lanes gives ", split->all_gather_count(), " positions per lane (all_gather_count)"));
  }
  out.split = std::make_shared<const ContextParallelSplit>(*std::move(split));
  return out;
}

// Local token u of the split is position p of sample s; under GPT's rule its
// label is the sample's token p + 1 when that token is a loss token.
absl::StatusOr<RowLengths> MicroBatchLoader::SplitLengths(const v1::MicroBatch& micro_batch,
                                                          const ContextLane& lane) const {
  VP_ASSIGN_OR_RETURN(const Split split, SplitOf(micro_batch, lane));
  RowLengths lengths;
  lengths.input = torch::full({1}, split.split->local_count(), torch::kInt64);
  std::vector<int64_t> labelled;
  int64_t u = 0;
  for (const ContextParallelSplit::Chunk& chunk : split.split->chunks()) {
    const LossSpan span =
        LossTokenSpan(split.samples[chunk.sample].lengths, /*encoder_decoder=*/false);
    for (int64_t p = chunk.begin; p < chunk.end; ++p, ++u) {
      if (p + 1 >= span.begin && p + 1 < span.end) labelled.push_back(u);
    }
  }
  lengths.labelled_positions = torch::tensor(labelled, torch::kInt64);
  lengths.context_split = split.split;
  return lengths;
}

absl::StatusOr<torch::Tensor> MicroBatchLoader::SplitLoad(const v1::MicroBatch& micro_batch,
                                                          v1::LoadInput::Content content,
                                                          const v1::TensorSpec& spec,
                                                          const ContextLane& lane) const {
  VP_ASSIGN_OR_RETURN(const Split split, SplitOf(micro_batch, lane));
  const int64_t padded = micro_batch.input_len();
  if (spec.dims_size() != 2 || spec.dims(0) != 1 || spec.dims(1) != padded ||
      spec.dtype() != v1::INT64) {
    return absl::FailedPreconditionError(absl::StrCat(
        "micro-batch ", micro_batch.id(), ": LoadInput ", v1::LoadInput::Content_Name(content),
        " of a split micro-batch expects an INT64 [1, ", padded, "] tensor but the plan says ",
        spec.ShortDebugString()));
  }
  if (content != v1::LoadInput::INPUT_TOKENS && content != v1::LoadInput::LABELS) {
    return absl::FailedPreconditionError(absl::StrCat(
        "micro-batch ", micro_batch.id(), ": LoadInput ", v1::LoadInput::Content_Name(content),
        " in a split micro-batch (INPUT_TOKENS or LABELS)"));
  }
  const bool labels = content == v1::LoadInput::LABELS;
  torch::Tensor tensor = torch::full({1, padded}, labels ? kIgnoredLabel : 0, torch::kInt64);
  auto out = tensor.accessor<int64_t, 2>();
  std::vector<int64_t> input;
  std::vector<int64_t> target;
  int64_t read = -1;  // the sample whose sequence `input` holds
  int64_t u = 0;
  for (const ContextParallelSplit::Chunk& chunk : split.split->chunks()) {
    const Placed& p = split.samples[chunk.sample];
    if (read != chunk.sample) {
      VP_RETURN_IF_ERROR(dataset_->ReadSample(p.id, &input, &target));
      input.resize(p.lengths.input);
      target.resize(p.lengths.target);
      input.insert(input.end(), target.begin(), target.end());  // GPT: input ++ target
      read = chunk.sample;
    }
    const LossSpan span = LossTokenSpan(p.lengths, /*encoder_decoder=*/false);
    for (int64_t q = chunk.begin; q < chunk.end; ++q, ++u) {
      if (!labels) {
        out[0][u] = input[q];
      } else if (q + 1 >= span.begin && q + 1 < span.end) {
        out[0][u] = input[q + 1];
      }
    }
  }
  return tensor;
}

absl::StatusOr<RowLengths> MicroBatchLoader::Lengths(const v1::MicroBatch& micro_batch,
                                                     const ContextLane& lane) const {
  if (micro_batch.context().split()) return SplitLengths(micro_batch, lane);
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
                                                     const v1::TensorSpec& spec,
                                                     const ContextLane& lane) const {
  if (micro_batch.context().split()) return SplitLoad(micro_batch, content, spec, lane);
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
