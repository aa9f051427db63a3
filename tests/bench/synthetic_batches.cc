#include "tests/bench/synthetic_batches.h"

#include <algorithm>

#include "common/dataset/synthetic_mixture.h"

namespace varipipe::planner {

std::vector<MiniBatch> SyntheticBatches(const v1::JobConfig& c, bool documents, int count) {
  const bool t5 = c.model().kind() == v1::T5;
  const uint32_t max_len = c.data().max_sequence_length();
  const uint32_t max_target = t5 ? c.data().max_target_length() : max_len;
  const SyntheticMixture mixture =
      documents ? SyntheticMixture::Documents(2024) : SyntheticMixture::Flan(2024);
  std::vector<MiniBatch> batches;
  uint64_t index = 0;
  for (int b = 0; b < count; ++b) {
    MiniBatch mb;
    mb.iteration = b;
    uint64_t tokens = 0;
    while (true) {
      SampleLengths s = mixture.Sample(index);
      if (t5) {
        s = {std::min(s.input, max_len), std::min(s.target, max_target)};
      } else {
        s.target = std::min(s.target, max_len);
        s.input = std::min(s.input, max_len - s.target);
      }
      if (tokens + s.input + s.target > c.data().tokens_per_global_batch()) break;
      tokens += s.input + s.target;
      mb.sample_ids.push_back(index++);
      mb.lengths.push_back(s);
    }
    batches.push_back(std::move(mb));
  }
  return batches;
}

}  // namespace varipipe::planner
