// varipipe-executor: one process per GPU (or CPU rank) that runs execution
// plans: reads the launcher's environment (torchrun or mpirun), maps the rank
// to its (data-parallel, pipeline) coordinates, picks its device, meets the
// other ranks through the job's Redis (Gloo on the CPU, NCCL ids on GPUs),
// builds its model stages and runs one plan per iteration with the plan
// interpreter. Plans come from the job's planner daemons over gRPC
// (--planner, or the store's address in --store_file), or from files
// (--plans DIR, the layout varipipe-plan --emit-plans writes).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/auth/job_token.h"
#include "common/binary_main.h"
#include "common/checkpoint/hf_checkpoint.h"
#include "common/config/cost_model_device.h"
#include "common/config/job_config.h"
#include "common/config/layer_layout.h"
#include "common/config/rank_layout.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/grpc/client_channel.h"
#include "common/logging.h"
#include "common/redis/redis_client.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "executor/comm/transport_factory.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/hf_export.h"
#include "executor/model/hf_weights.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/checkpoint.h"
#include "executor/runtime/counting_allocator.h"
#include "executor/runtime/device.h"
#include "executor/runtime/executor_metrics.h"
#include "executor/runtime/executor_status_service.h"
#include "executor/runtime/fault_injection.h"
#include "executor/runtime/launch_env.h"
#include "executor/runtime/optimizer_sharding.h"
#include "executor/runtime/plan_check.h"
#include "executor/runtime/plan_files.h"
#include "executor/runtime/plan_interpreter.h"
#include "executor/runtime/plan_source.h"
#include "executor/runtime/rank_liveness.h"
#include "executor/runtime/rank_transports.h"
#include "executor/runtime/trainer.h"
#include "executor/runtime/training_optimizer.h"
#include "spdlog/spdlog.h"
#ifdef VARIPIPE_HAVE_NCCL
#include "executor/comm/nccl/nccl_status.h"
#endif

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(bool, check_launch, false,
          "Check the launch environment, config, device and data (token ids within "
          "model.vocab_size; local rank 0 of each host), print this rank's place in the job, "
          "and exit 0.");
ABSL_FLAG(std::string, plans, "",
          "Directory of execution plans (DIR/iteration_NNNNNN/rank_NNNNN.json, as "
          "varipipe-plan --emit-plans writes them). One of --plans and --planner is required "
          "unless --check_launch.");
ABSL_FLAG(std::string, planner, "",
          "Planner daemons (host:port[,host:port...]) to fetch plans from over gRPC instead of "
          "--plans; the job config comes from them when --config is not given, and each "
          "iteration's plan is acknowledged after it ran.");
ABSL_FLAG(int32_t, plan_wait_s, 600,
          "With --planner: seconds to wait for a plan that is not published yet.");
ABSL_FLAG(uint64_t, first_iteration, 0, "First iteration to run.");
ABSL_FLAG(uint64_t, iterations, 0,
          "Iterations to run; 0 runs up to training.iterations of the config.");
ABSL_FLAG(std::string, redis, "",
          "Redis host:port for the rendezvous; default: store.redis_address of the config, or "
          "the store address the planner reports (password from store.password_file / "
          "store.password_env).");
ABSL_FLAG(std::string, store_file, "",
          "A planner daemon's --store_file ('host:port password'): the Redis address and "
          "password for the rendezvous, for daemons that run an embedded redis-server.");
ABSL_FLAG(std::string, run_id, "",
          "Identifies this launch of the job in the rendezvous keys; every rank must get the "
          "same one. Default: TORCHELASTIC_RUN_ID (torchrun) or OMPI_MCA_orte_ess_jobid "
          "(mpirun), else \"default\".");
ABSL_FLAG(std::string, export_hf, "",
          "After the last iteration, write the model as a Hugging Face checkpoint into this "
          "directory (config.json, model.safetensors.index.json, one safetensors shard per "
          "layer, in model.dtype): every pipeline rank of data-parallel replica 0 writes its own "
          "stages' shards. LLAMA and T5V11 models only.");
ABSL_FLAG(std::string, save_parameters, "",
          "After the last iteration, every rank writes its stages' parameters to "
          "PREFIX.rank_NNNNN.pt (a LibTorch archive keyed by parameter name), for comparisons "
          "and tests.");
