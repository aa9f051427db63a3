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
//   ZB-H1              Qi et al.'s zero-bubble schedule with 1F1B's memory:
//                      1F1B's forwards and split backwards (B: input
//                      gradient only), device d running W(k - d) after
//                      B(k) and its last d Ws after its last B. The W
//                      deferred on later devices fill the drain's bubbles;
//                      device d holds at most p - d micro-batches' stored
//                      activations plus d of W-kept bytes, never more than
//                      device 0's p (1F1B's peak). With t_F, t_B, t_W the
//                      op times and no communication the iteration takes
//                      m (t_F + t_B + t_W) + (p - 1)(t_F + t_B - t_W),
//                      against 1F1B's (m + p - 1)(t_F + t_B + t_W).
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
// REQUIRES: chunks == 1.
absl::StatusOr<DeviceOrder> ZeroBubbleH1Schedule(const PipelineShape& shape);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_STATIC_SCHEDULES_H_
