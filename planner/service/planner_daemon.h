// The planner daemon: plans a job's iterations ahead of its executors and
// serves the plans over gRPC (docs/operations.md).
//
// Layout: N worker threads (one Redis connection each) claim iterations
// through the instruction store, draw the iteration's mini-batch from the
// deterministic sampler, plan it (planner/planner.h: validated plans),
// and publish every rank's plan. A gRPC server answers PlanService and
// StatusService from the store, plus the standard health service and server
// reflection. With no store.redis_address the daemon starts a private
// redis-server (random password, no persistence) and stops it on shutdown.
// PlanService and StatusService calls must carry the job token
// (docs/security.md); the port is never shared with another process.
//
// Start-up comes in two steps: Bind() listens on the port at once (a taken
// port fails in milliseconds), and Initialize() does the slow work (Redis,
// registration, the dataset, the planner). Until it is done, calls end with
// UNAVAILABLE ("starting: ...") and the health service says NOT_SERVING.
//
// Thread safety: Bind/Initialize/Start/Shutdown from one thread (the one
// that outlives the embedded redis-server: RedisServer's death signal
// follows it); CancelStartup(), Status() and the serving checks from any.
#ifndef VARIPIPE_PLANNER_SERVICE_PLANNER_DAEMON_H_
#define VARIPIPE_PLANNER_SERVICE_PLANNER_DAEMON_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/config/cost_model_device.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/grpc/call_token.h"
#include "common/grpc/tls_files.h"
#include "common/redis/redis_client.h"
#include "common/redis/redis_server_process.h"
#include "planner/planner.h"
#include "planner/service/redis_instruction_store.h"
#include "varipipe/v1/service.pb.h"

namespace grpc {
class Server;
}

namespace varipipe::service {

class PlanServiceImpl;
class StatusServiceImpl;

struct DaemonOptions {
  // gRPC listen address; port 0 picks a free one (see port()).
  std::string listen_address = "127.0.0.1:0";
  // Planning workers; 0: planner.threads from the config, else cores - 1;
  // negative: none (plans are then made on demand only; for tests).
  int worker_threads = 0;
  // How long a worker waits before asking again when back-pressure or the
  // end of the job stops it.
  absl::Duration idle_wait = absl::Milliseconds(50);
  absl::Duration lease = absl::Seconds(30);
  // Progress log interval; zero disables.
  absl::Duration progress_interval = absl::Seconds(10);
  // The job token clients must present (--token_file); empty: the one the
  // store holds, generated when the job has none yet.
  std::string token;
  // TLS for the gRPC server (--tls_cert, --tls_key, --tls_ca); none: plaintext.
  TlsFiles tls = {};
  // Calls that may wait for a plan (GetPlan, WatchPlans) at once; more get
  // RESOURCE_EXHAUSTED. The server's threads are capped at max_calls +
  // kSpareThreads (a gRPC resource quota), the store connections the calls
  // use at max_calls + kSpareConnections.
  int max_calls = 1024;
};

class PlannerDaemon {
 public:
  // Server threads beyond max_calls, for the calls that do not wait.
  static constexpr int kSpareThreads = 16;
  // Store connections beyond max_calls (on-demand planning, status calls);
  // idle ones beyond kIdleConnections are closed.
  static constexpr int kSpareConnections = 16;
  static constexpr int kIdleConnections = 8;
  // On Shutdown(): how long the calls running get to return (calls waiting
  // for a plan or a report are woken at once), and then how long their last
  // answers get before the connections are closed.
  static constexpr absl::Duration kCallGrace = absl::Seconds(2);
  static constexpr absl::Duration kFlushGrace = absl::Milliseconds(200);
  // Iterations the status's prediction error percentiles cover.
  static constexpr size_t kPredictionErrorIterations = 20;
  // A measured iteration this many times longer (or shorter) than predicted
  // means the cost model describes another device: warned once.
  static constexpr double kFarOffPrediction = 10;
  // How often WaitUntilJobComplete() reads the store.
  static constexpr absl::Duration kJobCompletePoll = absl::Milliseconds(250);

