// The work of an iteration after its pipeline: each device's data-parallel
// gradient all-reduce and optimizer step. Executors run both after their
// last backward pass, so the predicted iteration is the pipeline makespan
// plus the slowest device's update (docs/cost-model.md, "The iteration").
//
// Sources, in order: the cost model's measured costs (varipipe-profile:
// CommunicationCosts, OptimizerCosts), else analytic estimates from the
// config's links and the hardware preset's memory bandwidth.
#ifndef VARIPIPE_PLANNER_COST_UPDATE_COSTS_H_
#define VARIPIPE_PLANNER_COST_UPDATE_COSTS_H_

#include <vector>

#include "planner/cost/cost_model.h"
#include "planner/cost/memory_model.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

struct DeviceUpdateCost {
  double all_reduce_ms = 0;  // 0 without data parallelism
  double optimizer_ms = 0;
  double total_ms() const { return all_reduce_ms + optimizer_ms; }
};

// Ring all-reduce of `bytes` over `ranks` ranks on `link`: 2 (n - 1) steps,
// each moving bytes / n (Patarasuk and Yuan 2009).
double RingAllReduceMs(double bytes, uint32_t ranks, const Link& link);

// A measured all-reduce fit t = a + n / B over R ranks, carried over to
// `ranks` ranks under the ring model: latency scales with (n - 1), the
// bandwidth term with (n - 1) / n.
double MeasuredAllReduceMs(const CommunicationCosts& measured, double bytes, uint32_t ranks);

// Per pipeline device (0..layout.devices-1) of a validated config: the
// all-reduce of its fp32 gradients over the gradient group of data x
// context ranks (with training.zero_stage 1: the reduce-scatter and
// all-gather, the same ring volume) and its optimizer step (stage 1: over
// its 1/(data x context) shard), uncalibrated.
std::vector<DeviceUpdateCost> DeviceUpdateCosts(const CostModel& model, const StageLayout& layout,
                                                const v1::JobConfig& config);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_UPDATE_COSTS_H_
