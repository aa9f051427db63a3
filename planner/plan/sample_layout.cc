#include "planner/plan/sample_layout.h"

namespace varipipe::planner {

void LayOutSamples(const MicroBatchGroup& group, std::span<const uint64_t> sample_ids,
                   std::span<const SampleLengths> samples, const LengthPolicy& policy,
                   PlannedMicroBatch& planned) {
  size_t next_row = 0;
  uint32_t input_offset = 0;
  uint32_t target_offset = 0;
  for (size_t i = 0; i < group.samples.size(); ++i) {
    const uint32_t position = group.samples[i];
    planned.sample_ids.push_back(sample_ids[position]);
    const SampleLengths& s = samples[position];
    if (group.row_starts.empty() ||
        (next_row < group.row_starts.size() && group.row_starts[next_row] == i)) {
      ++next_row;
      input_offset = 0;
      target_offset = 0;
    }
    planned.input_lens.push_back(s.input);
    planned.target_lens.push_back(s.target);
    planned.input_offsets.push_back(input_offset);
    planned.target_offsets.push_back(target_offset);
    // GPT: the whole sequence is input (target_len is 0).
    input_offset += SequenceLength(s, policy);
    if (policy.encoder_decoder) target_offset += s.target;
    planned.real_input_tokens += SequenceLength(s, policy);
    if (policy.encoder_decoder) planned.real_target_tokens += s.target;
  }
  planned.input_len = group.input_len;
  planned.target_len = group.target_len;
  planned.row_starts = group.row_starts;
}

}  // namespace varipipe::planner
