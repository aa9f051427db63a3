#include "planner/service/planner_daemon.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/auth/job_token.h"
#include "common/config/cost_model_device.h"
#include "common/config/job_config.h"
#include "common/logging.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "planner/layout/stage_layout_search.h"
#include "planner/plan/plan_builder.h"
#include "planner/service/plan_service.h"
#include "planner/service/planner_metrics.h"
#include "planner/service/status_service.h"
#include "spdlog/spdlog.h"

namespace varipipe::service {
namespace {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * (values.size() - 1))];
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The connection's Redis client id, -1 when unknown.
int64_t ClientId(RedisInstructionStore& store) {
  absl::StatusOr<RedisReply> id = store.redis().Command({"CLIENT", "ID"});
  return id.ok() && id->is_integer() ? id->integer() : -1;
}

}  // namespace

PlannerDaemon::StoreLease::~StoreLease() {
  if (store_ == nullptr || daemon_ == nullptr) return;
  absl::MutexLock lock(&daemon_->mu_);
  daemon_->leased_.erase(store_.get());
  if (static_cast<int>(daemon_->pool_.size()) < kIdleConnections) {
    daemon_->pool_.push_back(std::move(store_));
    return;
  }
  --daemon_->open_connections_;
  daemon_->client_ids_.erase(store_.get());
  // Closed as store_ goes (the connection's close does not block).
}

void PlannerDaemon::AddToPool(std::unique_ptr<RedisInstructionStore> store) {
  const int64_t id = ClientId(*store);
  absl::MutexLock lock(&mu_);
  client_ids_[store.get()] = id;
  pool_.push_back(std::move(store));
  ++open_connections_;
}

absl::StatusOr<PlannerDaemon::StoreLease> PlannerDaemon::AcquireStore() {
  {
    absl::MutexLock lock(&mu_);
    if (!pool_.empty()) {
      std::unique_ptr<RedisInstructionStore> store = std::move(pool_.back());
      pool_.pop_back();
      leased_.insert(store.get());
      return StoreLease(this, std::move(store));
    }
    if (open_connections_ >= options_.max_calls + kSpareConnections) {
      return absl::ResourceExhaustedError(
          absl::StrCat("all ", open_connections_,
                       " instruction-store connections of this daemon are in use (--max_calls ",
                       options_.max_calls, ")"));
    }
    ++open_connections_;
  }
  absl::StatusOr<std::unique_ptr<RedisInstructionStore>> store =
      RedisInstructionStore::Open(redis_options_, store_options_);
  if (!store.ok()) {
    absl::MutexLock lock(&mu_);
    --open_connections_;
    return store.status();
  }
  const int64_t id = ClientId(**store);
  absl::MutexLock lock(&mu_);
  client_ids_[store->get()] = id;
  leased_.insert(store->get());
  return StoreLease(this, *std::move(store));
}

bool PlannerDaemon::EnterWait() {
  if (waiting_calls_.fetch_add(1) < options_.max_calls) return true;
  waiting_calls_.fetch_sub(1);
  return false;
}

std::string PlannerDaemon::store_address() const {
  return absl::StrCat(redis_options_.host, ":", redis_options_.port);
}

absl::StatusOr<std::unique_ptr<PlannerDaemon>> PlannerDaemon::Start(const v1::JobConfig& config,
                                                                    const DaemonOptions& options) {
  VP_ASSIGN_OR_RETURN(std::unique_ptr<PlannerDaemon> d, Bind(config, options));
  VP_RETURN_IF_ERROR(d->Initialize());
  return d;
}

