#include "planner/sim/memory_ledger.h"

#include <algorithm>
#include <limits>

namespace varipipe::planner {

MemoryLedger::MemoryLedger(uint32_t devices)
    : devices_(devices), own_(devices), received_(static_cast<size_t>(devices) * devices) {}

void MemoryLedger::Own(uint32_t device, double at_ms, double bytes) {
  own_[device].push_back({at_ms, bytes});
}

void MemoryLedger::Received(uint32_t device, uint32_t from, double at_ms, double bytes) {
  received_[static_cast<size_t>(device) * devices_ + from].push_back({at_ms, bytes});
}

std::vector<double> MemoryLedger::Peaks() const {
  std::vector<double> peaks(devices_, 0);
  // Per device a merge of sorted lists: its own changes first at equal
  // times, then each sender's buffers.
  std::vector<const std::vector<Change>*> lists;
  std::vector<size_t> next;
  for (uint32_t d = 0; d < devices_; ++d) {
    lists.assign(1, &own_[d]);
    for (uint32_t from = 0; from < devices_; ++from) {
      const std::vector<Change>& received = received_[static_cast<size_t>(d) * devices_ + from];
      if (!received.empty()) lists.push_back(&received);
    }
    next.assign(lists.size(), 0);
    double level = 0;
    double peak = 0;
    for (;;) {
      int pick = -1;
      double at = std::numeric_limits<double>::infinity();
      for (size_t k = 0; k < lists.size(); ++k) {
        if (next[k] < lists[k]->size() && (*lists[k])[next[k]].at_ms < at) {
          at = (*lists[k])[next[k]].at_ms;
          pick = static_cast<int>(k);
        }
      }
      if (pick < 0) break;
      level += (*lists[pick])[next[pick]++].bytes;
      peak = std::max(peak, level);
    }
    peaks[d] = peak;
  }
  return peaks;
}

}  // namespace varipipe::planner
