// varipipe-planner: the planner daemon.
//
// This version loads and validates the job config and reports how it would
// connect to the instruction store. The planning workers, the Redis
// instruction store and the gRPC services are added by the planner-service
// work (docs/architecture.md); until then the daemon exits with status 1
// after validating, so no launcher mistakes it for a running service.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "grpcpp/grpcpp.h"
#include "hiredis/hiredis.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(bool, check_config, false,
          "Validate the config, print it with defaults filled in, and exit 0.");

namespace {

constexpr char kUsage[] =
    "The Varipipe planner daemon: plans training iterations ahead of the\n"
    "executors and publishes execution plans through a Redis instruction store.\n"
    "\n"
    "Usage: varipipe-planner --config job.json [--check_config]\n"
    "\n"
    "This version validates the config only; the planning service is not built yet.";

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-planner", kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-planner: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) {
    std::fprintf(stderr, "varipipe-planner: --config is required (try --help)\n");
    return varipipe::kExitUsage;
  }
  absl::StatusOr<varipipe::v1::JobConfig> config = varipipe::LoadJobConfigFile(path);
  if (!config.ok()) {
    std::fprintf(stderr, "varipipe-planner: %s\n", std::string(config.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_check_config)) {
    std::printf("%s\n", varipipe::JobConfigToJson(*config).c_str());
    return varipipe::kExitOk;
  }
  spdlog::info("job {}: config {} is valid ({} ranks); gRPC {}, hiredis {}.{}.{}", config->job_id(),
               path, varipipe::WorldSize(*config), grpc::Version(), HIREDIS_MAJOR, HIREDIS_MINOR,
               HIREDIS_PATCH);
  spdlog::info("instruction store: {}",
               config->store().redis_address().empty()
                   ? std::string("embedded redis-server (single-machine mode)")
                   : config->store().redis_address());
  spdlog::error("the planning service is not built in this version; nothing to serve");
  return varipipe::kExitFailure;
}
