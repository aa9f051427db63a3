#include "common/plan_contract/micro_batch_rows.h"

namespace varipipe::plan_contract {

uint64_t MicroBatchRows(const v1::MicroBatch& micro_batch) {
  return micro_batch.row_starts().empty() ? static_cast<uint64_t>(micro_batch.sample_ids_size())
                                          : static_cast<uint64_t>(micro_batch.row_starts_size());
}

uint64_t PaddedTokens(const v1::MicroBatch& micro_batch) {
  return MicroBatchRows(micro_batch) *
         (uint64_t{micro_batch.input_len()} + uint64_t{micro_batch.target_len()});
}

}  // namespace varipipe::plan_contract