absl::StatusOr<std::unique_ptr<PlannerDaemon>> PlannerDaemon::Bind(const v1::JobConfig& config,
                                                                   const DaemonOptions& options) {
  if (options.max_calls < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_calls must be at least 1 (not ", options.max_calls, ")"));
  }
  std::unique_ptr<PlannerDaemon> d(new PlannerDaemon());
  d->config_ = config;
  d->options_ = options;
  d->started_ = absl::Now();
  d->planner_id_ =
      absl::StrCat(HostName(), ":", getpid(), ":", absl::ToUnixMillis(d->started_) % 100000000);
  // gRPC first: the port is taken (or found taken) before any slow work, and
  // the services answer "starting" until Initialize() is done.
  d->plan_service_ = std::make_unique<PlanServiceImpl>(d.get());
  d->status_service_ = std::make_unique<StatusServiceImpl>(d.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  VP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      ServerCredentialsFromFiles(options.tls));
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, so a second daemon on a taken port
  // would share it and clients would reach either job at random: off.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Bounded threads: each call of the synchronous server holds one.
  grpc::ResourceQuota quota("varipipe-planner");
  quota.SetMaxThreads(options.max_calls + kSpareThreads);
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(options.listen_address, credentials, &d->port_);
  builder.RegisterService(d->plan_service_.get());
  builder.RegisterService(d->status_service_.get());
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr || d->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen_address,
        " (--listen): the port is in use by another process, or the host is not an address "
        "of this machine"));
  }
  // The default health service starts out SERVING: not before Initialize().
  d->server_->GetHealthCheckService()->SetServingStatus(false);
  spdlog::info("planner {} listening on {} (port {}); starting", d->planner_id_,
               options.listen_address, d->port_);
  return d;
}

PlannerDaemon::CallScope::CallScope(PlannerDaemon* daemon) : daemon_(daemon) {
  absl::MutexLock lock(&daemon_->calls_mu_);
  ++daemon_->active_calls_;
}

PlannerDaemon::CallScope::~CallScope() {
  absl::MutexLock lock(&daemon_->calls_mu_);
  --daemon_->active_calls_;
}

absl::Status PlannerDaemon::CheckCancelled() const {
  if (!startup_cancelled_.load()) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("start-up stopped before ", step_.load()));
}

grpc::Status PlannerDaemon::CheckServing() const {
  if (shut_down_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("planner ", planner_id_, " is shutting down"));
  }
  if (ready_.load(std::memory_order_acquire)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("starting: ", step_.load(), " (planner ", planner_id_,
                                   " is not ready to serve yet; retry shortly)"));
}

absl::Status PlannerDaemon::Initialize() {
  VP_RETURN_IF_ERROR(ConnectStore());
  VP_RETURN_IF_ERROR(BuildPlanner());
  SetStep("starting the planning workers");
  VP_RETURN_IF_ERROR(CheckCancelled());
  StartWorkers();
  // Serving: every member the services read is set.
  SetStep("ready");
  ready_.store(true, std::memory_order_release);
  server_->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info(
      "planner {} serving job {} on {} (port {}, {}, job token required) with {} planning "
      "workers (store {}; ready {:.2f} s after start)",
      planner_id_, config_.job_id(), options_.listen_address, port_,
      options_.tls.enabled() ? "TLS" : "plaintext", worker_count_, store_address(),
      absl::ToDoubleSeconds(absl::Now() - started_));
  return absl::OkStatus();
}

// The store (an embedded redis-server without store.redis_address), the
// job registered in it and its token.
absl::Status PlannerDaemon::ConnectStore() {
  const v1::JobConfig& config = config_;
  const v1::StoreConfig& store = config.store();
  if (store.redis_address().empty()) {
    SetStep("starting the embedded redis-server");
    VP_RETURN_IF_ERROR(CheckCancelled());
    VP_ASSIGN_OR_RETURN(embedded_redis_, RedisServer::Start());
    spdlog::info("started an embedded redis-server {} on {} (single-machine mode)",
                 embedded_redis_->version(), embedded_redis_->address());
    redis_options_.host = embedded_redis_->host();
    redis_options_.port = embedded_redis_->port();
    redis_options_.password = embedded_redis_->password();
  } else {
    VP_ASSIGN_OR_RETURN(const auto host_port, ParseHostPort(store.redis_address()));
    redis_options_.host = host_port.first;
    redis_options_.port = host_port.second;
    VP_ASSIGN_OR_RETURN(redis_options_.password, ReadRedisPassword(store));
  }
  store_options_ = {.key_prefix = store.key_prefix(),
                    .job_id = config.job_id(),
                    .world_size = WorldSize(config),
                    .total_iterations = config.training().iterations(),
                    .lease = options_.lease};
  SetStep("connecting to the instruction store");
  VP_RETURN_IF_ERROR(CheckCancelled());
  absl::StatusOr<std::unique_ptr<RedisInstructionStore>> first =
      RedisInstructionStore::Open(redis_options_, store_options_);
  if (!first.ok()) return Annotate(first.status(), "instruction store");
  SetStep("registering the job");
  VP_RETURN_IF_ERROR(CheckCancelled());
  VP_RETURN_IF_ERROR((*first)->job().RegisterJob(config));
  std::string candidate = options_.token;
  if (candidate.empty()) {
    VP_ASSIGN_OR_RETURN(candidate, GenerateJobToken());
  }
  VP_ASSIGN_OR_RETURN(token_, (*first)->job().RegisterToken(candidate, !options_.token.empty()));
  verifier_ = CallTokenVerifier(token_);
  AddToPool(*std::move(first));
  return absl::OkStatus();
}

