#include "planner/cost/update_costs.h"

#include <algorithm>

#include "common/config/rank_layout.h"
#include "planner/cost/hardware.h"

namespace varipipe::planner {
namespace {

// Gradients are all-reduced in fp32 (the executor's AllReduceMean).
constexpr double kGradientBytesPerParameter = 4;
// AdamW reads and writes the fp32 parameter, its gradient and two moments;
// plain SGD the parameter and gradient (bytes per parameter, both ways).
constexpr double kAdamBytesPerParameter = 32;
constexpr double kSgdBytesPerParameter = 12;
// Launching the optimizer's kernels over a stage's parameters.
constexpr double kOptimizerFixedMs = 0.05;

// The gradient group of pipeline device `d` (every data-parallel replica's
// and context lane's copy of its stages: RankLayout::DataParallelGroup)
// spans nodes when its first and last global ranks sit on different ones.
bool SpansNodes(const v1::JobConfig& c, uint32_t d) {
  const uint32_t per_node = std::max(1u, c.cluster().devices_per_node());
  const RankLayout ranks = RankLayout::Of(c.parallelism());
  const int first = ranks.GlobalRank(ranks.Rank(0, d, 0), 0);
  const int last =
      ranks.GlobalRank(ranks.Rank(ranks.data - 1, d, ranks.context - 1), ranks.tensor - 1);
  return static_cast<uint32_t>(first) / per_node != static_cast<uint32_t>(last) / per_node;
}

}  // namespace

double RingAllReduceMs(double bytes, uint32_t ranks, const Link& link) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return 2 * (n - 1) * link.latency_ms +
         (link.bytes_per_ms > 0 ? 2 * (n - 1) / n * bytes / link.bytes_per_ms : 0);
}

double MeasuredAllReduceMs(const CommunicationCosts& measured, double bytes, uint32_t ranks) {
  if (ranks <= 1) return 0;
  const double r = std::max(2u, measured.all_reduce_ranks);
  const double n = ranks;
  const double latency = measured.all_reduce.latency_ms * (n - 1) / (r - 1);
  const double transfer =
      measured.all_reduce.bytes_per_ms > 0
          ? bytes / measured.all_reduce.bytes_per_ms * ((n - 1) / n) / ((r - 1) / r)
          : 0;
  return latency + transfer;
}

std::vector<DeviceUpdateCost> DeviceUpdateCosts(const CostModel& model, const StageLayout& layout,
                                                const v1::JobConfig& config) {
  const std::vector<double> parameters = ParametersPerDevice(model, layout);
  // Gradients are reduced over data x context ranks together (context
  // lanes hold the same layers); ZeRO-1 shards over the same group.
  const uint32_t dp =
      std::max(1u, config.parallelism().data()) * std::max(1u, config.parallelism().context());
  const absl::StatusOr<Hardware> hardware = HardwarePreset(config.cluster().hardware());
  const bool sgd = config.training().optimizer() == v1::SGD;
  std::vector<DeviceUpdateCost> out(parameters.size());
  for (size_t d = 0; d < parameters.size(); ++d) {
    const double bytes = kGradientBytesPerParameter * parameters[d];
    if (model.communication().has_value()) {
      out[d].all_reduce_ms = MeasuredAllReduceMs(*model.communication(), bytes, dp);
    } else {
      const bool inter = SpansNodes(config, static_cast<uint32_t>(d));
      const Link link{(inter ? config.cluster().inter_node_latency_us()
                             : config.cluster().intra_node_latency_us()) /
                          1e3,
                      (inter ? config.cluster().inter_node_bandwidth_gbps()
                             : config.cluster().intra_node_bandwidth_gbps()) *
                          1e6};
      out[d].all_reduce_ms = RingAllReduceMs(bytes, dp, link);
    }
    // ZeRO stage 1: a ring reduce-scatter plus all-gather moves what the
    // ring all-reduce moves, but the optimizer updates only this rank's
    // 1/(data x context) shard of the parameters.
    const double updated = config.training().zero_stage() >= 1 ? parameters[d] / dp : parameters[d];
    if (model.optimizer().has_value()) {
      out[d].optimizer_ms = model.optimizer()->Ms(updated);
    } else if (hardware.ok() && hardware->memory_bandwidth_gbps > 0) {
      const double per_parameter = sgd ? kSgdBytesPerParameter : kAdamBytesPerParameter;
      out[d].optimizer_ms =
          kOptimizerFixedMs + per_parameter * updated / (hardware->memory_bandwidth_gbps * 1e6);
    }
  }
  return out;
}

}  // namespace varipipe::planner