ABSL_FLAG(std::string, metrics_jsonl, "",
          "Rank 0 appends one JSON object per iteration to this file.");
ABSL_FLAG(int32_t, status_port, 29700,
          "Base port of the status endpoints: each rank serves StatusService.GetExecutorStatus "
          "and the gRPC health service on --status_host:(this + local rank). 0: free ports "
          "(logged); -1: no endpoint.");
ABSL_FLAG(std::string, status_host, "127.0.0.1",
          "Address the status endpoint listens on (0.0.0.0: every interface, for monitoring "
          "from other hosts).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://HOST:PORT/metrics, local rank k on PORT + k (a "
          "bare PORT: 127.0.0.1; port 0: a free one, logged). Empty: none (docs/operations.md).");
ABSL_FLAG(std::string, token_file, "",
          "File holding the job token (docs/security.md); default: FILE.token beside "
          "--store_file, else (with --planner) the token the job's shared Redis holds "
          "(--redis or store.redis_address of --config). Sent on every call to the planner "
          "daemons and required by this rank's status endpoint.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates to verify TLS planner daemons with (their --tls_cert's issuer).");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for daemons that require one.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(bool, log_all_ranks, true,
          "Every rank logs at --log_level; false: ranks other than 0 log warnings and errors "
          "only (one readable stream under torchrun --tee).");
ABSL_FLAG(bool, resume, true,
          "Resume from the newest checkpoint every rank holds in training.checkpoint_dir.");
ABSL_FLAG(bool, device_timing, true,
          "GPUs: bracket each forward, backward, weight gradient and optimizer step with CUDA "
          "events read at the iteration's end, so that the per-pass times (progress reports, "
          "online calibration, metrics) are device times, not kernel-launch times; costs one "
          "wait for the device per iteration. CPUs ignore it.");
ABSL_FLAG(int64_t, profile_iteration, -1,
          "Record LibTorch's profiler (Kineto) over this iteration: every rank writes a Chrome "
          "trace to --profile_dir as iteration_N.rank_R.trace.json (open it in "
          "chrome://tracing or Perfetto) and logs its summary: the shares of matrix products, "
          "attention, communication, copies, other kernels and idle gaps (GPUs: device kernels; "
          "CPUs: host operators). -1: none.");
ABSL_FLAG(int64_t, cuda_sync_debug_iteration, -1,
          "GPUs: during this iteration LibTorch's CUDA synchronisation debug mode warns (on "
          "standard error, 'called a synchronizing CUDA operation') at every call that makes the "
          "host wait for the device; count them against the iteration's 'host reads'. -1: none.");
ABSL_FLAG(int64_t, loss_chunk_tokens, 0,
          "Labelled tokens the LM head computes the logits of at a time (its chunked "
          "linear + cross-entropy); overrides the job's training.loss_chunk_tokens. 0: that "
          "setting, whose own 0 is the default, max(1024, 256 MiB / (4 * the rank's "
          "vocabulary rows)).");
ABSL_FLAG(std::string, profile_dir, ".",
          "Directory of --profile_iteration's traces (created when missing).");
ABSL_FLAG(std::string, transport, "auto",
          "auto: NCCL between GPU ranks, Gloo over TCP between CPU ranks; gloo: Gloo on GPUs "
          "too, every transfer staged through host memory (slow; for ranks sharing one GPU, "
          "which NCCL refuses, e.g. LOCAL_RANK=0 on every rank).");

