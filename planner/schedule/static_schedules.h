// The static pipeline schedules: fixed orders that do not look at
// micro-batch costs.
//
//   GPipe              every forward, then every backward (Huang et al.)
//   1F1B               Megatron's non-interleaved schedule with a flush per
//                      iteration: device d warms up with min(p - d - 1, m)
//                      forwards, then alternates one forward and one
//                      backward, then drains the backwards
//                      (Narayanan et al. 2021, "PipeDream-Flush")
//   interleaved 1F1B   Megatron's schedule for v chunks per device: the
//                      forwards of a device visit micro-batches in rounds of
//                      p, each round through chunks 0..v-1 (backwards:
//                      v-1..0); warm-up (v - 1) * p + 2 * (p - d - 1),
//                      capped; any number of micro-batches (built for the
//                      next multiple of p, padding micro-batches dropped)
//   kFkB               Ada-Grouper's schedule: 1F1B over groups of k
//                      micro-batches (k forwards, then k backwards); k = 1
//                      is 1F1B
//
// Each returns, per device, the order of its ops (op.h). The orders are
// deadlock-free under in-order execution (tests/planner/schedule_test.cc
// simulates every schedule over a grid of shapes).
#ifndef VARIPIPE_PLANNER_SCHEDULE_STATIC_SCHEDULES_H_
#define VARIPIPE_PLANNER_SCHEDULE_STATIC_SCHEDULES_H_

#include "absl/status/statusor.h"
#include "planner/schedule/op.h"

namespace varipipe::planner {

// REQUIRES (all): devices >= 1, micro_batches >= 1. GPipe accepts chunks >= 1
// (stage order within a device); 1F1B and kFkB need chunks == 1.
absl::StatusOr<DeviceOrder> GpipeSchedule(const PipelineShape& shape);
absl::StatusOr<DeviceOrder> OneFOneBSchedule(const PipelineShape& shape);
absl::StatusOr<DeviceOrder> InterleavedOneFOneBSchedule(const PipelineShape& shape);
absl::StatusOr<DeviceOrder> KfkbSchedule(const PipelineShape& shape, uint32_t k);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_STATIC_SCHEDULES_H_
