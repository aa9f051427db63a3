#include "common/plan_contract/sample_placement.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace varipipe::plan_contract {
namespace {

using Counts = google::protobuf::RepeatedField<uint32_t>;

std::optional<ContractViolation> CheckPerSampleArrays(const v1::MicroBatch& mb) {
  const int n = mb.sample_ids_size();
  const std::pair<const char*, const Counts*> fields[] = {
      {"sample_input_lens", &mb.sample_input_lens()},
      {"sample_target_lens", &mb.sample_target_lens()},
      {"sample_input_offsets", &mb.sample_input_offsets()},
      {"sample_target_offsets", &mb.sample_target_offsets()}};
  for (const auto& [field, values] : fields) {
    if (values->size() != n) {
      return ContractViolation{
          -1, field,
          absl::StrCat("has ", values->size(), " entries for ", n, " samples (one per sample)")};
    }
  }
  return std::nullopt;
}

std::optional<ContractViolation> CheckRowStarts(const v1::MicroBatch& mb) {
  const Counts& starts = mb.row_starts();
  for (int r = 0; r < starts.size(); ++r) {
    const bool ordered = r == 0 ? starts[r] == 0 : starts[r] > starts[r - 1];
    if (!ordered || starts[r] >= static_cast<uint32_t>(mb.sample_ids_size())) {
      return ContractViolation{-1, absl::StrCat("row_starts[", r, "]"),
                               absl::StrCat("is ", starts[r], " (row starts rise from 0 below the ",
                                            mb.sample_ids_size(), " samples)")};
    }
  }
  return std::nullopt;
}

// A span of `length` tokens at `offset`, after `end` (the previous sample's
// end in the row) and within `padded`.
std::optional<ContractViolation> Place(const char* field, int i, uint32_t offset, uint64_t length,
                                       uint32_t padded, bool packed, uint64_t& end) {
  if ((!packed && offset != 0) || offset < end || offset + length > padded) {
    return ContractViolation{
        -1, absl::StrCat(field, "[", i, "]"),
        absl::StrCat("is ", offset, " for ", length, " tokens (",
                     packed ? "samples follow each other in a row" : "unpacked samples start at 0",
                     " within the padded length ", padded, ")")};
  }
  end = offset + length;
  return std::nullopt;
}

}  // namespace

std::optional<ContractViolation> PlaceSamples(const v1::MicroBatch& mb, bool encoder_decoder,
                                              std::vector<std::vector<SamplePlacement>>* rows) {
  if (auto violation = CheckPerSampleArrays(mb)) return violation;
  if (auto violation = CheckRowStarts(mb)) return violation;
  const bool t5 = encoder_decoder;
  const bool packed = !mb.row_starts().empty();
  if (rows != nullptr) rows->clear();
  int next_row = 0;
  uint64_t input_end = 0;
  uint64_t target_end = 0;
  for (int i = 0; i < mb.sample_ids_size(); ++i) {
    if (!packed ||
        (next_row < mb.row_starts_size() && mb.row_starts(next_row) == static_cast<uint32_t>(i))) {
      ++next_row;
      if (rows != nullptr) rows->emplace_back();
      input_end = 0;
      target_end = 0;
    }
    const SamplePlacement placed{.index = i,
                                 .sample_id = mb.sample_ids(i),
                                 .input_tokens = mb.sample_input_lens(i),
                                 .target_tokens = mb.sample_target_lens(i),
                                 .input_offset = mb.sample_input_offsets(i),
                                 .target_offset = mb.sample_target_offsets(i)};
    // GPT: one sequence, input then target.
    const uint64_t sequence =
        t5 ? placed.input_tokens : uint64_t{placed.input_tokens} + placed.target_tokens;
    if (sequence == 0 || (t5 && placed.target_tokens == 0)) {
      return ContractViolation{
          -1, absl::StrCat("sample_", sequence == 0 ? "input" : "target", "_lens[", i, "]"),
          "gives the sample no tokens"};
    }
    if (auto violation = Place("sample_input_offsets", i, placed.input_offset, sequence,
                               mb.input_len(), packed, input_end)) {
      return violation;
    }
    if (t5) {
      if (auto violation = Place("sample_target_offsets", i, placed.target_offset,
                                 placed.target_tokens, mb.target_len(), packed, target_end)) {
        return violation;
      }
    } else if (placed.target_offset != 0) {
      return ContractViolation{-1, absl::StrCat("sample_target_offsets[", i, "]"),
                               "must be 0 for GPT (the target is part of the sequence)"};
    }
    if (rows != nullptr) rows->back().push_back(placed);
  }
  return std::nullopt;
}

}  // namespace varipipe::plan_contract
