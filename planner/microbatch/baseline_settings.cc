#include "planner/microbatch/baseline_settings.h"

#include "absl/strings/str_cat.h"

namespace varipipe::planner {

std::string BaselineSetting::Describe() const {
  if (rows > 0) return absl::StrCat("rows=", rows);
  if (token_budget > 0) return absl::StrCat("tokens=", token_budget);
  if (packed_row_tokens > 0) return absl::StrCat("packed<=", packed_row_tokens);
  return "";
}

void BaselineSetting::ApplyTo(MicroBatchingOptions& options) const {
  if (rows > 0) options.fixed_micro_batch_size = rows;
  if (token_budget > 0) options.micro_batch_token_budget = token_budget;
  options.packed_row_tokens = packed_row_tokens;
}

std::vector<BaselineSetting> BaselineSettings(const v1::JobConfig& config, PartitionMethod method) {
  const v1::PlannerConfig& p = config.planner();
  std::vector<BaselineSetting> settings;
  switch (method) {
    case PartitionMethod::kDynamicProgramming:
      settings.push_back({});
      if (!p.has_dp_packed_rows() || p.dp_packed_rows()) {
        settings.push_back({.packed_row_tokens = config.data().max_sequence_length()});
      }
      break;
    case PartitionMethod::kTokenBased:
      if (p.micro_batch_token_budget() > 0) {
        settings.push_back({.token_budget = p.micro_batch_token_budget()});
      } else {
        for (uint32_t k : kTokenLadder) {
          settings.push_back({.token_budget = uint64_t{k} * config.data().max_sequence_length()});
        }
      }
      break;
    case PartitionMethod::kFixedSize:
    case PartitionMethod::kPadding:
    case PartitionMethod::kPacking:
      if (p.fixed_micro_batch_size() > 0) {
        settings.push_back({.rows = p.fixed_micro_batch_size()});
      } else {
        for (uint32_t rows : kRowLadder) settings.push_back({.rows = rows});
      }
      break;
  }
  return settings;
}

}  // namespace varipipe::planner
