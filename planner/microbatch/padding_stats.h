// Padding statistics of a partition (DynaPipe section 8: "padding
// efficiency" = real tokens / computed tokens).
#ifndef VARIPIPE_PLANNER_MICROBATCH_PADDING_STATS_H_
#define VARIPIPE_PLANNER_MICROBATCH_PADDING_STATS_H_

#include <cstdint>
#include <span>

#include "planner/microbatch/micro_batch.h"

namespace varipipe::planner {

struct PaddingStats {
  uint64_t real_input_tokens = 0;   // decoder-only: whole sequences
  uint64_t real_target_tokens = 0;  // encoder-decoder only
  uint64_t computed_input_tokens = 0;
  uint64_t computed_target_tokens = 0;

  // Real / computed tokens over both sides; 1 when nothing is computed.
  double Efficiency() const;
  double InputEfficiency() const;
  double TargetEfficiency() const;
};

PaddingStats ComputePaddingStats(std::span<const SampleLengths> samples,
                                 std::span<const MicroBatchGroup> groups,
                                 const LengthPolicy& policy);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_PADDING_STATS_H_