namespace varipipe {
namespace {

constexpr char kUsage[] =
    "The Varipipe executor: runs one rank's execution plans with LibTorch.\n"
    "\n"
    "Usage:\n"
    "  torchrun --no_python --nproc_per_node K varipipe-executor --config job.json \\\n"
    "      --plans DIR [--redis HOST:PORT]\n"
    "  mpirun -np K varipipe-executor --config job.json --plans DIR\n"
    "  torchrun ... varipipe-executor --planner HOST:PORT[,HOST:PORT...]\n"
    "\n"
    "The rank comes from RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or\n"
    "OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK (Open MPI); with neither, the process\n"
    "is rank 0 of 1. Ranks meet through the job's Redis (--redis or\n"
    "store.redis_address) and run the plans in --plans DIR or from the planner\n"
    "service (--planner); rank 0 logs loss,\n"
    "real tokens/s, padding efficiency, step time and peak memory per iteration.";

// Prints a startup error the way every varipipe binary does and returns
// `exit_code`.
int StartupError(const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "varipipe-executor: %s\n", std::string(status.message()).c_str());
  return exit_code;
}

// The launch's id in the rendezvous keys: --run_id, else torchrun's run id
// with its restart count (torchrun --standalone draws a fresh id per launch),
// else Open MPI's job id (fresh per mpirun).
std::string RunId() {
  if (!absl::GetFlag(FLAGS_run_id).empty()) return absl::GetFlag(FLAGS_run_id);
  return executor::LaunchId();
}

// Where the ranks of this launch meet: the job's Redis (for the rendezvous
// and the heartbeats) and the launch's keys, with this rank's peers.
absl::StatusOr<executor::TransportOptions> MeetingPoint(
    const v1::JobConfig& config, const executor::LaunchEnv& env,
    const executor::RankCoordinates& coordinates, const executor::DeviceChoice& device,
    const std::string& planner_store_address) {
  executor::TransportOptions transport_options;
  std::string address = absl::GetFlag(FLAGS_redis);
  std::string store_file_password;
  bool have_store_file = false;
  if (const std::string file = absl::GetFlag(FLAGS_store_file); !file.empty()) {
    std::ifstream in(file);
    std::string file_address;
    if (!(in >> file_address >> store_file_password)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": expected 'host:port password' (a planner's --store_file)"));
    }
    if (address.empty()) address = file_address;
    have_store_file = true;
  }
  if (address.empty()) address = config.store().redis_address();
  if (address.empty()) address = planner_store_address;
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "no Redis for the rendezvous: set store.redis_address in the config or pass --redis");
  }
  VP_ASSIGN_OR_RETURN(const auto host_port, ParseHostPort(address));
  transport_options.redis.host = host_port.first;
  transport_options.redis.port = host_port.second;
  if (have_store_file) {
    transport_options.redis.password = store_file_password;
  } else {
    VP_ASSIGN_OR_RETURN(transport_options.redis.password, ReadRedisPassword(config.store()));
  }
  transport_options.prefix =
      absl::StrCat(config.store().key_prefix(), "/", config.job_id(), "/rendezvous/", RunId());
  transport_options.rank = env.rank;
  transport_options.size = env.world_size;
  transport_options.cuda_device = device.is_cuda ? env.local_rank : -1;
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "auto" && transport != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport: '", transport, "' is not one of auto, gloo"));
  }
  transport_options.gloo_on_gpu = transport == "gloo";
  // Global ranks: the pipeline's (this lane's) and the data-parallel group's
  // (every replica's and lane's) ranks of this rank's tensor index, and its
  // tensor group (common/config/rank_layout.h).
  const RankLayout ranks = RankLayout::Of(config.parallelism());
  const auto global = [&](int pipeline_rank) {
    return ranks.GlobalRank(pipeline_rank, static_cast<uint32_t>(coordinates.tensor_index));
  };
  for (int peer : ranks.PipelineGroup(coordinates.dp_rank, coordinates.context_rank)) {
    if (global(peer) != env.rank) transport_options.peers.push_back(global(peer));
  }
  for (int r : ranks.DataParallelGroup(coordinates.pp_rank)) {
    transport_options.data_parallel_group.push_back(global(r));
  }
  transport_options.tensor_group = ranks.TensorGroup(coordinates.plan_rank);
  return transport_options;
}

