// The order in which the dynamic program sees a mini-batch's samples
// (DynaPipe section 4, "Determine the order of samples"): it partitions
// consecutive runs, so neighbours should have similar lengths.
//
//   kLengthSort  decoder-only: by sequence length; encoder-decoder:
//                lexicographic (input, then target). Longest first.
//   kTwoDTour    encoder-decoder: samples as 2-D points (input, target)
//                grouped into cells of `cell` tokens; a tour over the cells
//                by nearest neighbour from the longest, improved by 2-opt
//                (L1 distance, open path); samples are emitted cell by cell,
//                longest first within a cell. Decoder-only falls back to
//                kLengthSort.
//
// Deterministic: equal inputs give equal orders (ties break by position).
#ifndef VARIPIPE_PLANNER_MICROBATCH_SAMPLE_ORDER_H_
#define VARIPIPE_PLANNER_MICROBATCH_SAMPLE_ORDER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "planner/microbatch/micro_batch.h"

namespace varipipe::planner {

enum class SampleOrder { kLengthSort, kTwoDTour };

// Positions 0..n-1 of `samples` in the chosen order.
std::vector<uint32_t> OrderSamples(std::span<const SampleLengths> samples,
                                   const LengthPolicy& policy, SampleOrder order,
                                   uint32_t cell = 16);

// Sum of L1 distances between consecutive samples of `order` (input and
// target lengths): the quantity the 2-D tour shortens.
uint64_t OrderPathLength(std::span<const SampleLengths> samples, std::span<const uint32_t> order);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_SAMPLE_ORDER_H_
