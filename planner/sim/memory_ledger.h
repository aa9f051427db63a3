// What each device of a pipeline holds over one simulated iteration, as
// timed changes: the stored activations and transients of its own ops, and
// the buffers the communication plan keeps alive (comm_planner.h):
//   - an activation it sends, from its forward's end until the backward of
//     the same stage and micro-batch starts (the SendWait just before it);
//   - an input gradient it sends, from its backward's end until the end of
//     the iteration (gradient SendWaits come last);
//   - a tensor it receives, from the producer's end (the RecvStart is
//     emitted at that simulated time) until the consuming op starts, which
//     then holds it as part of its own bytes (a forward's stored input, a
//     backward's received output gradient);
//   - an output or input gradient passed to a stage on the same device,
//     until that stage's op consumes it.
// The peak of a device is the largest sum over time. At one time t a device
// first ends what ends at t (what the op frees and leaves), then receives
// what arrives at t (a RecvStart comes before a compute that starts at the
// same time, comm_planner.h), then starts what starts at t; changes of one
// kind at one time net out. The plan validator replays the same rules from
// the plan's own instructions (planner/plan/memory_replay.h).
#ifndef VARIPIPE_PLANNER_SIM_MEMORY_LEDGER_H_
#define VARIPIPE_PLANNER_SIM_MEMORY_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace varipipe::planner {

class MemoryLedger {
 public:
  explicit MemoryLedger(uint32_t devices);

  // Room for `changes` of `device`'s own.
  void Reserve(uint32_t device, size_t changes) { own_[device].reserve(changes); }

  // Changes on `device` by its own ops (positive: allocated) when an op
  // starts and when one ends. REQUIRES: nondecreasing `at_ms` per device.
  void Starts(uint32_t device, double at_ms, double bytes) { Own(device, at_ms, bytes, true); }
  void Ends(uint32_t device, double at_ms, double bytes) { Own(device, at_ms, bytes, false); }
  // A buffer of `bytes` >= 0 `device` allocates for a transfer from `from`
  // at `at_ms`. REQUIRES: nondecreasing `at_ms` per (device, from).
  void Received(uint32_t device, uint32_t from, double at_ms, double bytes);

  // Each device's largest total.
  std::vector<double> Peaks() const;

 private:
  struct Change {
    double at_ms;
    double bytes;
    bool start = false;  // an op's start (after what is received at at_ms)
  };
  void Own(uint32_t device, double at_ms, double bytes, bool start) {
    std::vector<Change>& own = own_[device];
    if (!own.empty() && own.back().at_ms == at_ms && own.back().start == start) {
      own.back().bytes += bytes;
    } else {
      own.push_back({at_ms, bytes, start});
    }
  }
  uint32_t devices_;
  std::vector<std::vector<Change>> own_;        // per device
  std::vector<std::vector<Change>> received_;   // [device * devices + from]
  std::vector<std::vector<uint32_t>> senders_;  // per device: the `from`s it received from
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SIM_MEMORY_LEDGER_H_
