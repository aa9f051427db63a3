#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_SAMPLE_PLACEMENT_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_SAMPLE_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/plan_contract/contract_violation.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::plan_contract {

// Where one sample of a micro-batch goes: its row of the tensors and its
// token spans in that row. GPT samples are one sequence (input then
// target) from input_offset; T5 samples have an encoder span at
// input_offset and a decoder span at target_offset.
struct SamplePlacement {
  int index = 0;  // in the micro-batch's per-sample arrays
  uint64_t sample_id = 0;
  uint32_t input_tokens = 0;   // sample_input_lens
  uint32_t target_tokens = 0;  // sample_target_lens
  uint32_t input_offset = 0;
  uint32_t target_offset = 0;
};

// The samples of a micro-batch by row (MicroBatchRows rows), as the plan
// format lays them out (docs/plan_format.md, "Micro-batches"):
// - sample_input_lens, sample_target_lens, sample_input_offsets and
//   sample_target_offsets have one entry per sample;
// - row_starts, when set (packed rows), rise from 0 below the sample count;
//   row r holds samples [row_starts[r], row_starts[r + 1]); unpacked, one
//   sample per row;
// - every sample has tokens (T5: input and target), lies inside the padded
//   lengths (input_len, target_len) and after the previous sample of its
//   row; unpacked samples start at 0; GPT target offsets are 0.
// Whether a sample's lengths are within its real lengths is the data
// loader's check (it reads the dataset). On a violation, its field is
// relative to the micro-batch (e.g. "sample_input_offsets[3]"). `rows` may
// be null (only the check).
std::optional<ContractViolation> PlaceSamples(
    const v1::MicroBatch& micro_batch, bool encoder_decoder,
    std::vector<std::vector<SamplePlacement>>* rows = nullptr);

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_SAMPLE_PLACEMENT_H_
