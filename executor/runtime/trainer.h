// One rank's training run (varipipe-executor): the rank's model stages and
// optimizer, its transports, then its iterations one by one. Each iteration
// fetches and checks its plan, runs it and writes a checkpoint when one is
// due; reducing its totals over every rank and reporting them (status board,
// planner daemon, metrics, log) run on the reporter's thread while the next
// iteration starts (iteration_reporter.h). The launch (rendezvous,
// heartbeats, peer watch) is the caller's (executor_main.cc).
#ifndef VARIPIPE_EXECUTOR_RUNTIME_TRAINER_H_
#define VARIPIPE_EXECUTOR_RUNTIME_TRAINER_H_

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "common/config/rank_layout.h"
#include "common/dataset/sample_dataset.h"
#include "common/shutdown_signal.h"
#include "executor/comm/transport_factory.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/checkpoint.h"
#include "executor/runtime/device.h"
#include "executor/runtime/executor_status_service.h"
#include "executor/runtime/iteration_reporter.h"
#include "executor/runtime/launch_env.h"
#include "executor/runtime/optimizer_sharding.h"
#include "executor/runtime/plan_interpreter.h"
#include "executor/runtime/plan_source.h"
#include "executor/runtime/rank_transports.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"
#include "varipipe/v1/service.pb.h"

namespace varipipe::executor {

// What the command line adds to the job config (varipipe-executor --help).
struct TrainerOptions {
  uint64_t first_iteration = 0;
  uint64_t iterations = 0;  // 0: up to training.iterations
  bool resume = true;
  bool device_timing = true;
  // --profile_iteration: this iteration runs under LibTorch's profiler and
  // its trace goes to `profile_dir` (iteration_trace.h); -1: none.
  int64_t profile_iteration = -1;
  std::string profile_dir = ".";
  // --cuda_sync_debug_iteration: LibTorch warns at every synchronising CUDA
  // call during this iteration; -1: never.
  int64_t cuda_sync_debug_iteration = -1;
  std::string metrics_jsonl;    // rank 0 appends one JSON line per iteration
  std::string save_parameters;  // prefix of each rank's parameters file
  std::string export_hf;        // Hugging Face checkpoint folder
  // --loss_chunk_tokens: ModelStage::set_loss_chunk_tokens; 0: the default.
  int64_t loss_chunk_tokens = 0;
};

// Where the rank runs and whom it serves; every reference outlives Run.
struct TrainerContext {
  const v1::JobConfig& config;
  const LaunchEnv& env;
  const RankCoordinates& coordinates;
  const DeviceChoice& device;
  ShutdownSignal& shutdown;
  PlanSource& source;
  const TransportOptions& transport_options;
  RankTransports& transports;
  ExecutorStatusBoard& board;
};

class Trainer {
 public:
  Trainer(const TrainerOptions& options, const TrainerContext& context);

  // Builds everything, runs the iterations, saves and exports what the
  // options ask for. CANCELLED (shutdown) or ABORTED (a peer failed) between
  // iterations; otherwise the first failure, naming its iteration.
  absl::Status Run();

 private:
  // The iteration's sums over every rank.
  struct Totals {
    double loss = 0;
    double real_tokens = 0;
    double padded_tokens = 0;
    double step_seconds = 0;
  };
  // This launch's iterations, for the summary (every rank keeps it).
  struct RunRecord {
    uint64_t iterations = 0;  // run in this launch
    uint64_t first = 0;
    uint64_t last = 0;
    double first_loss = 0;
    double last_loss = 0;
    // Real tokens and step seconds: all iterations, and those after the
    // launch's first (which warms up).
    double tokens = 0;
    double seconds = 0;
    double warm_tokens = 0;
    double warm_seconds = 0;
  };

  absl::Status BuildStages();
  absl::Status LoadHuggingFaceWeights();
  absl::Status MakeOptimizer();
  absl::Status Meet();
  void MakeInterpreter();
  absl::Status OpenMetrics();
  absl::Status Resume();