// The job's token from a shared store (docs/security.md): executors that
// reach the job's Redis (--redis, or store.redis_address of --config, with
// the store's password) read the key the first daemon wrote. "" when the
// config names no shared store; an error naming the key when it holds none.
absl::StatusOr<std::string> TokenFromSharedStore(const v1::JobConfig& config) {
  std::string address = absl::GetFlag(FLAGS_redis);
  if (address.empty()) address = config.store().redis_address();
  if (address.empty()) return std::string();
  VP_ASSIGN_OR_RETURN(const auto host_port, ParseHostPort(address));
  RedisClient::Options options;
  options.host = host_port.first;
  options.port = host_port.second;
  options.max_attempts = 2;
  VP_ASSIGN_OR_RETURN(options.password, ReadRedisPassword(config.store()));
  const std::string key = JobTokenKey(config.store().key_prefix(), config.job_id());
  absl::StatusOr<std::unique_ptr<RedisClient>> redis = RedisClient::Connect(options);
  if (!redis.ok()) {
    return absl::Status(redis.status().code(),
                        absl::StrCat("reading the job token from the store at ", address, ": ",
                                     redis.status().message()));
  }
  VP_ASSIGN_OR_RETURN(RedisReply reply, (*redis)->Command({"GET", key}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET"));
  if (!reply.is_string()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the store at ", address, " holds no token for job '", config.job_id(), "' (key ", key,
        "): start a planner daemon for the job first, or pass --token_file"));
  }
  const std::string token = reply.str();
  VP_RETURN_IF_ERROR(CheckJobToken(token, absl::StrCat("the store's key ", key)));
  spdlog::info("job token read from the store at {} (key {})", address, key);
  return token;
}

// parallelism.stage_layout AUTO: the planners' choice becomes this
// executor's config (mode LISTED), from GetJob or, with plan files, from the
// first plan; every plan is then checked against it (plan_check.h).
absl::Status ResolveAutoStageLayout(v1::JobConfig& config,
                                    const std::optional<v1::StageLayoutConfig>& from_planner,
                                    executor::PlanSource& source, uint64_t first_iteration) {
  if (EffectiveLayoutMode(config.parallelism().stage_layout()) != v1::AUTO) {
    return absl::OkStatus();
  }
  v1::StageLayoutConfig chosen;
  std::string where;
  if (from_planner.has_value() && from_planner->mode() != v1::STAGE_LAYOUT_MODE_UNSPECIFIED) {
    chosen = *from_planner;
    where = "the planner daemons";
  } else {
    VP_ASSIGN_OR_RETURN(const v1::ExecutionPlan plan, source.Get(first_iteration));
    if (plan.stage_layers().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parallelism.stage_layout is AUTO but the plan of iteration ", first_iteration, " from ",
          source.Describe(), " records no stage layout: plan with a planner that chooses one"));
    }
    chosen.set_mode(v1::LISTED);
    chosen.mutable_layers()->CopyFrom(plan.stage_layers());
    chosen.set_encoder_stages(plan.encoder_stages());
    where = absl::StrCat("the plan of iteration ", first_iteration);
  }
  *config.mutable_parallelism()->mutable_stage_layout() = chosen;
  VP_ASSIGN_OR_RETURN(const LayerLayout layout, ConfiguredLayerLayout(config));
  spdlog::info("stage layout (AUTO): {}, from {}", layout.ToString(), where);
  return absl::OkStatus();
}

// Why the executor stops on a signal, for its log and its peers.
std::string StopReason(const ShutdownSignal& shutdown) {
  switch (shutdown.signal_number()) {
    case SIGTERM:
      return "stopped by SIGTERM";
    case SIGINT:
      return "stopped by SIGINT";
    default:
      return "stopped (shutdown requested)";
  }
}

// Runs this rank's iterations once its heartbeats run (TrainAndReport).
absl::Status Train(const v1::JobConfig& config, const executor::LaunchEnv& env,
                   const executor::RankCoordinates& coordinates,
                   const executor::DeviceChoice& device, ShutdownSignal& shutdown,
                   executor::PlanSource& source,
                   const executor::TransportOptions& transport_options,
                   executor::RankTransports& transports, executor::ExecutorStatusBoard& board) {
  const executor::TrainerOptions options{
      .first_iteration = absl::GetFlag(FLAGS_first_iteration),
      .iterations = absl::GetFlag(FLAGS_iterations),
      .resume = absl::GetFlag(FLAGS_resume),
      .device_timing = absl::GetFlag(FLAGS_device_timing),
      .profile_iteration = absl::GetFlag(FLAGS_profile_iteration),
      .profile_dir = absl::GetFlag(FLAGS_profile_dir),
      .cuda_sync_debug_iteration = absl::GetFlag(FLAGS_cuda_sync_debug_iteration),
      .metrics_jsonl = absl::GetFlag(FLAGS_metrics_jsonl),
      .save_parameters = absl::GetFlag(FLAGS_save_parameters),
      .export_hf = absl::GetFlag(FLAGS_export_hf),
      .loss_chunk_tokens = absl::GetFlag(FLAGS_loss_chunk_tokens)};
  executor::Trainer trainer(options, {.config = config,
                                      .env = env,
                                      .coordinates = coordinates,
                                      .device = device,
                                      .shutdown = shutdown,
                                      .source = source,
                                      .transport_options = transport_options,
                                      .transports = transports,
                                      .board = board});
  return trainer.Run();
}

