#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_MICRO_BATCH_ROWS_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_MICRO_BATCH_ROWS_H_

#include <cstdint>

#include "varipipe/v1/plan.pb.h"

namespace varipipe::plan_contract {

// Rows of a micro-batch's tensors (their first dimension): one per sample,
// or one per packed row when row_starts is set (several samples share a
// row; docs/plan_format.md, "Packed rows").
uint64_t MicroBatchRows(const v1::MicroBatch& micro_batch);

// Tokens the micro-batch computes, padding included:
// rows x (input_len + target_len).
uint64_t PaddedTokens(const v1::MicroBatch& micro_batch);

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_MICRO_BATCH_ROWS_H_