  // Bind() then Initialize(): a daemon ready to serve.
  static absl::StatusOr<std::unique_ptr<PlannerDaemon>> Start(const v1::JobConfig& config,
                                                              const DaemonOptions& options);
  // Starts the gRPC server on options.listen_address before any slow work,
  // so a taken port (or bad TLS files) fails at once; the server answers
  // "starting" (see CheckServing()) until Initialize() succeeds.
  static absl::StatusOr<std::unique_ptr<PlannerDaemon>> Bind(const v1::JobConfig& config,
                                                             const DaemonOptions& options);
  // The slow part of start-up: connects to (or starts) Redis, registers the
  // job (refusing a different config or token), opens the dataset, builds
  // the planner and starts the workers; then the daemon serves (health
  // SERVING). CANCELLED when CancelStartup() came first (checked between the
  // steps). Call once, after Bind().
  absl::Status Initialize();
  // Makes a running (or later) Initialize() stop at its next step. Quick;
  // any thread (e.g. a shutdown-signal callback).
  void CancelStartup() { startup_cancelled_.store(true); }
  // What start-up is doing now, for messages ("ready" once done).
  const char* startup_step() const { return step_.load(); }
  ~PlannerDaemon();

  // Stops the server (waiting calls end with UNAVAILABLE), the workers
  // (finishing the iteration each is planning) and the embedded Redis.
  // Idempotent.
  void Shutdown();
  // True once Shutdown() began.
  bool stopping() const { return shut_down_.load(); }
  // OK when the daemon serves; UNAVAILABLE "starting: <step>" during
  // start-up and "shutting down" once Shutdown() began. Every PlanService
  // and StatusService call checks it first.
  grpc::Status CheckServing() const;
  // Counts a PlanService or StatusService call while it runs: Shutdown()
  // waits (up to kCallGrace) for the calls to return. Every call holds one.
  class CallScope {
   public:
    explicit CallScope(PlannerDaemon* daemon);
    ~CallScope();
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    PlannerDaemon* const daemon_;
  };
  // Blocks until every iteration of the job is published or Shutdown().
  void WaitUntilAllPublished();
  // Blocks until every executor rank of the job reported (acknowledged) the
  // job's last iteration, read from the shared store (so each of several
  // daemons sharing a job sees it), then logs "job complete" and returns
  // true; false once Shutdown() began first.
  bool WaitUntilJobComplete();

  int port() const { return port_; }
  const std::string& planner_id() const { return planner_id_; }
  std::string store_address() const;
  const std::string& store_password() const { return redis_options_.password; }
  // The job token clients present (the store's, or DaemonOptions::token).
  const std::string& token() const { return token_; }
  // OK when the call carries the job token; UNAUTHENTICATED otherwise.
  grpc::Status Authenticate(const grpc::ServerContext& context) const {
    return verifier_.Verify(context);
  }
  v1::PlannerStatus Status() const;

  // Used by the gRPC services.
  const v1::JobConfig& config() const { return config_; }
  // The planner as configured (profiled cost model, no calibration).
  const planner::Planner& planner() const { return *planner_; }
  // The stage layout the job's plans follow (ready once serving).
  const LayerLayout& stage_layout() const { return stage_layout_; }
  // The planner with the calibration state last read from the store.
  std::shared_ptr<const planner::Planner> CalibratedPlanner() const;
  // Reads the job's calibration state and, when it changed, rebuilds the
  // calibrated planner (docs/cost-model.md, "Calibration").
  absl::Status RefreshCalibration(RedisInstructionStore& store);
  // parallelism.stage_layout AUTO: the layout the store records, or this
  // daemon's choice (ChooseStageLayout over the first sampled mini-batches)
  // recorded for the job's other daemons and executors.
  absl::StatusOr<LayerLayout> AutoStageLayout(const planner::Planner& planner);
  // Folds an accepted progress report into the job's calibration state
  // (when planner.online_calibration) and records rank 0's prediction error.
  absl::Status LearnFromReport(RedisInstructionStore& store,
                               const v1::ReportProgressRequest& report);
  const MiniBatchSampler& sampler() const { return *sampler_; }
  // A store connection for one request; returned to the pool when released.
  // RESOURCE_EXHAUSTED when max_calls + kSpareConnections are in use.
  class StoreLease;
  absl::StatusOr<StoreLease> AcquireStore();
  // Admits a call that may wait (false when max_calls already wait); every
  // admitted call ends with LeaveWait().
  bool EnterWait();
  void LeaveWait() { waiting_calls_.fetch_sub(1); }
  int max_calls() const { return options_.max_calls; }
  // Plans and publishes `iteration` now if nobody else is (on-demand), and
  // only inside the planning window: at most planner.plan_ahead iterations
  // beyond the next iteration of the slowest rank that reported progress
  // (any iteration while no rank has reported: a new job, or a store that
  // lost its data). Outside it, nothing is planned (the caller waits).
  absl::Status PlanOnDemand(uint64_t iteration);
  // Builds the PlanEnvelopes and summary of an iteration (no store access).
  absl::StatusOr<std::vector<std::string>> PlanIteration(uint64_t iteration, std::string* summary,
                                                         double* planning_ms,
                                                         bool with_trace = false,
                                                         std::string* trace = nullptr) const;