// The first failure of a peer that the liveness watch saw.
class PeerFailure {
 public:
  void Set(const std::string& failure) {
    absl::MutexLock lock(&mu_);
    failure_ = failure;
  }
  std::string Get() const {
    absl::MutexLock lock(&mu_);
    return failure_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string failure_ ABSL_GUARDED_BY(mu_);
};

// Reports how this rank's training ended to its peers and returns the
// status main reports: done; stopped on purpose (CANCELLED); ended by a
// peer's failure (ABORTED, the peer's cause first, then where this rank
// was), whether the watch saw it or a failed transfer made this rank look;
// or its own failure, with what the other ranks were doing. `ttl` is the
// heartbeats' time to live.
absl::Status ReportEnd(const absl::Status& status, const ShutdownSignal& shutdown,
                       const PeerFailure& peer_failure, absl::Duration ttl,
                       executor::RankLiveness& liveness, executor::RankTransports& transports) {
  if (status.ok()) {
    liveness.ReportDone();
    return status;
  }
  if (shutdown.Requested()) {
    // Stopped on purpose: said so to the peers, and no waiting for them.
    const std::string message = absl::StrCat(StopReason(shutdown), ": ", status.message());
    liveness.ReportFailure(message);
    return absl::CancelledError(message);
  }
  // A transfer or collective that failed or timed out may be the
  // consequence of a peer's death: name it before reporting (the report
  // may become the launch's first failure).
  std::string diagnosis;
  if (peer_failure.Get().empty() &&
      (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))) {
    diagnosis = liveness.DiagnosePeers(ttl + absl::Seconds(2),
                                       /*until_first_finding=*/true);
  }
  if (const std::string failure = peer_failure.Get(); !failure.empty()) {
    // Ended by a peer's failure: the cause first, then where this rank was.
    const std::string message =
        absl::StrCat("ended because ", failure, "\n  (this rank was at: ", status.message(), ")");
    liveness.ReportFailure(message, /*first_candidate=*/false);
    transports.Close();
    return absl::AbortedError(message);
  }
  if (absl::StartsWith(diagnosis, "rank ")) {
    // This rank's transfer failed because a peer failed, went silent or
    // never joined (a closed connection can arrive before the watch sees
    // the peer's report): the same order, the peer's cause first. A
    // candidate still, for a silent peer that reported nothing (SET NX keeps
    // a reported first failure).
    const std::string message = absl::StrCat("ended because ", diagnosis,
                                             "\n  (this rank was at: ", status.message(), ")");
    liveness.ReportFailure(message);
    transports.Close();
    return absl::AbortedError(message);
  }
  const std::string message = diagnosis.empty()
                                  ? std::string(status.message())
                                  : absl::StrCat(status.message(), "; other ranks: ", diagnosis);
  liveness.ReportFailure(message);
  transports.Close();
  if (diagnosis.empty()) {
    diagnosis = liveness.DiagnosePeers(ttl + absl::Seconds(1));
  }
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), diagnosis.empty() ? "" : "\n  other ranks: ", diagnosis));
}

