#include "planner/sim/memory_ledger.h"

#include <algorithm>
#include <limits>

namespace varipipe::planner {

MemoryLedger::MemoryLedger(uint32_t devices)
    : devices_(devices),
      own_(devices),
      received_(static_cast<size_t>(devices) * devices),
      senders_(devices) {}

void MemoryLedger::Received(uint32_t device, uint32_t from, double at_ms, double bytes) {
  std::vector<Change>& received = received_[static_cast<size_t>(device) * devices_ + from];
  if (received.empty()) senders_[device].push_back(from);
  received.push_back({at_ms, bytes});
}

std::vector<double> MemoryLedger::Peaks() const {
  std::vector<double> peaks(devices_, 0);
  std::vector<size_t> next;
  for (uint32_t d = 0; d < devices_; ++d) {
    const std::vector<uint32_t>& senders = senders_[d];
    next.assign(senders.size(), 0);
    double level = 0;
    double peak = 0;
    // Received buffers only add: before each own change, those received
    // earlier (for a start: also at the same time) are summed in, and the
    // level is a candidate.
    const auto receive_before = [&](double at_ms, bool inclusive) {
      for (size_t k = 0; k < senders.size(); ++k) {
        const std::vector<Change>& received =
            received_[static_cast<size_t>(d) * devices_ + senders[k]];
        for (; next[k] < received.size() &&
               (received[next[k]].at_ms < at_ms || (inclusive && received[next[k]].at_ms == at_ms));
             ++next[k]) {
          level += received[next[k]].bytes;
        }
      }
      peak = std::max(peak, level);
    };
    for (const Change& change : own_[d]) {
      receive_before(change.at_ms, change.start);
      level += change.bytes;
      peak = std::max(peak, level);
    }
    receive_before(std::numeric_limits<double>::infinity(), true);
    peaks[d] = peak;
  }
  return peaks;
}

}  // namespace varipipe::planner