// The data, the sampler and the planner (its stage layout chosen when the
// config says AUTO).
absl::Status PlannerDaemon::BuildPlanner() {
  const v1::JobConfig& config = config_;
  SetStep("opening the dataset");
  VP_RETURN_IF_ERROR(CheckCancelled());
  VP_ASSIGN_OR_RETURN(dataset_, OpenSampleDataset(config));
  spdlog::info("dataset: {}", dataset_->Describe());
  // Ids outside model.vocab_size fail here, not when an executor reads them
  // (a scan per data file, cached beside its index).
  SetStep("checking the dataset's token ids");
  TokenScanOptions scan;
  scan.cancelled = [this] { return !CheckCancelled().ok(); };
  VP_RETURN_IF_ERROR(dataset_->CheckTokenIds(scan));
  const SamplerOptions sampler = SamplerOptionsFromConfig(config);
  VP_ASSIGN_OR_RETURN(sampler_, MiniBatchSampler::Create(dataset_->AllLengths(), sampler));
  SetStep("building the planner (cost models)");
  VP_RETURN_IF_ERROR(CheckCancelled());
  cost_model_device_ = CostModelDeviceOf(config);
  VP_ASSIGN_OR_RETURN(planner::Planner planner, planner::Planner::Create(config));
  WarnAboutTheCostModelsDevice();
  if (EffectiveLayoutMode(config.parallelism().stage_layout()) == v1::AUTO) {
    SetStep("choosing the stage layout (parallelism.stage_layout AUTO)");
    VP_RETURN_IF_ERROR(CheckCancelled());
    VP_ASSIGN_OR_RETURN(stage_layout_, AutoStageLayout(planner));
    planner = planner.WithStageLayout(stage_layout_);
  } else {
    VP_ASSIGN_OR_RETURN(stage_layout_, ConfiguredLayerLayout(config));
    spdlog::info("stage layout: {}", stage_layout_.ToString());
  }
  planner_ = std::make_unique<planner::Planner>(std::move(planner));
  return absl::OkStatus();
}

// The planning workers (planner.threads split between them) and the
// progress thread.
void PlannerDaemon::StartWorkers() {
  const v1::JobConfig& config = config_;
  worker_count_ = options_.worker_threads < 0   ? 0
                  : options_.worker_threads > 0 ? options_.worker_threads
                  : config.planner().threads() > 0
                      ? static_cast<int>(config.planner().threads())
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  // planner.threads is the daemon's share of cores: the workers split it for
  // the per-replica work of their iterations.
  planner::PlannerOptions planner_options = planner_->options();
  planner_options.threads =
      std::max(1, planner::PlannerThreads(config) / std::max(1, worker_count_));
  planner_->set_options(planner_options);
  {
    absl::MutexLock lock(&mu_);
    calibrated_ = std::make_shared<const planner::Planner>(*planner_);
  }
  for (int w = 0; w < worker_count_; ++w) {
    workers_.emplace_back([this, w] { WorkerLoop(w); });
  }
  if (options_.progress_interval > absl::ZeroDuration()) {
    progress_thread_ = std::thread([this] { ProgressLoop(); });
  }
}

PlannerDaemon::~PlannerDaemon() { Shutdown(); }