// Train with heartbeats from before the rendezvous to the end, so that
// whatever ends this rank (a failure at start-up included) is reported to
// its peers, and with a watch on the peers, so that whatever ends another
// rank ends this one too, naming the launch's first failure. A signal
// cancels the rank's waits; the result is then CANCELLED, naming where it
// stopped.
absl::Status TrainAndReport(const v1::JobConfig& config, const executor::LaunchEnv& env,
                            const executor::RankCoordinates& coordinates,
                            const executor::DeviceChoice& device, ShutdownSignal& shutdown,
                            executor::PlanSource& source, const std::string& planner_store_address,
                            executor::ExecutorStatusBoard& board) {
  VP_ASSIGN_OR_RETURN(executor::TransportOptions transport_options,
                      MeetingPoint(config, env, coordinates, device, planner_store_address));
  // Outlives Train: closed only once this rank's end is reported.
  executor::RankTransports transports;
  transport_options.cancelled = [&shutdown, &transports] {
    return shutdown.Requested() || transports.aborted();
  };
  transport_options.collective_timeout = absl::Seconds(config.training().watchdog_timeout_s());
  // Declared before the liveness, whose watch thread writes it.
  PeerFailure peer_failure;
  executor::LivenessOptions liveness_options;
  liveness_options.redis = transport_options.redis;
  liveness_options.prefix = transport_options.prefix + "/liveness";
  liveness_options.rank = env.rank;
  liveness_options.world_size = env.world_size;
  VP_ASSIGN_OR_RETURN(std::unique_ptr<executor::RankLiveness> liveness,
                      executor::RankLiveness::Start(liveness_options));
  // A peer's failure ends every wait of this rank: transfers, collectives,
  // the rendezvous and plan fetches.
  liveness->WatchPeers([&](const std::string& failure) {
    peer_failure.Set(failure);
    spdlog::error("ending this rank: {}", failure);
    transports.Abort(absl::StrCat("ended because ", failure));
    source.Cancel();
  });
  absl::Status status;
  {
    const std::unique_ptr<ShutdownSignal::Subscription> abort_on_shutdown =
        shutdown.OnShutdown([&source, &transports] {
          source.Cancel();
          transports.Abort("aborted for shutdown");
        });
    status = Train(config, env, coordinates, device, shutdown, source, transport_options,
                   transports, board);
  }
  return ReportEnd(status, shutdown, peer_failure, liveness_options.ttl, *liveness, transports);
}

// What main gathers before training, one step at a time. A step that fails
// has printed or logged why and returns the exit status; nullopt goes on.
struct ExecutorStartup {
  executor::LaunchEnv env;
  std::optional<v1::JobConfig> config;
  std::string token;
  std::unique_ptr<executor::PlanSource> source;
  executor::PlannerServiceSource* service = nullptr;  // `source`, when planners serve plans
  std::string planner_store_address;
  std::optional<v1::StageLayoutConfig> planner_layout;  // GetJob's
  executor::RankCoordinates coordinates;
  executor::DeviceChoice device;
};
using ExitStatus = std::optional<int>;

// The launcher's environment and the fault injection it asks for.
ExitStatus ReadEnvironment(ExecutorStartup& startup) {
  absl::StatusOr<executor::LaunchEnv> env = executor::ReadLaunchEnv();
  if (!env.ok()) return StartupError(env.status(), kExitUsage);
  startup.env = *std::move(env);
  if (const absl::Status faults = executor::ConfigureFaultInjection(startup.env.rank);
      !faults.ok()) {
    return StartupError(faults, kExitUsage);
  }
  return std::nullopt;
}

// The config from --config, and the job token (docs/security.md): presented
// to the daemons, and required by this rank's status endpoint.
ExitStatus ReadConfigAndToken(ExecutorStartup& startup) {
  const std::string path = absl::GetFlag(FLAGS_config);
  const bool with_planners = !absl::GetFlag(FLAGS_planner).empty();
  if (path.empty() && !with_planners) {
    std::fprintf(stderr, "varipipe-executor: --config is required (or --planner; try --help)\n");
    return kExitUsage;
  }
  if (!path.empty()) {
    absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile(path);
    if (!config.ok()) return StartupError(config.status(), kExitUsage);
    startup.config = *std::move(config);
  }
  absl::StatusOr<std::string> token =
      ClientJobToken(absl::GetFlag(FLAGS_token_file), absl::GetFlag(FLAGS_store_file));
  if (token.ok() && token->empty() && with_planners && startup.config.has_value()) {
    token = TokenFromSharedStore(*startup.config);
  }
  if (!token.ok()) return StartupError(token.status(), kExitUsage);
  startup.token = *std::move(token);
  return std::nullopt;
}

// With --planner: the plan source, and the job (config, store address and
// stage layout) the daemons serve.
ExitStatus ConnectToPlanners(ExecutorStartup& startup) {
  const std::string planners = absl::GetFlag(FLAGS_planner);
  if (planners.empty()) return std::nullopt;
  ClientSecurity security;
  security.token = startup.token;
  security.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  security.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  security.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  auto service = std::make_unique<executor::PlannerServiceSource>(
      absl::StrSplit(planners, ',', absl::SkipEmpty()), startup.env.rank,
      absl::Seconds(absl::GetFlag(FLAGS_plan_wait_s)), 4, security);
  absl::StatusOr<v1::GetJobResponse> job = service->GetJob();
  if (!job.ok()) return StartupError(job.status(), kExitFailure);
  startup.planner_store_address = job->store_address();
  if (!startup.config.has_value()) startup.config = job->config();
  if (job->has_stage_layout()) startup.planner_layout = job->stage_layout();
  startup.service = service.get();
  startup.source = std::move(service);
  return std::nullopt;
}

