#ifndef VARIPIPE_PLANNER_COST_LINK_H_
#define VARIPIPE_PLANNER_COST_LINK_H_

namespace varipipe::planner {

// A connection between two devices (or a collective over several): a
// message of n bytes takes latency + n / bandwidth. Measured by
// varipipe-profile (cost_model.h, CommunicationCosts) or taken from the
// cluster config, and used by the simulator and the update costs.
struct Link {
  double latency_ms = 0;
  double bytes_per_ms = 0;  // bandwidth; 0: no bandwidth cost (the latency alone)

  double TransferMs(double bytes) const {
    return bytes_per_ms > 0 ? latency_ms + bytes / bytes_per_ms : latency_ms;
  }
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_LINK_H_
