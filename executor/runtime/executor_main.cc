// varipipe-executor: one process per GPU (or CPU rank) that runs execution
// plans.
//
// This version reads the launcher's environment (torchrun or mpirun), maps
// the rank to its (data-parallel, pipeline) coordinates, picks its device and
// reports the libraries it was built with. The plan interpreter, model stages
// and communication backends are added by the executor work
// (docs/architecture.md); until then the executor exits with status 1 after
// these checks unless --check_launch is given.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/logging.h"
#include "executor/runtime/device.h"
#include "executor/runtime/launch_env.h"
#include "spdlog/spdlog.h"
#ifdef VARIPIPE_HAVE_NCCL
#include "executor/comm/nccl/nccl_status.h"
#endif

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(bool, check_launch, false,
          "Check the launch environment, config and device, print this rank's place in the "
          "job, and exit 0.");

namespace {

constexpr char kUsage[] =
    "The Varipipe executor: runs one rank's execution plans with LibTorch.\n"
    "\n"
    "Usage:\n"
    "  torchrun --no_python --nproc_per_node K varipipe-executor --config job.json\n"
    "  mpirun -np K varipipe-executor --config job.json\n"
    "\n"
    "The rank comes from RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or\n"
    "OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK (Open MPI); with neither, the process\n"
    "is rank 0 of 1. This version checks the launch only; the plan interpreter\n"
    "is not built yet.";

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-executor", kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-executor: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) {
    std::fprintf(stderr, "varipipe-executor: --config is required (try --help)\n");
    return varipipe::kExitUsage;
  }
  absl::StatusOr<varipipe::v1::JobConfig> config = varipipe::LoadJobConfigFile(path);
  if (!config.ok()) {
    std::fprintf(stderr, "varipipe-executor: %s\n", std::string(config.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  absl::StatusOr<varipipe::executor::LaunchEnv> env = varipipe::executor::ReadLaunchEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "varipipe-executor: %s\n", std::string(env.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  absl::StatusOr<varipipe::executor::RankCoordinates> coordinates =
      varipipe::executor::ComputeCoordinates(*env, *config);
  if (!coordinates.ok()) {
    std::fprintf(stderr, "varipipe-executor: %s\n",
                 std::string(coordinates.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  varipipe::SetLoggerName(absl::StrCat("executor[rank ", env->rank, "]"));
  absl::StatusOr<varipipe::executor::DeviceChoice> device =
      varipipe::executor::ChooseDevice(env->local_rank);
  if (!device.ok()) {
    spdlog::error("{}", device.status().message());
    return varipipe::kExitFailure;
  }
  std::string nccl = "not built";
#ifdef VARIPIPE_HAVE_NCCL
  nccl = varipipe::executor::NcclRuntimeVersion();
#endif
  spdlog::info(
      "job {}: rank {} of {} (launcher {}, local rank {}) = dp {} pp {}; device {}; "
      "LibTorch {}; NCCL {}",
      config->job_id(), env->rank, env->world_size, env->launcher, env->local_rank,
      coordinates->dp_rank, coordinates->pp_rank, device->name, varipipe::executor::TorchVersion(),
      nccl);
  if (absl::GetFlag(FLAGS_check_launch)) return varipipe::kExitOk;
  spdlog::error("the plan interpreter is not built in this version; nothing to run");
  return varipipe::kExitFailure;
}