// Rank 0 warns when the job's cost model describes another kind of device
// than its own (a CPU run planned with a GPU's analytic model): the
// planner's predictions, and its memory limits, are then far off.
void WarnIfPlannedForAnotherDevice(const ExecutorStartup& startup) {
  if (startup.env.rank != 0) return;
  const std::string mismatch =
      CostModelDeviceMismatch(CostModelDeviceOf(*startup.config), startup.device.name);
  if (!mismatch.empty()) spdlog::warn("{}", mismatch);
}

// This rank's coordinates and device, logged with the library versions.
ExitStatus PlaceRank(ExecutorStartup& startup) {
  const executor::LaunchEnv& env = startup.env;
  absl::StatusOr<executor::RankCoordinates> coordinates =
      executor::ComputeCoordinates(env, *startup.config);
  if (!coordinates.ok()) return StartupError(coordinates.status(), kExitUsage);
  startup.coordinates = *coordinates;
  SetLoggerName(absl::StrCat("executor[rank ", env.rank, "]"));
  if (!absl::GetFlag(FLAGS_log_all_ranks) && env.rank != 0 &&
      spdlog::get_level() < spdlog::level::warn) {
    spdlog::set_level(spdlog::level::warn);
  }
  // Before anything touches CUDA: the allocator reads its settings once.
  const v1::TrainingConfig& training = startup.config->training();
  const std::string allocator = executor::ConfigureCudaAllocator(
      !training.has_cuda_expandable_segments() || training.cuda_expandable_segments());
  absl::StatusOr<executor::DeviceChoice> device = executor::ChooseDevice(env.local_rank);
  if (!device.ok()) {
    spdlog::error("{}", device.status().message());
    return kExitFailure;
  }
  startup.device = *std::move(device);
  if (startup.device.is_cuda) spdlog::info("CUDA caching allocator: {}", allocator);
  std::string nccl = "not built";
#ifdef VARIPIPE_HAVE_NCCL
  nccl = executor::NcclRuntimeVersion();
#endif
  spdlog::info(
      "job {}: rank {} of {} (launcher {}, local rank {}) = dp {} pp {} context {} tensor {}; "
      "device {}; LibTorch {}; NCCL {}",
      startup.config->job_id(), env.rank, env.world_size, env.launcher, env.local_rank,
      startup.coordinates.dp_rank, startup.coordinates.pp_rank, startup.coordinates.context_rank,
      startup.coordinates.tensor_index, startup.device.name, executor::TorchVersion(), nccl);
  WarnIfPlannedForAnotherDevice(startup);
  return std::nullopt;
}

// --check_launch's data check: the token ids of every data file lie within
// model.vocab_size, as the planner daemons check at start-up (reusing the
// cache beside each index they or an earlier check wrote). Local rank 0
// checks for its host; the other ranks would read the same files.
int CheckLaunchData(const ExecutorStartup& startup) {
  if (startup.env.local_rank != 0) return kExitOk;
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*startup.config);
  absl::Status checked = dataset.status();
  if (checked.ok()) checked = (*dataset)->CheckTokenIds({});
  if (!checked.ok()) {
    return StartupError(checked,
                        absl::IsInvalidArgument(checked) ? kExitUsage : kExitFailure);
  }
  spdlog::info("dataset: {}: token ids within model.vocab_size {}", (*dataset)->Describe(),
               startup.config->model().vocab_size());
  return kExitOk;
}

