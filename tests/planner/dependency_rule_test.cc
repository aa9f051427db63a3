// The dependency rule (docs/architecture.md): the planner core includes no
// gRPC, hiredis, Torch, Gloo or NCCL header, and the executor never includes
// planner/. The CMake targets link accordingly, but every library's headers
// share one system include path, so this test reads the #include lines and
// fails with the file and line of a violation.
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace varipipe {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Violations(const fs::path& root, const std::regex& forbidden,
                                    const std::vector<std::string>& skip_dirs) {
  std::vector<std::string> violations;
  const std::regex include_line(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cc") continue;
    const std::string relative = fs::relative(entry.path(), root).string();
    bool skipped = false;
    for (const std::string& dir : skip_dirs) skipped |= relative.rfind(dir, 0) == 0;
    if (skipped) continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      std::smatch match;
      if (std::regex_search(line, match, include_line) &&
          std::regex_search(match[1].str(), forbidden)) {
        violations.push_back(entry.path().string() + ":" + std::to_string(number) + ": " + line);
      }
    }
  }
  return violations;
}

TEST(DependencyRule, PlannerCoreIncludesNoServiceOrTorchHeaders) {
  const std::regex forbidden(
      R"(^(grpc|grpcpp|hiredis|torch|ATen|c10|gloo|nccl|cuda)|\.grpc\.pb\.h$|^executor/)");
  // planner/service/ is the service layer, allowed to use gRPC and hiredis.
  const std::vector<std::string> violations =
      Violations(fs::path(VARIPIPE_SOURCE_DIR) / "planner", forbidden, {"service/"});
  for (const std::string& v : violations) ADD_FAILURE() << v;
}

// Inside the planner core, arrows point one way:
// cost -> microbatch -> schedule -> sim -> comm -> plan.
TEST(DependencyRule, PlannerLayersIncludeOnlyEarlierLayers) {
  const std::vector<std::string> layers = {"cost", "microbatch", "schedule", "sim", "comm", "plan"};
  for (size_t i = 0; i < layers.size(); ++i) {
    const fs::path dir = fs::path(VARIPIPE_SOURCE_DIR) / "planner" / layers[i];
    if (!fs::exists(dir)) continue;
    std::string later;
    for (size_t j = i + 1; j < layers.size(); ++j) {
      absl::StrAppend(&later, later.empty() ? "" : "|", "planner/", layers[j], "/");
    }
    if (later.empty()) continue;
    for (const std::string& v : Violations(dir, std::regex("^(" + later + ")"), {})) {
      ADD_FAILURE() << v << " (planner/" << layers[i] << " may not include a later layer)";
    }
  }
}

TEST(DependencyRule, CommonIncludesNoServiceOrTorchHeaders) {
  const std::regex forbidden(
      R"(^(grpc|grpcpp|hiredis|torch|ATen|c10|gloo|nccl|cuda)|^(planner|executor)/)");
  // common/redis/ is the separate varipipe_redis library (hiredis allowed),
  // common/grpc/ the separate varipipe_grpc_auth library (gRPC allowed).
  for (const std::string& v :
       Violations(fs::path(VARIPIPE_SOURCE_DIR) / "common", forbidden, {"redis/", "grpc/"}))
    ADD_FAILURE() << v;
}

TEST(DependencyRule, ExecutorNeverIncludesPlanner) {
  const std::regex forbidden(R"(^planner/)");
  for (const std::string& v : Violations(fs::path(VARIPIPE_SOURCE_DIR) / "executor", forbidden, {}))
    ADD_FAILURE() << v;
}

}  // namespace
}  // namespace varipipe
