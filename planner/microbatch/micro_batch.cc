#include "planner/microbatch/micro_batch.h"

#include <algorithm>

namespace varipipe::planner {

void PadToLongest(std::span<const SampleLengths> samples, const LengthPolicy& policy,
                  MicroBatchGroup& group) {
  uint32_t longest_input = 0;
  uint32_t longest_target = 0;
  for (uint32_t index : group.samples) {
    longest_input = std::max(longest_input, SequenceLength(samples[index], policy));
    longest_target = std::max(longest_target, samples[index].target);
  }
  group.input_len = PaddedInputLength(longest_input, policy);
  group.target_len = PaddedTargetLength(longest_target, policy);
}

}  // namespace varipipe::planner