// The plan files when no planner serves plans, and the stage layout an
// "auto" config resolves to.
ExitStatus OpenPlanSource(ExecutorStartup& startup) {
  if (startup.source == nullptr) {
    if (absl::GetFlag(FLAGS_plans).empty()) {
      spdlog::error("--plans or --planner is required (try --help)");
      return kExitUsage;
    }
    // Plan files are per pipeline rank (common/config/rank_layout.h).
    startup.source =
        executor::PlanFileSource(absl::GetFlag(FLAGS_plans), startup.coordinates.plan_rank);
  } else if (startup.service != nullptr) {
    startup.service->set_plan_rank(startup.coordinates.plan_rank);
  }
  spdlog::info("plans from {}", startup.source->Describe());
  if (const absl::Status layout =
          ResolveAutoStageLayout(*startup.config, startup.planner_layout, *startup.source,
                                 absl::GetFlag(FLAGS_first_iteration));
      !layout.ok()) {
    return StartupError(layout, kExitFailure);
  }
  return std::nullopt;
}

// The status endpoint and the metrics endpoint, serving from here to the
// end, stuck rendezvous included.
struct MonitoringEndpoints {
  std::unique_ptr<executor::ExecutorStatusServer> status;
  std::unique_ptr<metrics::MetricsHttpServer> metrics;
};
ExitStatus ServeMonitoring(const ExecutorStartup& startup, const v1::ExecutorStatus& identity,
                           executor::ExecutorStatusBoard& board, MonitoringEndpoints& endpoints) {
  if (const int base = absl::GetFlag(FLAGS_status_port); base >= 0) {
    absl::StatusOr<std::unique_ptr<executor::ExecutorStatusServer>> started =
        executor::ExecutorStatusServer::Start(absl::GetFlag(FLAGS_status_host),
                                              base == 0 ? 0 : base + startup.env.local_rank, &board,
                                              startup.token);
    if (!started.ok()) {
      spdlog::error("{}", started.status().message());
      return kExitFailure;
    }
    endpoints.status = *std::move(started);
    spdlog::info("status endpoint (StatusService, health) on {}:{}",
                 absl::GetFlag(FLAGS_status_host), endpoints.status->port());
  }
  absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> metrics_server =
      executor::StartExecutorMetrics(absl::GetFlag(FLAGS_metrics_listen), identity,
                                     startup.env.local_rank);
  if (!metrics_server.ok()) {
    spdlog::error("{}", metrics_server.status().message());
    return kExitFailure;
  }
  endpoints.metrics = *std::move(metrics_server);
  return std::nullopt;
}

// Trains under monitoring; the exit status says how training ended.
int Run(ExecutorStartup& startup, ShutdownSignal& shutdown) {
  v1::ExecutorStatus identity;
  identity.set_job_id(startup.config->job_id());
  identity.set_rank(startup.env.rank);
  identity.set_dp_rank(startup.coordinates.dp_rank);
  identity.set_pp_rank(startup.coordinates.pp_rank);
  identity.set_device(startup.device.name);
  executor::ExecutorStatusBoard board(identity);
  MonitoringEndpoints endpoints;
  if (const ExitStatus failed = ServeMonitoring(startup, identity, board, endpoints)) {
    return *failed;
  }
  const absl::Status status =
      TrainAndReport(*startup.config, startup.env, startup.coordinates, startup.device, shutdown,
                     *startup.source, startup.planner_store_address, board);
  if (absl::IsCancelled(status) && shutdown.signal_number() != 0) {
    // The conventional status of a process ended by that signal.
    const int code = 128 + shutdown.signal_number();
    spdlog::error("{}; exiting with status {}", status.message(), code);
    return code;
  }
  if (!status.ok()) {
    spdlog::error("{}", status.message());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace varipipe

int main(int argc, char** argv) {
  varipipe::ShutdownSignal shutdown;
  // A signal ends the executor within this long, wherever it waits: waits
  // on peers, plans and the rendezvous are cancelled at once, and whatever
  // cannot be (a connection to a stopped peer) is cut short by exiting.
  shutdown.ExitAfter(absl::Seconds(4));
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-executor", varipipe::kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-executor: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  varipipe::ExecutorStartup startup;
  for (const auto step : {varipipe::ReadEnvironment, varipipe::ReadConfigAndToken,
                          varipipe::ConnectToPlanners, varipipe::PlaceRank}) {
    if (const varipipe::ExitStatus failed = step(startup)) return *failed;
  }
  if (absl::GetFlag(FLAGS_check_launch)) return varipipe::CheckLaunchData(startup);
  if (const varipipe::ExitStatus failed = varipipe::OpenPlanSource(startup)) return *failed;
  return varipipe::Run(startup, shutdown);
}
