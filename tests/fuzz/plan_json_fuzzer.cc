// Execution plans as protobuf JSON (varipipe-plan --emit-plans files, the
// executor's --plans_dir), parsed as ReadPlanFile does and put through the
// executor's plan check.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "executor/runtime/plan_files.h"
#include "tests/fuzz/plan_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<varipipe::v1::ExecutionPlan> plan = varipipe::executor::ParsePlanJson(
      absl::string_view(reinterpret_cast<const char*>(data), size), "plan.json");
  if (!plan.ok()) return 0;
  varipipe::fuzz::CheckFuzzedPlan(*plan);
  return 0;
}
