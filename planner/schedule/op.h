// The schedule IR: one forward, backward or weight-gradient pass of one
// micro-batch on one pipeline stage (model chunk). Schedules are pure
// functions from a pipeline shape to per-device lists of these ops; later
// passes (simulation, communication planning) lower them.
//
// Split backward (zero-bubble schedules): a B whose (stage, micro-batch) also
// has a W in the same order computes only the gradient of the stage's input
// (what the previous stage waits for) and keeps the linear layers' inputs
// and output gradients; the W computes the weight gradients from them. A B
// without a W is the whole backward (input and weight gradients).
//
// Text form (logs, goldens, error messages): "<stage><F|B|W><micro_batch>",
// e.g. "2F0" is stage 2's forward of micro-batch 0, "2W0" its weight
// gradient. ParseOp round-trips it.
#ifndef VARIPIPE_PLANNER_SCHEDULE_OP_H_
#define VARIPIPE_PLANNER_SCHEDULE_OP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varipipe::planner {

enum class OpKind : uint8_t { kForward, kBackward, kWeight };

struct Op {
  OpKind kind = OpKind::kForward;
  uint32_t stage = 0;
  uint32_t micro_batch = 0;

  std::string ToString() const;
  friend bool operator==(const Op&, const Op&) = default;
};

absl::StatusOr<Op> ParseOp(absl::string_view text);

// Per device, the ops it runs, in order.
using DeviceOrder = std::vector<std::vector<Op>>;

// "d0: 0F0 0F1 0B0 ...\nd1: ..." for logs and test failures.
std::string FormatDeviceOrder(const DeviceOrder& order);

// The pipeline a schedule is built for. Stages (model chunks) are placed in
// a loop: stage s runs on device s % devices, so with `chunks` > 1 every
// device holds chunks stages (Megatron's interleaved placement).
struct PipelineShape {
  uint32_t devices = 1;
  uint32_t chunks = 1;
  uint32_t micro_batches = 1;

  uint32_t stages() const { return devices * chunks; }
  uint32_t DeviceOf(uint32_t stage) const { return stage % devices; }
  uint32_t ChunkOf(uint32_t stage) const { return stage / devices; }
  uint32_t Stage(uint32_t device, uint32_t chunk) const { return chunk * devices + device; }
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_OP_H_
