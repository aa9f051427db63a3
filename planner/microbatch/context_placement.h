// Context parallelism (docs/microbatching.md, "Context parallelism"): how
// one context group of c lanes runs its replica's micro-batches. Each
// micro-batch is either split across every lane or whole on one lane; the
// group runs them as a sequence of slots that is the same on every lane:
// a slot is one split micro-batch, or up to c whole ones, at most one per
// lane. One schedule over the slots, projected onto each lane
// (planner/schedule/lane_projection.h), makes every lane run the split
// micro-batches' passes in the same relative order, which the split's
// collectives need (deadlock freedom).
//
// Everything here is deterministic: ties go to the lower micro-batch index
// and the lower lane.
#ifndef VARIPIPE_PLANNER_MICROBATCH_CONTEXT_PLACEMENT_H_
#define VARIPIPE_PLANNER_MICROBATCH_CONTEXT_PLACEMENT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

struct ContextSlot {
  // The split micro-batch of the slot; -1 for a slot of whole ones.
  int split = -1;
  // Slots of whole micro-batches: by_lane[k] is lane k's, or -1.
  std::vector<int> by_lane;

  // The micro-batch lane `lane` runs in this slot, or -1.
  int On(uint32_t lane) const {
    if (split >= 0) return split;
    return lane < by_lane.size() ? by_lane[lane] : -1;
  }
};

struct LanePlacement {
  uint32_t lanes = 1;
  std::vector<bool> split;     // per micro-batch
  std::vector<uint32_t> lane;  // per micro-batch: its lane (0 for split ones)
  std::vector<ContextSlot> slots;
  // Per lane: the predicted time of what it runs (every split micro-batch's
  // split time and its own whole ones' times).
  std::vector<double> lane_ms;

  uint32_t split_count() const;
  // The largest lane_ms: the group's work bound.
  double busiest_lane_ms() const;
};

// Places micro-batches whose split/whole choice is made: whole ones onto
// lanes by longest processing time first (each, longest first, to the lane
// with the least predicted time so far; every lane starts with the split
// ones' time), then the slots: every split micro-batch alone, and slot j
// of whole ones holding each lane's j-th whole micro-batch (in index
// order); split slots spread evenly among the whole ones (split slot i at
// (i + 1/2) / splits of the sequence, whole slot j at (j + 1/2) / wholes;
// a tie puts the split slot first). REQUIRES: lanes >= 1; the spans of
// equal size; times finite and non-negative.
LanePlacement PlaceOnLanes(std::span<const bool> split, std::span<const double> whole_ms,
                           std::span<const double> split_ms, uint32_t lanes);

// Per micro-batch what the choice needs: whether it fits one lane's memory
// whole and split, and its predicted time (every stage's forward and
// backward) each way.
struct SplitOption {
  bool fits_whole = true;
  bool fits_split = false;
  double whole_ms = 0;
  double split_ms = 0;
};

// The group's predicted time under `placement` on a pipeline of
// `pipeline` devices, as the micro-batching objective counts it: the
// busiest lane's work spread over the devices plus the fill and drain of
// the longest micro-batch (1F1B-like schedules), busiest / p + (p - 1) / p
// x the longest time of any micro-batch as it runs (split or whole).
double PredictedGroupMs(const LanePlacement& placement, std::span<const double> whole_ms,
                        std::span<const double> split_ms, uint32_t pipeline);

// The split/whole choice of a context group's micro-batches under
// `policy`: ALWAYS splits every one, NEVER none; PER_MICRO_BATCH splits
// those that fit only split, and then the k longest (by whole time) of the
// others that fit split, k chosen (the smallest on a tie) to minimise
// PredictedGroupMs of their placement (PlaceOnLanes): splitting evens the
// lanes' work and shortens the pipeline's fill and drain, at the cost of
// the split's communication. Fails (returns false) when a micro-batch fits
// neither way the policy allows; `why` then names its index.
bool ChooseSplits(v1::ContextSplitPolicy policy, std::span<const SplitOption> options,
                  uint32_t lanes, uint32_t pipeline, std::vector<bool>* split, std::string* why);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_CONTEXT_PLACEMENT_H_
