// The planner's micro-batch: a group of samples of one mini-batch, padded to
// common lengths. Every partition method (the dynamic program and the
// baselines) produces these; the plan builder turns them into
// varipipe.v1.MicroBatch messages.
#ifndef VARIPIPE_PLANNER_MICROBATCH_MICRO_BATCH_H_
#define VARIPIPE_PLANNER_MICROBATCH_MICRO_BATCH_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/dataset/loss_tokens.h"
#include "common/dataset/synthetic_mixture.h"

namespace varipipe::planner {

// How sample lengths become padded tensor lengths.
struct LengthPolicy {
  // Encoder-decoder models pad inputs and targets separately; decoder-only
  // models train on input + target as one sequence.
  bool encoder_decoder = false;
  // Padded lengths are rounded up to a multiple of this (>= 1), but never
  // past the limits below.
  uint32_t multiple = 8;
  // The job's limits (data.max_sequence_length; T5 also
  // data.max_target_length): the longest input (decoder-only: sequence) and
  // target a padded micro-batch may have. 0: no limit. Samples are within
  // them (PlanMicroBatches rejects or truncates longer ones), so a padded
  // length within a limit still holds every sample.
  uint32_t max_input = 0;
  uint32_t max_target = 0;
};

struct MicroBatchGroup {
  // Positions of the samples in the mini-batch, in row order.
  std::vector<uint32_t> samples;
  // Packed micro-batches only (PACKING): row r holds samples
  // [row_starts[r], row_starts[r + 1]) concatenated. Empty: one sample per
  // row.
  std::vector<uint32_t> row_starts;
  // Padded lengths. Decoder-only: input_len is the sequence, target_len 0.
  uint32_t input_len = 0;
  uint32_t target_len = 0;

  // Rows of the micro-batch's tensors (its micro-batch size b).
  uint64_t size() const { return row_starts.empty() ? samples.size() : row_starts.size(); }
  // Tokens the micro-batch computes on, padding included.
  uint64_t ComputedTokens() const { return size() * (uint64_t{input_len} + target_len); }
};

// The labelled tokens of `group`, the positions its loss head runs on:
// sum over its samples of LossTokens (GPT supervised: the targets; T5: every
// target token). MicroBatchCostModel::Evaluate prices the head on these.
inline uint64_t LabelledTokens(const MicroBatchGroup& group, std::span<const SampleLengths> samples,
                               bool encoder_decoder) {
  uint64_t n = 0;
  for (uint32_t position : group.samples) n += LossTokens(samples[position], encoder_decoder);
  return n;
}

// Rounds `length` up to a multiple of `multiple` (>= 1).
inline uint32_t RoundUpLength(uint32_t length, uint32_t multiple) {
  return static_cast<uint32_t>((uint64_t{length} + multiple - 1) / multiple * multiple);
}

// `length` rounded up to `multiple`, capped at `limit` (0: none), never
// below `length`: min(RoundUpLength(length, multiple), limit) for a length
// within its limit. Every padded length of a plan comes from here.
inline uint32_t PadLength(uint32_t length, uint32_t multiple, uint32_t limit) {
  const uint32_t rounded = RoundUpLength(length, multiple);
  return limit == 0 ? rounded : std::max(length, std::min(rounded, limit));
}

// The unpadded length of a sample's (first) sequence under `policy`.
inline uint32_t SequenceLength(const SampleLengths& s, const LengthPolicy& policy) {
  return policy.encoder_decoder ? s.input : s.input + s.target;
}

// Padded input (decoder-only: sequence) length of a sequence of `length`
// tokens under `policy`: at most policy.max_input when `length` is.
inline uint32_t PaddedInputLength(uint32_t length, const LengthPolicy& policy) {
  return PadLength(length, policy.multiple, policy.max_input);
}

// Padded target length of a target of `length` tokens under `policy`; 0
// for decoder-only models (their targets are part of the sequence).
inline uint32_t PaddedTargetLength(uint32_t length, const LengthPolicy& policy) {
  return policy.encoder_decoder ? PadLength(length, policy.multiple, policy.max_target) : 0;
}

// Sets input_len and target_len of `group` to the padded maxima of its
// samples. REQUIRES: every index in group.samples is valid for `samples`.
void PadToLongest(std::span<const SampleLengths> samples, const LengthPolicy& policy,
                  MicroBatchGroup& group);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_MICRO_BATCH_H_