void PlannerDaemon::Shutdown() {
  if (shut_down_.exchange(true)) return;
  CancelStartup();
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    // New calls end at once (CheckServing) and calls waiting in the store
    // are woken to end the same way; the others get kCallGrace.
    absl::Notification calls_ended;
    std::thread waker([this, &calls_ended] { WakeWaitingCalls(calls_ended); });
    bool ended = false;
    {
      absl::MutexLock lock(&calls_mu_);
      ended =
          calls_mu_.AwaitWithTimeout(absl::Condition(
                                         +[](int* calls) { return *calls == 0; }, &active_calls_),
                                     kCallGrace);
    }
    calls_ended.Notify();
    waker.join();
    // gRPC's shutdown waits until every client closed its connection after
    // the GOAWAY, and an idle client (an executor between calls) may notice
    // it only seconds later: the deadline closes them. Once every call
    // returned, kFlushGrace lets their last answers go out first; the calls
    // still running are cancelled at once.
    const absl::Duration grace = ended ? kFlushGrace : absl::ZeroDuration();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  }
  for (std::thread& t : workers_) t.join();
  if (progress_thread_.joinable()) progress_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    pool_.clear();
    client_ids_.clear();
    open_connections_ = 0;
  }
  if (embedded_redis_ != nullptr) {
    if (absl::Status s = embedded_redis_->Stop(); !s.ok()) {
      spdlog::warn("embedded redis-server: {}", s.message());
    }
    embedded_redis_.reset();
  }
  spdlog::info("planner {} stopped", planner_id_);
}

void PlannerDaemon::WakeWaitingCalls(const absl::Notification& calls_ended) {
  // A call may enter a blocking read just after a round: repeat until every
  // call returned.
  constexpr absl::Duration kRound = absl::Milliseconds(50);
  std::unique_ptr<RedisClient> redis;
  do {
    std::vector<std::string> unblock = {"CLIENT", "UNBLOCK", ""};
    std::vector<std::vector<std::string>> commands;
    {
      absl::MutexLock lock(&mu_);
      for (const RedisInstructionStore* store : leased_) {
        const auto id = client_ids_.find(store);
        if (id == client_ids_.end() || id->second < 0) continue;
        unblock[2] = std::to_string(id->second);
        commands.push_back(unblock);
      }
    }
    if (commands.empty()) continue;
    if (redis == nullptr) {
      // One quick attempt: without Redis the waits end on their own.
      RedisClient::Options quick = redis_options_;
      quick.max_attempts = 1;
      quick.connect_timeout = std::min(quick.connect_timeout, absl::Milliseconds(500));
      quick.command_timeout = std::min(quick.command_timeout, absl::Seconds(1));
      absl::StatusOr<std::unique_ptr<RedisClient>> connected = RedisClient::Connect(quick);
      if (!connected.ok()) {
        spdlog::debug("cannot wake waiting calls: {}", connected.status().message());
        return;
      }
      redis = *std::move(connected);
    }
    if (absl::StatusOr<std::vector<RedisReply>> woken = redis->Pipeline(commands); !woken.ok()) {
      spdlog::debug("cannot wake waiting calls: {}", woken.status().message());
      return;
    }
  } while (!calls_ended.WaitForNotificationWithTimeout(kRound));
}

bool PlannerDaemon::WaitUntilJobComplete() {
  const uint64_t iterations = config_.training().iterations();
  while (!stop_.WaitForNotificationWithTimeout(kJobCompletePoll)) {
    absl::StatusOr<StoreLease> store = AcquireStore();
    if (!store.ok()) continue;
    // min_progress counts only once every rank reported (Counters()).
    absl::StatusOr<StoreCounters> c = (*store)->Counters();
    if (!c.ok() || c->min_progress < iterations) continue;
    spdlog::info("job complete: all {} executor ranks reported iteration {}, the last of {}",
                 store_options_.world_size, iterations - 1, iterations);
    return true;
  }
  return false;
}

void PlannerDaemon::WaitUntilAllPublished() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    absl::StatusOr<StoreLease> store = AcquireStore();
    if (!store.ok()) continue;
    absl::StatusOr<StoreCounters> c = (*store)->Counters();
    if (c.ok() && c->published >= config_.training().iterations()) return;
  }
}