 private:
  PlannerDaemon() = default;
  // The start-up step now running (for CheckServing and logs).
  void SetStep(const char* step) { step_.store(step); }
  // Initialize()'s steps.
  absl::Status ConnectStore();
  absl::Status BuildPlanner();
  void StartWorkers();
  absl::Status CheckCancelled() const;
  void WorkerLoop(int worker);
  void ProgressLoop();
  absl::Status PlanAndPublish(RedisInstructionStore& store, uint64_t iteration);
  // Start-up: a warning when the analytic model (no profile) plans the job.
  void WarnAboutTheCostModelsDevice() const;
  // Once per daemon: rank 0's iteration far from its prediction.
  void WarnOnFarOffPrediction(const v1::ReportProgressRequest& report);
  // A new pooled connection: records its Redis client id.
  void AddToPool(std::unique_ptr<RedisInstructionStore> store) ABSL_LOCKS_EXCLUDED(mu_);
  // During Shutdown(), until `calls_ended`: wakes the calls blocked in the
  // store (GetPlan, WatchPlans) with CLIENT UNBLOCK on their leased
  // connections, so they see stopping() at once instead of at the end of
  // their wait slice.
  void WakeWaitingCalls(const absl::Notification& calls_ended);

  // Constant once Initialize() succeeded (config_, options_, planner_id_,
  // started_, server_, port_ once Bind() returned); the services read the
  // others only after ready_.
  v1::JobConfig config_;
  DaemonOptions options_;
  std::string planner_id_;
  RedisClient::Options redis_options_;
  StoreOptions store_options_;
  std::string token_;
  CallTokenVerifier verifier_{""};
  std::unique_ptr<RedisServer> embedded_redis_;
  std::unique_ptr<SampleDataset> dataset_;
  std::unique_ptr<MiniBatchSampler> sampler_;
  std::unique_ptr<planner::Planner> planner_;
  CostModelDevice cost_model_device_;
  LayerLayout stage_layout_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PlanServiceImpl> plan_service_;
  std::unique_ptr<StatusServiceImpl> status_service_;
  int port_ = 0;
  int worker_count_ = 0;
  absl::Time started_;

  absl::Notification stop_;
  std::vector<std::thread> workers_;
  std::thread progress_thread_;
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> far_off_warned_{false};
  std::atomic<int> waiting_calls_{0};
  // Start-up: what Initialize() is doing (a string literal), whether it was
  // asked to stop, and whether it is done: ready_ is set (release) once the
  // members above are constant, so a call that sees it (acquire) may read
  // them.
  std::atomic<const char*> step_{"binding the port"};
  std::atomic<bool> startup_cancelled_{false};
  std::atomic<bool> ready_{false};
  // Calls running (CallScope).
  absl::Mutex calls_mu_;
  int active_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<RedisInstructionStore>> pool_ ABSL_GUARDED_BY(mu_);
  int open_connections_ ABSL_GUARDED_BY(mu_) = 0;  // pooled and leased
  // Redis client ids (CLIENT ID) of the open connections, and the leased ones.
  std::map<const RedisInstructionStore*, int64_t> client_ids_ ABSL_GUARDED_BY(mu_);
  std::set<const RedisInstructionStore*> leased_ ABSL_GUARDED_BY(mu_);
  std::vector<double> plan_ms_ ABSL_GUARDED_BY(mu_);  // recent planning times
  uint64_t planned_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool store_healthy_ ABSL_GUARDED_BY(mu_) = true;
  double busy_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const planner::Planner> calibrated_ ABSL_GUARDED_BY(mu_);
};

// A pooled store connection, returned on destruction.
class PlannerDaemon::StoreLease {
 public:
  StoreLease(PlannerDaemon* daemon, std::unique_ptr<RedisInstructionStore> store)
      : daemon_(daemon), store_(std::move(store)) {}
  StoreLease(StoreLease&&) = default;
  ~StoreLease();
  RedisInstructionStore* operator->() { return store_.get(); }
  RedisInstructionStore& operator*() { return *store_; }

 private:
  PlannerDaemon* daemon_;
  std::unique_ptr<RedisInstructionStore> store_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_PLANNER_DAEMON_H_
