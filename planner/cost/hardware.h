// Hardware descriptions for the analytic cost model (docs/cost-model.md).
#ifndef VARIPIPE_PLANNER_COST_HARDWARE_H_
#define VARIPIPE_PLANNER_COST_HARDWARE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varipipe::planner {

struct Hardware {
  std::string name;
  // Dense matrix throughput at 16-bit precision (bf16/fp16 tensor cores)
  // and at fp32 (no TF32), in TFLOP/s.
  double peak_tflops_16bit = 0;
  double peak_tflops_fp32 = 0;
  // HBM bandwidth, GB/s (1e9 bytes per second).
  double memory_bandwidth_gbps = 0;
  // Device memory, GiB.
  double memory_gib = 0;
  // Efficiency curve of matrix work in tokens per micro-batch pass n = b * s:
  //   efficiency(n) = max_efficiency * n / (n + half_efficiency_tokens)
  // (small micro-batches cannot fill the device).
  double max_efficiency = 0;
  double half_efficiency_tokens = 0;
  // Fixed cost of launching one layer's kernels for one pass, microseconds.
  double layer_overhead_us = 0;

  double Efficiency(double tokens) const {
    return max_efficiency * tokens / (tokens + half_efficiency_tokens);
  }
};

// The presets: "a100-40gb", "a100-80gb", "h100-80gb", "h200".
absl::StatusOr<Hardware> HardwarePreset(absl::string_view name);
std::vector<std::string> HardwarePresetList();

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_HARDWARE_H_