absl::StatusOr<std::vector<std::string>> PlannerDaemon::PlanIteration(uint64_t iteration,
                                                                      std::string* summary,
                                                                      double* planning_ms,
                                                                      bool with_trace,
                                                                      std::string* trace) const {
  const SampledMiniBatch sampled = sampler_->Get(iteration);
  planner::MiniBatch mb{
      .iteration = iteration, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths};
  const std::shared_ptr<const planner::Planner> planner = CalibratedPlanner();
  VP_ASSIGN_OR_RETURN(planner::PlanningResult result, planner->Plan(mb, with_trace));
  const planner::PlanReport& r = result.report;
  *planning_ms = r.total_ms;
  *summary = absl::StrFormat(
      R"({"iteration":%d,"epoch":%d,"samples":%d,"partition_method":"%s","setting":"%s",)"
      R"("schedule":"%s",)"
      R"("recompute":"%s","micro_batches":%d,"predicted_iteration_ms":%.3f,)"
      R"("predicted_makespan_ms":%.3f,"calibration_version":%d,)"
      R"("bubble_fraction":%.4f,"padding_efficiency":%.4f,"planning_ms":%.3f,"planner":"%s"})",
      iteration, sampled.epoch, sampled.sample_ids.size(), r.partition_method, r.setting,
      r.schedule, r.recompute, r.micro_batches, r.predicted_iteration_ms, r.predicted_makespan_ms,
      r.calibration_version, r.bubble_fraction, r.padding_efficiency, r.total_ms, planner_id_);
  if (trace != nullptr) *trace = r.chrome_trace;
  std::vector<std::string> envelopes;
  for (v1::ExecutionPlan& plan : result.plans) {
    v1::PlanEnvelope envelope;
    *envelope.mutable_plan() = std::move(plan);
    envelope.set_planner_id(planner_id_);
    envelope.set_planning_ms(r.total_ms);
    envelopes.push_back(envelope.SerializeAsString());
  }
  return envelopes;
}

absl::StatusOr<LayerLayout> PlannerDaemon::AutoStageLayout(const planner::Planner& planner) {
  const v1::ParallelismConfig& p = config_.parallelism();
  const LayerCounts counts = LayerCountsOf(config_.model());
  const uint32_t stages = std::max(1u, p.pipeline()) * std::max(1u, p.virtual_chunks());
  const auto parse = [&](const v1::StageLayoutConfig& stored) -> absl::StatusOr<LayerLayout> {
    if (stored.mode() == v1::EVEN) return EvenLayerLayout(counts, stages);
    return ListedLayerLayout(stored, counts, stages, "the instruction store's stage_layout");
  };
  VP_ASSIGN_OR_RETURN(StoreLease store, AcquireStore());
  absl::StatusOr<v1::StageLayoutConfig> stored = store->job().LoadStageLayout();
  if (stored.ok()) {
    VP_ASSIGN_OR_RETURN(LayerLayout layout, parse(*stored));
    spdlog::info("stage layout (AUTO): {}, as the instruction store records it", layout.ToString());
    return layout;
  }
  if (!absl::IsNotFound(stored.status())) return stored.status();
  // The job's first mini-batches stand for its length distribution.
  std::vector<planner::MiniBatch> sample;
  for (uint64_t i = 0;
       i < std::min<uint64_t>(planner::kLayoutSampleMiniBatches, config_.training().iterations());
       ++i) {
    const SampledMiniBatch sampled = sampler_->Get(i);
    sample.push_back(
        {.iteration = i, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths});
  }
  spdlog::info("choosing the stage layout (AUTO) over {} sampled mini-batches", sample.size());
  VP_ASSIGN_OR_RETURN(const planner::LayoutChoice choice,
                      planner::ChooseStageLayout(planner, sample));
  for (absl::string_view line : absl::StrSplit(choice.Describe(), '\n')) {
    spdlog::info("{}", line);
  }
  VP_ASSIGN_OR_RETURN(const v1::StageLayoutConfig recorded,
                      store->job().RegisterStageLayout(LayerLayoutToConfig(choice.chosen)));
  VP_ASSIGN_OR_RETURN(LayerLayout layout, parse(recorded));
  if (!(layout == choice.chosen)) {
    spdlog::info("stage layout (AUTO): another daemon recorded {} first; this daemon follows it",
                 layout.ToString());
  }
  return layout;
}