  absl::Status RunIterations();
  absl::Status RunIteration(uint64_t iteration);
  absl::StatusOr<CheckedPlan> FetchPlan(uint64_t iteration);
  // What the training thread knows of an iteration once it ran; the
  // reporter's thread makes the report from it alone.
  struct RanIteration {
    uint64_t iteration = 0;
    std::shared_ptr<const v1::ExecutionPlan> plan;
    IterationStats stats;
    // From the iteration's start (before its plan was fetched) until its
    // last pass and optimizer step were queued.
    double step_seconds = 0;
    // Read by the training thread when the iteration returned (host-side
    // counters: no device wait).
    int64_t peak_bytes = 0;
    int64_t reserved_bytes = 0;
    int64_t current_bytes = 0;
    int64_t optimizer_state_bytes = 0;
  };
  // The reporter's job for one iteration: Reduce, then Report.
  absl::Status ReduceAndReport(const RanIteration& ran);
  // Over report_, on the reporter's thread.
  absl::StatusOr<Totals> Reduce(const IterationStats& stats, double step_seconds);
  absl::Status Report(const RanIteration& ran, const Totals& totals);
  v1::ReportProgressRequest Progress(uint64_t iteration, const v1::ExecutionPlan& plan,
                                     const IterationStats& stats, const Totals& totals,
                                     int64_t peak_bytes) const;
  void LogIteration(uint64_t iteration, const v1::ExecutionPlan& plan, const IterationStats& stats,
                    const Totals& totals, int64_t peak_bytes, int64_t reserved_bytes);
  absl::Status MaybeCheckpoint(uint64_t done);
  absl::Status WriteTrace(uint64_t iteration);

  absl::Status SaveParameters() const;
  absl::Status ExportHuggingFace();
  // Rank 0, at the end: what ran and where its outputs are (absolute).
  void LogSummary() const;

  const TrainerOptions options_;
  const TrainerContext c_;
  const uint32_t pp_;
  const uint32_t chunks_;
  std::unique_ptr<SampleDataset> dataset_;
  std::unique_ptr<MicroBatchLoader> loader_;
  ModelSpec spec_;
  LayerLayout layout_;
  std::vector<StageRole> roles_;
  std::vector<std::unique_ptr<ModelStage>> stages_;
  std::vector<ModelStage*> stage_list_;
  std::map<uint32_t, ModelStage*> by_id_;
  int64_t parameter_bytes_ = 0;
  RankOptimizer rank_optimizer_;
  std::shared_ptr<TensorGroup> tensor_;
  // parallelism.context > 1: this rank's context group; null otherwise.
  std::shared_ptr<TensorGroup> context_;
  // Global ranks; plan_transport_ and plan_host_ are their pipeline-rank
  // views (tensor_rank_transport.h), which the interpreter uses.
  Transport* transport_ = nullptr;
  Transport* host_ = nullptr;  // small host-side reductions
  // The iteration totals' all-reduce, driven by reporter_'s thread alone
  // (a Gloo transport of its own, so that its collectives never interleave
  // with the training thread's).
  Transport* report_ = nullptr;
  std::unique_ptr<IterationReporter> reporter_;
  std::unique_ptr<Transport> plan_transport_;
  std::unique_ptr<Transport> plan_host_;
  std::unique_ptr<PlanInterpreter> interpreter_;
  std::vector<int> world_;
  std::ofstream metrics_;  // the reporter's thread writes it
  uint64_t first_ = 0;
  uint64_t last_ = 0;
  std::unique_ptr<RankCheckpoints> checkpoints_;
  RunRecord record_;  // the reporter's thread writes it; read after Flush
  // --export_hf, once every rank's part is written (rank 0): what rank 0
  // found there.
  std::string export_complete_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_TRAINER_H_
