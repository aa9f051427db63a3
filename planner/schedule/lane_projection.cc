#include "planner/schedule/lane_projection.h"

#include <algorithm>

namespace varipipe::planner {

DeviceOrder ProjectOntoLane(const DeviceOrder& slot_order, std::span<const ContextSlot> slots,
                            uint32_t lane) {
  DeviceOrder out(slot_order.size());
  for (size_t d = 0; d < slot_order.size(); ++d) {
    for (const Op& op : slot_order[d]) {
      const int mb = slots[op.micro_batch].On(lane);
      if (mb < 0) continue;
      out[d].push_back({op.kind, op.stage, static_cast<uint32_t>(mb)});
    }
  }
  return out;
}

StageCostTable SlotCosts(const StageCostTable& costs, std::span<const ContextSlot> slots) {
  StageCostTable out(costs.size(), std::vector<StageOpCost>(slots.size()));
  for (size_t s = 0; s < costs.size(); ++s) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const ContextSlot& slot = slots[i];
      StageOpCost& o = out[s][i];
      const auto take = [&](int mb) {
        if (mb < 0) return;
        const StageOpCost& c = costs[s][mb];
        o.forward_ms = std::max(o.forward_ms, c.forward_ms);
        o.backward_ms = std::max(o.backward_ms, c.backward_ms);
        o.stored_bytes = std::max(o.stored_bytes, c.stored_bytes);
        o.peak_bytes = std::max(o.peak_bytes, c.peak_bytes);
        o.activation_bytes = std::max(o.activation_bytes, c.activation_bytes);
        o.gradient_bytes = std::max(o.gradient_bytes, c.gradient_bytes);
        o.weight_ms = std::max(o.weight_ms, c.weight_ms);
        o.weight_stored_bytes = std::max(o.weight_stored_bytes, c.weight_stored_bytes);
      };
      if (slot.split >= 0) {
        take(slot.split);
      } else {
        for (int mb : slot.by_lane) take(mb);
      }
      // B's input-gradient part stays non-negative: W at most B.
      o.weight_ms = std::min(o.weight_ms, o.backward_ms);
    }
  }
  return out;
}

}  // namespace varipipe::planner
