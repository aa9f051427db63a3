// Which tokens of a sample the training loss covers, shared by the planner
// (ExecutionPlan.global_target_tokens, the loss normaliser) and the executors
// (the labels they build), so both count the same tokens.
//
// T5: every target token (the decoder predicts target j from targets < j).
// GPT: the sequence is input + target and position p predicts token p + 1.
//   With a target (supervised data) the loss covers the predictions of the
//   target tokens: tokens [max(input, 1), input + target). Without one (plain
//   language-model data) it covers every next-token prediction: tokens
//   [1, input).
#ifndef VARIPIPE_COMMON_DATASET_LOSS_TOKENS_H_
#define VARIPIPE_COMMON_DATASET_LOSS_TOKENS_H_

#include <algorithm>
#include <cstdint>

#include "common/dataset/synthetic_mixture.h"

namespace varipipe {

// First sequence position whose token the loss predicts, and one past the
// last (GPT: positions in input + target; T5: positions in the target).
struct LossSpan {
  uint32_t begin = 0;
  uint32_t end = 0;
  uint32_t size() const { return end > begin ? end - begin : 0; }
};

inline LossSpan LossTokenSpan(SampleLengths lengths, bool encoder_decoder) {
  if (encoder_decoder) return {0, lengths.target};
  if (lengths.target == 0) return {1, lengths.input};
  return {std::max<uint32_t>(lengths.input, 1), lengths.input + lengths.target};
}

inline uint64_t LossTokens(SampleLengths lengths, bool encoder_decoder) {
  return LossTokenSpan(lengths, encoder_decoder).size();
}

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_LOSS_TOKENS_H_
