#include "planner/microbatch/padding_stats.h"

namespace varipipe::planner {
namespace {

double Ratio(uint64_t real, uint64_t computed) {
  return computed == 0 ? 1.0 : static_cast<double>(real) / static_cast<double>(computed);
}

}  // namespace

double PaddingStats::Efficiency() const {
  return Ratio(real_input_tokens + real_target_tokens,
               computed_input_tokens + computed_target_tokens);
}
double PaddingStats::InputEfficiency() const {
  return Ratio(real_input_tokens, computed_input_tokens);
}
double PaddingStats::TargetEfficiency() const {
  return Ratio(real_target_tokens, computed_target_tokens);
}

PaddingStats ComputePaddingStats(std::span<const SampleLengths> samples,
                                 std::span<const MicroBatchGroup> groups,
                                 const LengthPolicy& policy) {
  PaddingStats stats;
  for (const MicroBatchGroup& group : groups) {
    stats.computed_input_tokens += group.size() * group.input_len;
    stats.computed_target_tokens += group.size() * group.target_len;
    for (uint32_t index : group.samples) {
      stats.real_input_tokens += SequenceLength(samples[index], policy);
      if (policy.encoder_decoder) stats.real_target_tokens += samples[index].target;
    }
  }
  return stats;
}

}  // namespace varipipe::planner
