// Lowering a micro-batch group (positions into the mini-batch) into the
// plan's per-sample layout: what the executor feeds, in the layout the plan
// contract defines (common/plan_contract/sample_placement.h).
#ifndef VARIPIPE_PLANNER_PLAN_SAMPLE_LAYOUT_H_
#define VARIPIPE_PLANNER_PLAN_SAMPLE_LAYOUT_H_

#include <cstdint>
#include <span>

#include "common/dataset/sample_dataset.h"
#include "planner/microbatch/micro_batch.h"
#include "planner/plan/plan_builder.h"

namespace varipipe::planner {

// Fills `planned`'s samples from `group`: dataset ids (sample_ids[position]),
// the lengths after truncation (samples[position]), each sample's offsets in
// its row (packed rows start at group.row_starts and hold their samples back
// to back; unpacked, every sample starts a row at 0), the padded lengths,
// the row starts and the real token counts.
void LayOutSamples(const MicroBatchGroup& group, std::span<const uint64_t> sample_ids,
                   std::span<const SampleLengths> samples, const LengthPolicy& policy,
                   PlannedMicroBatch& planned);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PLAN_SAMPLE_LAYOUT_H_
