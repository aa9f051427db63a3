// Seed maker for plan_binary_fuzzer: encodes protobuf-JSON plans
// (varipipe-plan --emit-plans) as binary protobuf.
//   plan_json_to_binary IN.json OUT.bin
#include <cstdio>
#include <fstream>
#include <string>

#include "common/status.h"
#include "executor/runtime/plan_files.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: plan_json_to_binary IN.json OUT.bin\n");
    return 2;
  }
  absl::StatusOr<std::string> text = varipipe::ReadFileToString(argv[1]);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<varipipe::v1::ExecutionPlan> plan =
      varipipe::executor::ParsePlanJson(*text, argv[1]);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
  if (!plan->SerializeToOstream(&out)) {
    std::fprintf(stderr, "cannot write %s\n", argv[2]);
    return 1;
  }
  return 0;
}