std::shared_ptr<const planner::Planner> PlannerDaemon::CalibratedPlanner() const {
  absl::MutexLock lock(&mu_);
  return calibrated_;
}

absl::Status PlannerDaemon::RefreshCalibration(RedisInstructionStore& store) {
  if (!config_.planner().online_calibration()) return absl::OkStatus();
  VP_ASSIGN_OR_RETURN(const v1::CalibrationState state, store.calibration().LoadCalibration());
  if (CalibratedPlanner()->calibration().version() == state.version()) return absl::OkStatus();
  auto planner = std::make_shared<const planner::Planner>(planner_->WithCalibration(state));
  spdlog::info("calibration version {} ({} iterations reported): {}", state.version(),
               state.iterations(),
               planner->calibration_scales().Describe(config_.model().kind() == v1::T5));
  absl::MutexLock lock(&mu_);
  // Versions only grow; a worker that read an older state keeps the newer.
  if (calibrated_->calibration().version() < state.version()) calibrated_ = std::move(planner);
  return absl::OkStatus();
}

void PlannerDaemon::WarnAboutTheCostModelsDevice() const {
  if (!cost_model_device_.analytic) return;
  spdlog::warn(
      "no profile: planning with {}, whose times and memory hold only for executors on that "
      "GPU; executors on another device (a CPU run in particular) get predictions that are "
      "far off and say so at start-up. {}",
      cost_model_device_.source, HowToProfile());
}

void PlannerDaemon::WarnOnFarOffPrediction(const v1::ReportProgressRequest& report) {
  const double ratio = report.iteration_ms() / report.predicted_iteration_ms();
  if (ratio < 1.0 / kFarOffPrediction || ratio > kFarOffPrediction) {
    if (far_off_warned_.exchange(true)) return;
    spdlog::warn(
        "iteration {} took {:.1f} ms on rank 0 against {:.3f} ms predicted ({:.3g}x): {} does "
        "not describe the executors' device. {}",
        report.iteration(), report.iteration_ms(), report.predicted_iteration_ms(), ratio,
        cost_model_device_.source, HowToProfile());
  }
}

absl::Status PlannerDaemon::LearnFromReport(RedisInstructionStore& store,
                                            const v1::ReportProgressRequest& report) {
  if (report.rank() == 0 && report.predicted_iteration_ms() > 0 && report.iteration_ms() > 0) {
    WarnOnFarOffPrediction(report);
    VP_RETURN_IF_ERROR(store.calibration().RecordPrediction(
        {report.iteration(), report.predicted_iteration_ms(), report.iteration_ms()}));
  }
  if (!config_.planner().online_calibration()) return absl::OkStatus();
  std::vector<planner::PassTiming> passes;
  for (const v1::MicroBatchTiming& t : report.timings()) {
    passes.push_back({.stage = t.stage(),
                      .measured_forward_ms = t.forward_ms(),
                      .measured_backward_ms = t.backward_ms(),
                      .profiled_forward_ms = t.profiled_forward_ms(),
                      .profiled_backward_ms = t.profiled_backward_ms()});
  }
  const planner::CalibrationReport folded{
      .iteration = report.iteration(),
      .passes = passes,
      .measured_all_reduce_ms = report.all_reduce_ms(),
      .measured_optimizer_ms = report.optimizer_ms(),
      .profiled_all_reduce_ms = report.profiled_all_reduce_ms(),
      .profiled_optimizer_ms = report.profiled_optimizer_ms(),
      // Rank 0's iteration, the one the error statistics compare.
      .measured_iteration_ms = report.rank() == 0 ? report.iteration_ms() : 0,
      .predicted_iteration_ms = report.rank() == 0 ? report.predicted_iteration_ms() : 0,
      .predicted_overhead_ms = report.predicted_overhead_ms(),
      .plan_calibration_version = report.calibration_version()};
  return store.calibration().UpdateCalibration(
      [&](v1::CalibrationState* state) { return planner::FoldReport(folded, state); });
}

