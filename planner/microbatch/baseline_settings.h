// The settings of a baseline partition method that one plan searches: the
// configured one, or, when the config leaves it at 0 (the default), a ladder
// the planner tunes per mini-batch (issue "the best plan by default": a
// baseline run with its best setting for the mini-batch, not one guess).
//   FIXED_SIZE, PADDING: samples per micro-batch 1, 2, 4, ..., 64
//   PACKING:             packed rows per micro-batch 1, 2, 4, ..., 64
//   TOKEN_BASED:         1, 2, 4, ..., 32 x data.max_sequence_length tokens
//   DYNAMIC_PROGRAMMING: it chooses its own sizes; over the samples, and
//                        (planner.dp_packed_rows, the default) over rows
//                        packed up to data.max_sequence_length tokens
// The ladders are those varipipe-evaluate tunes its per-run baselines over
// (planner/tools/baseline_tuning.h), so a plan is never behind a tuned
// baseline's setting for the same mini-batch.
#ifndef VARIPIPE_PLANNER_MICROBATCH_BASELINE_SETTINGS_H_
#define VARIPIPE_PLANNER_MICROBATCH_BASELINE_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner/microbatch/micro_batching.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

struct BaselineSetting {
  uint32_t rows = 0;          // FIXED_SIZE, PADDING, PACKING
  uint64_t token_budget = 0;  // TOKEN_BASED
  // DYNAMIC_PROGRAMMING over rows packed up to this many tokens (0: over
  // the samples).
  uint32_t packed_row_tokens = 0;
  // "rows=8", "tokens=8192", "packed<=2048", or "" for the DP over samples.
  std::string Describe() const;
  // `options` with this setting applied.
  void ApplyTo(MicroBatchingOptions& options) const;
};

// Rows of the ladders above, in increasing order.
inline constexpr uint32_t kRowLadder[] = {1, 2, 4, 8, 16, 32, 64};
// Token budgets in multiples of data.max_sequence_length.
inline constexpr uint32_t kTokenLadder[] = {1, 2, 4, 8, 16, 32};

// The settings of `method` under a validated config (defaults applied), in
// increasing size.
std::vector<BaselineSetting> BaselineSettings(const v1::JobConfig& config, PartitionMethod method);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_BASELINE_SETTINGS_H_
