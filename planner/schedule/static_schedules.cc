#include "planner/schedule/static_schedules.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace varipipe::planner {
namespace {

absl::Status CheckShape(const PipelineShape& shape, bool chunks_allowed, const char* name) {
  if (shape.devices == 0 || shape.micro_batches == 0 || shape.chunks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": devices, chunks and micro-batches must be at least 1"));
  }
  if (!chunks_allowed && shape.chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, " needs one chunk per device (got ",
                                                   shape.chunks,
                                                   "); use the interleaved schedule"));
  }
  return absl::OkStatus();
}

// 1F1B over units: forwards(u) and backwards(u) are the ops of unit u.
template <typename F, typename B>
std::vector<Op> OneFOneBOver(uint32_t units, uint32_t warmup, F forwards, B backwards) {
  std::vector<Op> order;
  warmup = std::min(warmup, units);
  for (uint32_t u = 0; u < warmup; ++u) forwards(u, order);
  for (uint32_t u = warmup; u < units; ++u) {
    forwards(u, order);
    backwards(u - warmup, order);
  }
  for (uint32_t u = units - warmup; u < units; ++u) backwards(u, order);
  return order;
}

}  // namespace

absl::StatusOr<DeviceOrder> GpipeSchedule(const PipelineShape& shape) {
  if (absl::Status s = CheckShape(shape, true, "GPipe"); !s.ok()) return s;
  DeviceOrder order(shape.devices);
  for (uint32_t d = 0; d < shape.devices; ++d) {
    for (uint32_t c = 0; c < shape.chunks; ++c) {
      for (uint32_t m = 0; m < shape.micro_batches; ++m) {
        order[d].push_back({OpKind::kForward, shape.Stage(d, c), m});
      }
    }
    for (uint32_t c = shape.chunks; c-- > 0;) {
      for (uint32_t m = 0; m < shape.micro_batches; ++m) {
        order[d].push_back({OpKind::kBackward, shape.Stage(d, c), m});
      }
    }
  }
  return order;
}

absl::StatusOr<DeviceOrder> OneFOneBSchedule(const PipelineShape& shape) {
  return KfkbSchedule(shape, 1);
}

absl::StatusOr<DeviceOrder> KfkbSchedule(const PipelineShape& shape, uint32_t k) {
  if (absl::Status s = CheckShape(shape, false, k == 1 ? "1F1B" : "kFkB"); !s.ok()) return s;
  if (k == 0) return absl::InvalidArgumentError("kFkB: k must be at least 1");
  const uint32_t m = shape.micro_batches;
  const uint32_t groups = (m + k - 1) / k;
  DeviceOrder order(shape.devices);
  for (uint32_t d = 0; d < shape.devices; ++d) {
    const auto each = [&](uint32_t g, OpKind kind, std::vector<Op>& out) {
      for (uint32_t mb = g * k; mb < std::min(m, (g + 1) * k); ++mb) out.push_back({kind, d, mb});
    };
    order[d] = OneFOneBOver(
        groups, shape.devices - d - 1,
        [&](uint32_t g, std::vector<Op>& out) { each(g, OpKind::kForward, out); },
        [&](uint32_t g, std::vector<Op>& out) { each(g, OpKind::kBackward, out); });
  }
  return order;
}

absl::StatusOr<DeviceOrder> InterleavedOneFOneBSchedule(const PipelineShape& shape) {
  if (absl::Status s = CheckShape(shape, true, "interleaved 1F1B"); !s.ok()) return s;
  const uint32_t p = shape.devices;
  const uint32_t v = shape.chunks;
  const uint32_t m = shape.micro_batches;
  // Megatron's schedule needs whole rounds of p micro-batches. For any other
  // m, build it for the next multiple of p and drop the padding
  // micro-batches: removing whole micro-batches from every device keeps a
  // deadlock-free order deadlock-free (any valid execution of the full
  // schedule restricted to the remaining ops is a valid execution).
  const uint32_t padded = (m + p - 1) / p * p;
  DeviceOrder order(p);
  for (uint32_t d = 0; d < p; ++d) {
    // The forward and backward sequences of (chunk, micro-batch) pairs.
    std::vector<Op> forwards;
    std::vector<Op> backwards;
    for (uint32_t first = 0; first < padded; first += p) {
      for (uint32_t c = 0; c < v; ++c) {
        for (uint32_t j = 0; j < p; ++j) {
          forwards.push_back({OpKind::kForward, shape.Stage(d, c), first + j});
        }
      }
      for (uint32_t c = v; c-- > 0;) {
        for (uint32_t j = 0; j < p; ++j) {
          backwards.push_back({OpKind::kBackward, shape.Stage(d, c), first + j});
        }
      }
    }
    const uint32_t warmup = (v - 1) * p + 2 * (p - d - 1);
    std::vector<Op> full = OneFOneBOver(
        static_cast<uint32_t>(forwards.size()), warmup,
        [&](uint32_t u, std::vector<Op>& out) { out.push_back(forwards[u]); },
        [&](uint32_t u, std::vector<Op>& out) { out.push_back(backwards[u]); });
    for (const Op& op : full) {
      if (op.micro_batch < m) order[d].push_back(op);
    }
  }
  return order;
}

absl::StatusOr<DeviceOrder> ZeroBubbleH1Schedule(const PipelineShape& shape) {
  if (absl::Status s = CheckShape(shape, false, "ZB-H1"); !s.ok()) return s;
  const uint32_t p = shape.devices;
  const uint32_t m = shape.micro_batches;
  DeviceOrder order(p);
  for (uint32_t d = 0; d < p; ++d) {
    std::vector<Op>& out = order[d];
    const uint32_t warmup = std::min(p - d - 1, m);
    for (uint32_t k = 0; k < warmup; ++k) out.push_back({OpKind::kForward, d, k});
    for (uint32_t k = 0; k < m; ++k) {
      if (warmup + k < m) out.push_back({OpKind::kForward, d, warmup + k});
      out.push_back({OpKind::kBackward, d, k});
      if (k >= d) out.push_back({OpKind::kWeight, d, k - d});
    }
    for (uint32_t k = m > d ? m - d : 0; k < m; ++k) out.push_back({OpKind::kWeight, d, k});
  }
  return order;
}

}  // namespace varipipe::planner
