// A discrete-event simulator of one pipeline iteration (one data-parallel
// replica).
//
// Each device has one compute stream that runs its ops strictly in the
// schedule's order (a wait-free replay: an op starts as soon as the device is
// free and its input has arrived). Each ordered device pair has one
// communication channel per direction; transfers on a channel run one at a
// time, in the order their producing ops finished, and take
// latency + bytes / bandwidth (intra- or inter-node link).
//
// Dependencies: F(s, m) needs F(s - 1, m)'s activation; B(s, m) needs
// F(s, m) and B(s + 1, m)'s gradient (the last stage: its own F, the loss);
// W(s, m) needs B(s, m). B sends the input gradient in both forms.
// Durations: F forward_ms; B backward_ms, or input_grad_ms() when the order
// has a W for the same (stage, micro-batch) (op.h); W weight_ms.
// Memory per device: an op's stored activation is allocated when its forward
// starts and freed when its backward ends; with a W, B's end frees all but
// weight_stored_bytes (what W needs), freed when the W ends. While an F or
// B runs the device holds everything stored plus that op's transient
// (peak - stored), and a split B also what it keeps beyond its forward's
// stored bytes (split_backward_extra_bytes, stage_costs.h); a W adds none.
// Beside these, the transfer buffers the communication plan keeps alive
// (an activation sent until the sender's backward of it, an input gradient
// sent until the end of the iteration, a received tensor until its consumer
// starts); peaks come from their sum over time (memory_ledger.h).
//
// An order that cannot complete (a cycle of waits) is reported as a
// deadlock naming each stuck device's next op.
#ifndef VARIPIPE_PLANNER_SIM_SIMULATOR_H_
#define VARIPIPE_PLANNER_SIM_SIMULATOR_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "planner/cost/link.h"
#include "planner/schedule/op.h"
#include "planner/schedule/stage_costs.h"

namespace varipipe::planner {

// Where the pipeline's devices sit: device d is global device
// first_device + d * stride (stride c t: one lane of a context group of c,
// each plan rank t tensor ranks wide, common/config/rank_layout.h);
// devices_per_node consecutive global devices share a node.
struct ClusterNetwork {
  uint32_t devices_per_node = 8;
  uint32_t first_device = 0;
  Link intra_node;
  Link inter_node;
  uint32_t stride = 1;
  const Link& Between(uint32_t a, uint32_t b) const {
    return (first_device + a * stride) / devices_per_node ==
                   (first_device + b * stride) / devices_per_node
               ? intra_node
               : inter_node;
  }
};

struct TimedOp {
  Op op;
  uint32_t device = 0;
  double start_ms = 0;
  double end_ms = 0;
};

struct TimedTransfer {
  Op producer;  // the op whose output travels
  uint32_t from = 0;
  uint32_t to = 0;
  double bytes = 0;
  double start_ms = 0;
  double end_ms = 0;
};

struct SimulationResult {
  bool completed = false;
  std::string deadlock;  // set when !completed and !exceeded
  // Stopped early: the makespan is sure to exceed the caller's limit
  // (Simulate's makespan_limit_ms); nothing else is filled in.
  bool exceeded = false;
  double makespan_ms = 0;
  std::vector<double> busy_ms;           // per device
  std::vector<double> bubble_fraction;   // per device: 1 - busy / makespan
  std::vector<double> peak_bytes;        // per device
  std::vector<uint32_t> peak_in_flight;  // per device: most forwards awaiting their backward
                                         // (with a W: their W)
  std::vector<TimedOp> ops;              // in order of start time
  std::vector<TimedTransfer> transfers;  // in order of creation

  double MaxPeakBytes() const;
  double MeanBubbleFraction() const;
};

// REQUIRES: order has shape.devices lists over stages < shape.stages() and
// micro-batches < shape.micro_batches, each forward and backward exactly
// once and each W at most once on the stage's device (validate with
// CheckScheduleCoverage);
// costs[stage][micro_batch] for every stage and micro-batch.
// `makespan_limit_ms`: stop (`exceeded`) as soon as some device's end is
// sure to lie above it: its clock plus the durations of its ops still to
// run exceeds makespan_limit_ms * (1 + 1e-9) (the margin absorbs rounding,
// so an order whose makespan is within the limit always completes).
SimulationResult Simulate(const PipelineShape& shape, const DeviceOrder& order,
                          const StageCostTable& costs, const ClusterNetwork& network,
                          double makespan_limit_ms = std::numeric_limits<double>::infinity());

// Context parallelism: the c lanes of one context group's pipeline
// (docs/microbatching.md, "Context parallelism"). Every lane is a pipeline
// of shape.devices devices over the group's micro-batches (ids dense over
// the group, shape.micro_batches of them); a lane's order holds only the
// micro-batches it runs: the split ones, which every lane's order holds,
// and its own whole ones. Each lane is replayed as Simulate replays one
// pipeline (its transfers stay within the lane, on its own channels), except
// that a split micro-batch's forward or backward on a stage (its
// attention's all-gather or reduce-scatter) runs on every lane's device of
// that stage together: it starts at the latest of their own start times
// (each lane's device free and its input there) and lasts each lane's cost.
// A split micro-batch's W is each lane's own.
struct LanePipelines {
  PipelineShape shape;
  std::vector<DeviceOrder> orders;       // per lane
  std::vector<StageCostTable> costs;     // per lane: [stage][micro-batch of the group]
  std::vector<bool> split;               // per micro-batch of the group
  std::vector<ClusterNetwork> networks;  // per lane (one: every lane's)
};

struct LaneSimulationResult {
  bool completed = false;
  bool exceeded = false;
  std::string deadlock;    // names the lane and device of every stuck op
  double makespan_ms = 0;  // the slowest lane's
  // Per lane: its timeline (ops and transfers on its devices 0 ..
  // shape.devices - 1), busy time, bubbles (against the group's makespan)
  // and activation peaks.
  std::vector<SimulationResult> lanes;
};

// REQUIRES: one order and one cost table per lane; each lane's order runs
// forward and backward of each of its micro-batches once on every stage;
// a split micro-batch is on every lane. `makespan_limit_ms` as Simulate's.
// With one lane and no split micro-batch, lanes[0] equals Simulate's result.
LaneSimulationResult SimulateLanes(
    const LanePipelines& lanes, double makespan_limit_ms = std::numeric_limits<double>::infinity());

// The relative margin by which a device's certain end must exceed a
// makespan limit before a search gives up on an order (Simulate,
// FillWeightGradientsWithin).
inline constexpr double kMakespanLimitMargin = 1e-9;

// OK ("") when `order` runs every forward and backward of every (stage,
// micro-batch) exactly once and any W at most once, on the stage's device;
// otherwise names the first problem.
std::string CheckScheduleCoverage(const PipelineShape& shape, const DeviceOrder& order);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SIM_SIMULATOR_H_
