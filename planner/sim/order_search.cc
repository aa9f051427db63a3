#include "planner/sim/order_search.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "planner/sim/weight_fill.h"

namespace varipipe::planner {

double PeakOverLimit(std::span<const double> peak_bytes, std::span<const double> limit_bytes) {
  double worst = 0;
  for (size_t d = 0; d < peak_bytes.size() && d < limit_bytes.size(); ++d) {
    worst = std::max(worst, peak_bytes[d] / limit_bytes[d]);
  }
  return worst;
}

absl::StatusOr<AdaptiveSearchResult> SearchAdaptiveOrder(
    const PipelineShape& shape, const StageCostTable& costs, std::span<const double> times_ms,
    double memory_limit_bytes, const ClusterNetwork& network, bool zero_bubble) {
  const std::vector<double> limits(shape.devices, memory_limit_bytes);
  return SearchAdaptiveOrder(shape, costs, times_ms, limits, network, zero_bubble);
}

absl::StatusOr<AdaptiveOrders> BuildAdaptiveOrders(const PipelineShape& shape,
                                                   const StageCostTable& costs,
                                                   std::span<const double> times_ms,
                                                   std::span<const double> memory_limit_bytes) {
  const uint32_t m = shape.micro_batches;
  if (times_ms.size() != m) {
    return absl::InvalidArgumentError("one predicted time per micro-batch is needed");
  }
  AdaptiveOrders out;
  std::vector<uint32_t> identity(m);
  std::iota(identity.begin(), identity.end(), 0u);
  out.injections.push_back(identity);
  const int k = m > 20 ? 3 : 4;
  if (m > 1) {
    const std::vector<int> labels = ClusterByValue(times_ms, k);
    const int used = *std::max_element(labels.begin(), labels.end()) + 1;
    std::vector<int> cluster_order(used);
    std::iota(cluster_order.begin(), cluster_order.end(), 0);
    do {
      std::vector<uint32_t> order;
      for (int cluster : cluster_order) {
        for (uint32_t mb = 0; mb < m; ++mb) {
          if (labels[mb] == cluster) order.push_back(mb);
        }
      }
      if (order != identity) out.injections.push_back(std::move(order));
    } while (std::next_permutation(cluster_order.begin(), cluster_order.end()));
  }
  for (const std::vector<uint32_t>& injection : out.injections) {
    absl::StatusOr<DeviceOrder> order =
        AdaptiveSchedule(shape, costs, injection, memory_limit_bytes);
    if (!order.ok()) return order.status();
    out.schedules.push_back(*std::move(order));
  }
  return out;
}

absl::StatusOr<AdaptiveSearchResult> SearchAdaptiveOrder(
    const PipelineShape& shape, const StageCostTable& costs, std::span<const double> times_ms,
    std::span<const double> memory_limit_bytes, const ClusterNetwork& network, bool zero_bubble) {
  absl::StatusOr<AdaptiveOrders> orders =
      BuildAdaptiveOrders(shape, costs, times_ms, memory_limit_bytes);
  if (!orders.ok()) return orders.status();
  return SearchAdaptiveOrder(shape, costs, *orders, memory_limit_bytes, network, zero_bubble);
}

absl::StatusOr<AdaptiveSearchResult> SearchAdaptiveOrder(
    const PipelineShape& shape, const StageCostTable& costs, const AdaptiveOrders& orders,
    std::span<const double> memory_limit_bytes, const ClusterNetwork& network, bool zero_bubble) {
  AdaptiveSearchResult best;
  bool have = false;
  for (size_t k = 0; k < orders.injections.size(); ++k) {
    // Once an order fits, another wins only with a smaller makespan: the
    // fill and the simulation give up on one that cannot have it.
    const double limit_ms = have && best.fits_memory ? best.simulation.makespan_ms
                                                     : std::numeric_limits<double>::infinity();
    DeviceOrder filled;
    if (zero_bubble) {
      absl::StatusOr<std::optional<DeviceOrder>> order = FillWeightGradientsWithin(
          shape, orders.schedules[k], costs, network, memory_limit_bytes, limit_ms);
      if (!order.ok()) return order.status();
      if (!order->has_value()) {
        ++best.orders_tried;
        continue;
      }
      filled = **std::move(order);
    }
    const DeviceOrder& order = zero_bubble ? filled : orders.schedules[k];
    SimulationResult sim = Simulate(shape, order, costs, network, limit_ms);
    if (sim.exceeded) {
      ++best.orders_tried;
      continue;
    }
    if (!sim.completed)
      return absl::InternalError(absl::StrCat("adaptive schedule: ", sim.deadlock));
    const double over = PeakOverLimit(sim.peak_bytes, memory_limit_bytes);
    const bool fits = over <= 1;
    ++best.orders_tried;
    const bool better =
        !have || (fits && !best.fits_memory) ||
        (fits == best.fits_memory &&
         (fits ? sim.makespan_ms < best.simulation.makespan_ms
               : over < PeakOverLimit(best.simulation.peak_bytes, memory_limit_bytes)));
    if (better) {
      const int tried = best.orders_tried;
      best = {orders.injections[k], order, std::move(sim), tried, fits};
      have = true;
    }
  }
  return best;
}

}  // namespace varipipe::planner
