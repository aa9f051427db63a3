// Baseline partition methods: simple ways of grouping a mini-batch's samples
// into micro-batches, for comparison with the dynamic program and as user
// options (config.proto PartitionMethod).
//
// Invariants of every function here: each sample of the mini-batch appears in
// exactly one group; groups are non-empty; padded lengths are the rounded
// maxima of their samples (PadToLongest), never past the policy's limits.
#ifndef VARIPIPE_PLANNER_MICROBATCH_BASELINES_H_
#define VARIPIPE_PLANNER_MICROBATCH_BASELINES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "planner/microbatch/micro_batch.h"

namespace varipipe::planner {

// PADDING: consecutive runs of `micro_batch_size` samples in the mini-batch's
// own order, each padded to its longest sample. REQUIRES: micro_batch_size >= 1.
std::vector<MicroBatchGroup> PartitionPadding(std::span<const SampleLengths> samples,
                                              const LengthPolicy& policy,
                                              uint32_t micro_batch_size);

// FIXED_SIZE: like PADDING over the samples sorted by length (longest
// sequence first, ties by target then position), so neighbours have similar
// lengths. REQUIRES: micro_batch_size >= 1.
std::vector<MicroBatchGroup> PartitionFixedSize(std::span<const SampleLengths> samples,
                                                const LengthPolicy& policy,
                                                uint32_t micro_batch_size);

// TOKEN_BASED: walks the sorted order and starts a new micro-batch whenever
// adding the next sample would make the padded micro-batch compute more than
// `token_budget` tokens. A sample larger than the budget gets a micro-batch
// of its own. REQUIRES: token_budget >= 1.
std::vector<MicroBatchGroup> PartitionTokenBased(std::span<const SampleLengths> samples,
                                                 const LengthPolicy& policy, uint64_t token_budget);

// PACKING: first-fit decreasing of the samples into sequences of the
// maximum lengths (decoder-only: max_input tokens per sequence;
// encoder-decoder: max_input input and max_target target tokens), then
// `sequences_per_micro_batch` packed sequences per micro-batch. Every row is
// padded to the maximum lengths: attention runs over the whole packed
// sequence, as in the packing baselines DynaPipe compares against.
// REQUIRES: sequences_per_micro_batch >= 1; every sample within the maxima;
// the maxima within the policy's limits.
std::vector<MicroBatchGroup> PartitionPacking(std::span<const SampleLengths> samples,
                                              const LengthPolicy& policy, uint32_t max_input,
                                              uint32_t max_target,
                                              uint32_t sequences_per_micro_batch);

// First-fit decreasing of the samples (in SortedByLength order) into rows
// of at most `max_input` sequence tokens (GPT: input + target) and, for
// encoder-decoder models, `max_target` target tokens: the positions of each
// row's samples, in row order. A sample over a maximum gets a row of its
// own. The packing step of PartitionPacking and of the dynamic program's
// packed rows (MicroBatchingOptions::packed_row_tokens).
std::vector<std::vector<uint32_t>> PackRows(std::span<const SampleLengths> samples,
                                            const LengthPolicy& policy, uint32_t max_input,
                                            uint32_t max_target);

// Positions 0..n-1 sorted by decreasing sequence length, then decreasing
// target length, then position. Deterministic.
std::vector<uint32_t> SortedByLength(std::span<const SampleLengths> samples,
                                     const LengthPolicy& policy);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_BASELINES_H_