absl::Status PlannerDaemon::PlanAndPublish(RedisInstructionStore& store, uint64_t iteration) {
  const absl::Time start = absl::Now();
  if (absl::Status s = RefreshCalibration(store); !s.ok()) {
    spdlog::warn("iteration {}: planning without the job's calibration state: {}", iteration,
                 s.message());
  }
  std::string summary;
  double planning_ms = 0;
  absl::StatusOr<std::vector<std::string>> envelopes =
      PlanIteration(iteration, &summary, &planning_ms);
  if (!envelopes.ok()) return Annotate(envelopes.status(), absl::StrCat("iteration ", iteration));
  VP_ASSIGN_OR_RETURN(bool published,
                      store.plans().Publish(iteration, *envelopes, summary, planner_id_));
  absl::MutexLock lock(&mu_);
  busy_ms_ += absl::ToDoubleMilliseconds(absl::Now() - start);
  if (published) {
    RecordPlanned(config_.job_id(), planning_ms / 1e3);
    ++planned_;
    plan_ms_.push_back(planning_ms);
    if (plan_ms_.size() > 1000) plan_ms_.erase(plan_ms_.begin(), plan_ms_.begin() + 500);
  } else {
    spdlog::info("iteration {} was published by another planner (lease lost)", iteration);
  }
  return absl::OkStatus();
}

absl::Status PlannerDaemon::PlanOnDemand(uint64_t iteration) {
  VP_ASSIGN_OR_RETURN(StoreLease store, AcquireStore());
  VP_ASSIGN_OR_RETURN(const auto progress, store->progress().Progress());
  if (!progress.empty()) {
    uint64_t slowest = ~uint64_t{0};
    for (const auto& [rank, completed] : progress) slowest = std::min(slowest, completed);
    if (iteration > slowest + 1 + config_.planner().plan_ahead()) {
      spdlog::debug("not planning iteration {} on demand: beyond the window ({} + 1 + {})",
                    iteration, slowest, config_.planner().plan_ahead());
      return absl::OkStatus();
    }
  }
  VP_ASSIGN_OR_RETURN(bool claimed, store->plans().ClaimIteration(iteration, planner_id_));
  if (!claimed) return absl::OkStatus();
  spdlog::info("planning iteration {} on demand", iteration);
  return PlanAndPublish(*store, iteration);
}

void PlannerDaemon::WorkerLoop(int worker) {
  std::unique_ptr<RedisInstructionStore> store;
  while (!stop_.HasBeenNotified()) {
    if (store == nullptr) {
      absl::StatusOr<std::unique_ptr<RedisInstructionStore>> opened =
          RedisInstructionStore::Open(redis_options_, store_options_);
      if (!opened.ok()) {
        RecordRedisError(config_.job_id());
        {
          absl::MutexLock lock(&mu_);
          store_healthy_ = false;
          last_error_ = std::string(opened.status().message());
        }
        stop_.WaitForNotificationWithTimeout(absl::Seconds(1));
        continue;
      }
      store = *std::move(opened);
      // Redis may have lost the job (restarted without persistence).
      if (absl::Status s = store->job().RegisterJob(config_); !s.ok()) {
        spdlog::error("worker {}: {}", worker, s.message());
      } else if (absl::StatusOr<std::string> token = store->job().RegisterToken(token_, false);
                 !token.ok()) {
        spdlog::error("worker {}: {}", worker, token.status().message());
      } else if (*token != token_) {
        spdlog::error("worker {}: the store holds another token for job {} than this daemon's",
                      worker, config_.job_id());
      }
    }
    absl::StatusOr<StoreCounters> counters = store->Counters();
    absl::StatusOr<std::optional<uint64_t>> claim =
        counters.ok() ? store->plans().Claim(
                            planner_id_, counters->min_progress + config_.planner().plan_ahead())
                      : absl::StatusOr<std::optional<uint64_t>>(counters.status());
    if (!claim.ok()) {
      RecordRedisError(config_.job_id());
      {
        absl::MutexLock lock(&mu_);
        store_healthy_ = false;
        ++errors_;
        last_error_ = std::string(claim.status().message());
      }
      spdlog::warn("worker {}: {}", worker, claim.status().message());
      store.reset();  // reconnect (and re-register) next round
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(200));
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      store_healthy_ = true;
    }
    if (!claim->has_value()) {
      stop_.WaitForNotificationWithTimeout(options_.idle_wait);
      continue;
    }
    RecordClaimed(config_.job_id());
    if (absl::Status s = PlanAndPublish(*store, **claim); !s.ok()) {
      absl::MutexLock lock(&mu_);
      ++errors_;
      last_error_ = std::string(s.message());
      spdlog::error("worker {}: {}", worker, s.message());
    }
  }
}

