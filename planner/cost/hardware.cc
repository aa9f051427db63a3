#include "planner/cost/hardware.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::planner {
namespace {

// Vendor datasheet peaks (dense, no sparsity); efficiency parameters chosen
// so that large GEMMs reach the fraction of peak commonly measured in
// Megatron-style training (about 55-60% on A100, 45-50% on Hopper).
const std::vector<Hardware>& Presets() {
  static const auto* const kPresets = new std::vector<Hardware>{
      {"a100-40gb", 312, 19.5, 1555, 40, 0.60, 512, 30},
      {"a100-80gb", 312, 19.5, 2039, 80, 0.60, 512, 30},
      {"h100-80gb", 989, 67, 3350, 80, 0.50, 1024, 25},
      {"h200", 989, 67, 4800, 141, 0.52, 1024, 25},
  };
  return *kPresets;
}

}  // namespace

absl::StatusOr<Hardware> HardwarePreset(absl::string_view name) {
  const std::string wanted = absl::AsciiStrToLower(name);
  for (const Hardware& h : Presets()) {
    if (h.name == wanted) return h;
  }
  return absl::NotFoundError(absl::StrCat("unknown hardware preset '", name, "' (known: ",
                                          absl::StrJoin(HardwarePresetList(), ", "), ")"));
}

std::vector<std::string> HardwarePresetList() {
  std::vector<std::string> names;
  for (const Hardware& h : Presets()) names.push_back(h.name);
  return names;
}

}  // namespace varipipe::planner
