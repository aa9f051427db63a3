// Execution plans as binary protobuf (what executors receive from planner
// daemons over gRPC and Redis), parsed and put through the executor's plan
// check.
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/plan_fuzz.h"

// Protobuf logs every string field with invalid UTF-8 it parses; the parse
// fails, which is all the target needs to know.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  varipipe::v1::ExecutionPlan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  varipipe::fuzz::CheckFuzzedPlan(plan);
  return 0;
}