void PlannerDaemon::ProgressLoop() {
  uint64_t last_planned = 0;
  absl::Time last = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(options_.progress_interval)) {
    const v1::PlannerStatus s = Status();
    const absl::Time now = absl::Now();
    const double rate = (s.iterations_planned() - last_planned) / absl::ToDoubleSeconds(now - last);
    last_planned = s.iterations_planned();
    last = now;
    absl::StatusOr<StoreLease> store = AcquireStore();
    uint64_t progress = 0;
    if (store.ok()) {
      absl::StatusOr<StoreCounters> c = (*store)->Counters();
      if (c.ok()) progress = c->min_progress;
    }
    spdlog::info(
        "planned {} ({:.1f}/s), published {} of {}, plan time p50 {:.1f} ms p99 {:.1f} ms, "
        "executors at {} (lead {}), errors {}",
        s.iterations_planned(), rate, s.iterations_published(), config_.training().iterations(),
        s.plan_time_p50_ms(), s.plan_time_p99_ms(), progress,
        s.iterations_published() - std::min(progress, s.iterations_published()), s.errors());
  }
}

v1::PlannerStatus PlannerDaemon::Status() const {
  v1::PlannerStatus s;
  s.set_planner_id(planner_id_);
  s.set_job_id(config_.job_id());
  s.set_host(HostName());
  s.set_worker_threads(worker_count_);
  s.set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  {
    absl::MutexLock lock(&mu_);
    s.set_iterations_planned(planned_);
    s.set_plan_time_p50_ms(Percentile(plan_ms_, 0.5));
    s.set_plan_time_p99_ms(Percentile(plan_ms_, 0.99));
    s.set_errors(errors_);
    s.set_last_error(last_error_);
    s.set_store_healthy(store_healthy_);
    s.set_worker_utilization(s.uptime_s() > 0 ? busy_ms_ / 1e3 / (s.uptime_s() * worker_count_)
                                              : 0);
  }
  absl::StatusOr<StoreLease> store = const_cast<PlannerDaemon*>(this)->AcquireStore();
  if (store.ok()) {
    if (absl::StatusOr<std::vector<PredictionRecord>> p = (*store)->calibration().Predictions();
        p.ok()) {
      std::vector<double> errors;
      for (const PredictionRecord& r : *p) {
        if (errors.size() == kPredictionErrorIterations) break;
        if (r.measured_ms > 0)
          errors.push_back(std::abs(r.predicted_ms - r.measured_ms) / r.measured_ms);
      }
      s.set_prediction_error_iterations(static_cast<uint32_t>(errors.size()));
      s.set_prediction_error_p50(Percentile(errors, 0.5));
      s.set_prediction_error_p90(Percentile(errors, 0.9));
    }
    if (absl::StatusOr<v1::CalibrationState> c = (*store)->calibration().LoadCalibration();
        c.ok()) {
      *s.mutable_calibration() = *c;
      s.set_calibration_scales(planner_->WithCalibration(*c).calibration_scales().Describe(
          config_.model().kind() == v1::T5));
    }
    absl::StatusOr<StoreCounters> c = (*store)->Counters();
    if (c.ok()) {
      s.set_iterations_published(c->published);
      s.set_iterations_acknowledged(c->acknowledged);
      s.set_queue_depth(static_cast<uint32_t>(c->unpublished));
    } else {
      s.set_store_healthy(false);
    }
  } else {
    s.set_store_healthy(false);
  }
  return s;
}

}  // namespace varipipe::service
