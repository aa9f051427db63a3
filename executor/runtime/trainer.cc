#include "executor/runtime/trainer.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/hf_checkpoint.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/status.h"
#include "executor/comm/tensor_rank_transport.h"
#include "executor/model/hf_export.h"
#include "executor/model/hf_weights.h"
#include "executor/runtime/counting_allocator.h"
#include "executor/runtime/executor_metrics.h"
#include "executor/runtime/fault_injection.h"
#include "executor/runtime/iteration_trace.h"
#include "executor/runtime/plan_check.h"
#include "executor/runtime/training_optimizer.h"
#include "spdlog/spdlog.h"

namespace varipipe::executor {

Trainer::Trainer(const TrainerOptions& options, const TrainerContext& context)
    : options_(options),
      c_(context),
      pp_(context.config.parallelism().pipeline()),
      chunks_(std::max<uint32_t>(1, context.config.parallelism().virtual_chunks())) {}

absl::Status Trainer::Run() {
  // CPUs: count tensor bytes (activation peaks per instruction), before any
  // model state exists.
  if (!c_.device.is_cuda) InstallCountingCpuAllocator();
  VP_RETURN_IF_ERROR(BuildStages());
  VP_RETURN_IF_ERROR(LoadHuggingFaceWeights());
  VP_RETURN_IF_ERROR(MakeOptimizer());
  VP_RETURN_IF_ERROR(Meet());
  MakeInterpreter();
  VP_RETURN_IF_ERROR(OpenMetrics());
  VP_RETURN_IF_ERROR(Resume());
  if (first_ >= last_ && c_.env.rank == 0) {
    spdlog::info("nothing to run: iterations {} to {} are done", first_, last_);
  }
  VP_RETURN_IF_ERROR(RunIterations());
  VP_RETURN_IF_ERROR(SaveParameters());
  VP_RETURN_IF_ERROR(ExportHuggingFace());
  if (c_.env.rank == 0) LogSummary();
  spdlog::info("done");
  return absl::OkStatus();
}

// The iterations; each one's report runs on the reporter's thread while the
// next one runs, and a failed report ends training at the next boundary.
// On a failure nothing after the failed iteration is reported, and the
// report in progress ends with report_ (aborted).
absl::Status Trainer::RunIterations() {
  reporter_ = std::make_unique<IterationReporter>(/*max_pending=*/2);
  absl::Status status = [this]() -> absl::Status {
    for (uint64_t iteration = first_; iteration < last_; ++iteration) {
      if (c_.shutdown.Requested()) {
        return absl::CancelledError(
            absl::StrCat("between iterations, before iteration ", iteration));
      }
      if (c_.transports.aborted()) {
        return absl::AbortedError(absl::StrCat("between iterations, before iteration ", iteration));
      }
      SetFaultIteration(iteration);
      if (absl::Status status = RunIteration(iteration); !status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("iteration ", iteration, " failed: ", status.message()));
      }
      if (absl::Status status = MaybeInjectFault(FaultPoint::kBetweenIterations); !status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("after iteration ", iteration, ": ", status.message()));
      }
    }
    // Every report made (the planner daemons count the last one to end the
    // job) before anything else happens.
    return reporter_->Flush();
  }();
  if (!status.ok()) {
    reporter_->Discard();
    report_->Abort(std::string(status.message()));
  }
  reporter_.reset();
  return status;
}

// The data, the model and this rank's stages (looped placement: stage s
// runs on pipeline rank s % pp).
absl::Status Trainer::BuildStages() {
  const v1::JobConfig& config = c_.config;
  VP_ASSIGN_OR_RETURN(dataset_, OpenSampleDataset(config));
  loader_ = std::make_unique<MicroBatchLoader>(dataset_.get(), SamplerOptionsFromConfig(config));
  VP_ASSIGN_OR_RETURN(spec_, ModelSpecFromConfig(config));
  VP_ASSIGN_OR_RETURN(layout_, StageLayoutOf(spec_, pp_ * chunks_));
  VP_ASSIGN_OR_RETURN(roles_, PipelineStageRoles(spec_, pp_ * chunks_));
  spdlog::info("stage layout {} ({} stages)", layout_.ToString(), layout_.stages());
  const torch::Device torch_device(c_.device.name);
  // This rank's part of every stage (its transport comes with Meet()).
  tensor_ = std::make_shared<TensorGroup>(c_.env.rank, static_cast<int>(spec_.tensor_parallel),
                                          spec_.sequence_parallel);
  if (spec_.tensor_parallel > 1) {
    spdlog::info("tensor parallelism: index {} of {} (global ranks {}){}", tensor_->index(),
                 tensor_->size(), absl::StrJoin(tensor_->ranks(), ","),
                 tensor_->sequence_parallel() ? ", sequence parallel" : "");
  }
  // The lanes of this rank's replica and pipeline rank, of its tensor
  // index: split micro-batches gather keys and values over them (its
  // transport comes with Meet()).
  if (spec_.context_parallel > 1) {
    const RankLayout ranks = RankLayout::Of(config.parallelism());
    std::vector<int> lanes;
    for (int r : ranks.ContextGroup(c_.coordinates.dp_rank, c_.coordinates.pp_rank)) {
      lanes.push_back(ranks.GlobalRank(r, static_cast<uint32_t>(c_.coordinates.tensor_index)));
    }
    context_ = std::make_shared<TensorGroup>(std::move(lanes), c_.coordinates.context_rank,
                                             "context-parallel");
    spdlog::info("context parallelism: lane {} of {} (global ranks {})", context_->index(),
                 context_->size(), absl::StrJoin(context_->ranks(), ","));
  }
  int64_t parameter_count = 0;
  for (uint32_t s = c_.coordinates.pp_rank; s < pp_ * chunks_; s += pp_) {
    auto stage = std::make_unique<ModelStage>(spec_, roles_[s], tensor_, context_);
    stage->to(torch_device);
    // --loss_chunk_tokens over training.loss_chunk_tokens; 0: the default.
    stage->set_loss_chunk_tokens(options_.loss_chunk_tokens > 0
                                     ? options_.loss_chunk_tokens
                                     : static_cast<int64_t>(config.training().loss_chunk_tokens()));
    for (const torch::Tensor& p : stage->parameters()) parameter_count += p.numel();
    spdlog::info("{} ({} parameters so far)", roles_[s].DebugString(), parameter_count);
    by_id_[s] = stage.get();
    stage_list_.push_back(stage.get());
    stages_.push_back(std::move(stage));
  }
  if (!options_.export_hf.empty() && !spec_.llama && !spec_.t5v11) {
    return absl::InvalidArgumentError(
        "--export_hf: only model.architecture LLAMA and T5V11 have a Hugging Face layout");
  }
  if (spec_.tensor_parallel > 1 && !options_.export_hf.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "--export_hf needs parallelism.tensor 1 (this job has ", spec_.tensor_parallel,
        "): the ranks do not gather their tensor-parallel parts at the end of a run; export "
        "from the run's checkpoints with varipipe-export-hf, which does"));
  }
  return absl::OkStatus();
}

// Hugging Face weights (training.init_from) over the initializer's: this
// rank's stages only, before the optimizer copies anything. A Varipipe
// checkpoint resumed later replaces them.
absl::Status Trainer::LoadHuggingFaceWeights() {
  const std::string& init_from = c_.config.training().init_from();
  if (init_from.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::StatusOr<HuggingFaceCheckpoint> opened = HuggingFaceCheckpoint::Open(init_from);
  if (!opened.ok()) return Annotate(opened.status(), "training.init_from");
  HuggingFaceCheckpoint checkpoint = *std::move(opened);
  VP_RETURN_IF_ERROR(CheckHuggingFaceConfig(checkpoint, spec_));
  VP_RETURN_IF_ERROR(executor::LoadHuggingFaceWeights(checkpoint, spec_, stage_list_));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  spdlog::info(
      "loaded this rank's weights from Hugging Face checkpoint {}: {} bytes from {} "
      "file(s) in {:.2f} s ({:.0f} MB/s)",
      init_from, checkpoint.bytes_read(), checkpoint.opened_files().size(), seconds,
      static_cast<double>(checkpoint.bytes_read()) / 1e6 / std::max(seconds, 1e-6));
  return absl::OkStatus();
}

// The optimizer: under training.zero_stage 1 over this rank's shard of its
// data-parallel group (optimizer_sharding.h).
absl::Status Trainer::MakeOptimizer() {
  const v1::JobConfig& config = c_.config;
  // The gradient group: every replica's lanes of this pipeline rank (data
  // and context parallelism both replicate the layers); ZeRO stage 1 shards
  // over it, this rank's shard its position in it.
  const RankLayout ranks = RankLayout::Of(config.parallelism());
  const std::vector<int> gradient_group = ranks.DataParallelGroup(c_.coordinates.pp_rank);
  const int shard = static_cast<int>(
      std::find(gradient_group.begin(), gradient_group.end(), c_.coordinates.plan_rank) -
      gradient_group.begin());
  VP_ASSIGN_OR_RETURN(rank_optimizer_, MakeRankOptimizer(by_id_, config.training(), gradient_group,
                                                         shard, torch::Device(c_.device.name)));
  std::vector<torch::Tensor> parameters;
  int64_t parameter_count = 0;
  for (const auto& stage : stages_) {
    for (const torch::Tensor& p : stage->parameters()) {
      parameters.push_back(p);
      parameter_count += p.numel();
    }
  }
  parameter_bytes_ = TensorBytes(parameters);
  const OptimizerSharding* sharding = rank_optimizer_.sharding.get();
  spdlog::info(
      "model state: {} parameters ({} bytes, fp32 master weights); optimizer state {}",
      parameter_count, parameter_bytes_,
      sharding != nullptr
          ? absl::StrCat("sharded over the ", sharding->data_parallel(),
                         " data-parallel ranks (training.zero_stage 1, shard ", sharding->index(),
                         ")")
          : absl::StrCat("whole on this rank (training.zero_stage ", config.training().zero_stage(),
                         ", data-parallel degree ", config.parallelism().data(),
                         ", context-parallel degree ", ranks.context, ")"));
  return absl::OkStatus();
}

// The rendezvous: the transport, and on GPUs a Gloo transport next to NCCL
// for small host-side reductions (the gradient norm over the pipeline, the
// iteration's metrics).
absl::Status Trainer::Meet() {
  const TransportOptions& transport_options = c_.transport_options;
  spdlog::info("meeting {} ranks through Redis {}:{} (keys {})", c_.env.world_size,
               transport_options.redis.host, transport_options.redis.port,
               transport_options.prefix);
  VP_RETURN_IF_ERROR(MaybeInjectFault(FaultPoint::kBeforeRendezvous));
  VP_ASSIGN_OR_RETURN(std::unique_ptr<Transport> created, CreateTransport(transport_options));
  transport_ = c_.transports.Add(std::move(created));
  spdlog::info("transport: {}", transport_->Describe());
  host_ = transport_;
  if (c_.device.is_cuda) {
    TransportOptions host_options = transport_options;
    host_options.prefix += "/host";
    host_options.cuda_device = -1;
    host_options.gloo_on_gpu = false;
    VP_ASSIGN_OR_RETURN(created, CreateTransport(host_options));
    host_ = c_.transports.Add(std::move(created));
    spdlog::info("host transport: {}", host_->Describe());
  }
  {
    TransportOptions report_options = transport_options;
    report_options.prefix += "/report";
    report_options.cuda_device = -1;
    report_options.gloo_on_gpu = false;
    VP_ASSIGN_OR_RETURN(created, CreateTransport(report_options));
    report_ = c_.transports.Add(std::move(created));
  }
  if (context_ != nullptr) {
    // The context group's collectives on a transport of their own (NCCL: a
    // communicator over the group's ranks; Gloo: its own contexts), apart
    // from the pipeline's transfers and the gradient reductions.
    TransportOptions context_options = transport_options;
    context_options.prefix += "/context";
    context_options.peers.clear();
    context_options.data_parallel_group.clear();
    context_options.tensor_group = context_->ranks();
    VP_ASSIGN_OR_RETURN(created, CreateTransport(context_options));
    context_->set_transport(c_.transports.Add(std::move(created)));
  }
  VP_RETURN_IF_ERROR(MaybeInjectFault(FaultPoint::kAfterRendezvous));
  for (int r = 0; r < c_.env.world_size; ++r) world_.push_back(r);
  // The plan interpreter talks in pipeline ranks (the identity without
  // tensor parallelism); the tensor group's collectives use global ranks.
  const int tensor = static_cast<int>(spec_.tensor_parallel);
  plan_transport_ = std::make_unique<TensorRankTransport>(transport_, tensor);
  plan_host_ = std::make_unique<TensorRankTransport>(host_, tensor);
  tensor_->set_transport(transport_);
  return absl::OkStatus();
}

void Trainer::MakeInterpreter() {
  const v1::JobConfig& config = c_.config;
  InterpreterOptions options;
  options.wait_timeout = absl::Seconds(config.training().watchdog_timeout_s());
  options.device = torch::Device(c_.device.name);
  options.device_timing = options_.device_timing;
  const v1::TrainingConfig& training = config.training();
  // The sharding cuts its shards from buckets of the same size.
  options.gradient_bucket_bytes = GradientBucketBytes(training);
  const RankLayout ranks = RankLayout::Of(config.parallelism());
  // This lane's pipeline.
  const uint32_t lane = static_cast<uint32_t>(c_.coordinates.context_rank);
  options.pipeline_group = ranks.PipelineGroup(c_.coordinates.dp_rank, lane);
  // One stage per rank when parameters are shared (the config refuses
  // interleaved stages then): stage s's holder is this lane's pipeline rank
  // s.
  for (const auto& [id, stage] : by_id_) {
    for (SharedParameterGroup& group : SharedParameterGroups(spec_, roles_, id, 0)) {
      for (int& r : group.ranks) {
        r = ranks.Rank(c_.coordinates.dp_rank, static_cast<uint32_t>(r), lane);
      }
      options.shared_parameter_groups.push_back(std::move(group));
    }
  }
  options.context_group = context_.get();
  options.host_transport = plan_host_.get();
  options.tensor_group = tensor_.get();
  options.progress = c_.board.progress();
  options.sharding = rank_optimizer_.sharding.get();
  if (!c_.device.is_cuda) options.memory = &ProcessMemoryAccount();
  // GPUs compute in the model dtype under autocast (fp32 master weights);
  // CPUs always compute in fp32.
  if (c_.device.is_cuda && config.model().dtype() != v1::FLOAT32) {
    options.cuda_autocast_dtype =
        config.model().dtype() == v1::FLOAT16 ? torch::kHalf : torch::kBFloat16;
    // Stage boundaries carry the residual stream in the compute dtype
    // (docs/models.md, "Mixed precision"): received activations and their
    // gradients stay in it, with no fp32 copy.
    options.compute_dtype = *options.cuda_autocast_dtype;
    spdlog::info("mixed precision: CUDA autocast to {} with fp32 master weights",
                 v1::DType_Name(config.model().dtype()));
  }
  interpreter_ = std::make_unique<PlanInterpreter>(by_id_, plan_transport_.get(), loader_.get(),
                                                   rank_optimizer_.optimizer.get(), options);
}

absl::Status Trainer::OpenMetrics() {
  if (c_.env.rank != 0 || options_.metrics_jsonl.empty()) return absl::OkStatus();
  metrics_.open(options_.metrics_jsonl, std::ios::app);
  if (!metrics_) {
    return absl::UnavailableError(
        absl::StrCat(options_.metrics_jsonl, ": cannot open for appending"));
  }
  return absl::OkStatus();
}

// The iterations to run; checkpoints: resume from the newest one every rank
// holds.
absl::Status Trainer::Resume() {
  first_ = options_.first_iteration;
  last_ =
      options_.iterations > 0 ? first_ + options_.iterations : c_.config.training().iterations();
  const std::string& checkpoint_dir = c_.config.training().checkpoint_dir();
  checkpoints_ = std::make_unique<RankCheckpoints>(checkpoint_dir, c_.env.rank, layout_,
                                                   rank_optimizer_.sharding.get());
  if (!checkpoint_dir.empty() && options_.resume) {
    VP_ASSIGN_OR_RETURN(const std::optional<uint64_t> resume,
                        AgreeOnCheckpoint(checkpoints_->List(), *host_, world_, checkpoint_dir));
    if (resume.has_value() && *resume > first_) {
      VP_RETURN_IF_ERROR(checkpoints_->Load(*resume, stage_list_, *rank_optimizer_.optimizer));
      spdlog::info("resumed from checkpoint {} ({} iterations done)",
                   checkpoints_->PathFor(*resume), *resume);
      first_ = *resume;
    } else if (c_.env.rank == 0) {
      spdlog::info("no checkpoint to resume from in {}", checkpoint_dir);
    }
  }
  SetFirstFaultIteration(first_);
  return absl::OkStatus();
}

// One iteration: fetch and run the plan, hand its report to the reporter,
// checkpoint.
absl::Status Trainer::RunIteration(uint64_t iteration) {
  const auto start = std::chrono::steady_clock::now();
  VP_ASSIGN_OR_RETURN(const CheckedPlan plan, FetchPlan(iteration));
  c_.board.BeginIteration(plan.shared());
  const bool traced = options_.profile_iteration >= 0 &&
                      static_cast<uint64_t>(options_.profile_iteration) == iteration;
  if (traced) VP_RETURN_IF_ERROR(StartIterationTrace(c_.device.is_cuda));
  const bool sync_warnings = c_.device.is_cuda && options_.cuda_sync_debug_iteration >= 0 &&
                             static_cast<uint64_t>(options_.cuda_sync_debug_iteration) == iteration;
  if (sync_warnings && SetCudaSyncWarnings(true)) {
    spdlog::info("iteration {}: LibTorch warns at every synchronising CUDA call", iteration);
  }
  absl::StatusOr<IterationStats> ran = interpreter_->Run(plan);
  if (sync_warnings) SetCudaSyncWarnings(false);
  if (traced) {
    // The trace is written even when the iteration failed (what it shows
    // may explain why); the iteration's own error comes first.
    const absl::Status traced_status = WriteTrace(iteration);
    if (ran.ok() && !traced_status.ok()) return traced_status;
  }
  VP_ASSIGN_OR_RETURN(IterationStats stats, std::move(ran));
  auto report = std::make_shared<RanIteration>(RanIteration{
      .iteration = iteration,
      .plan = plan.shared(),
      .stats = std::move(stats),
      .step_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      .peak_bytes = PeakMemoryBytes(c_.device),
      .reserved_bytes = PeakReservedBytes(c_.device),
      .current_bytes = CurrentMemoryBytes(c_.device),
      // Measured model state (AdamW's moments exist from the first step on).
      .optimizer_state_bytes = rank_optimizer_.optimizer->StateBytes()});
  VP_RETURN_IF_ERROR(reporter_->Submit([this, report] { return ReduceAndReport(*report); }));
  return MaybeCheckpoint(iteration + 1);
}

// The reporter's job (iteration_reporter.h): nothing here touches the
// model, the optimizer or the device.
absl::Status Trainer::ReduceAndReport(const RanIteration& ran) {
  absl::Status status = MaybeInjectFault(FaultPoint::kInReport, ran.iteration);
  if (status.ok()) {
    absl::StatusOr<Totals> totals = Reduce(ran.stats, ran.step_seconds);
    status = totals.ok() ? Report(ran, *totals) : totals.status();
  }
  if (status.ok()) return status;
  // It surfaces at a later iteration's boundary: say whose report it was.
  return absl::Status(status.code(), absl::StrCat("the report of iteration ", ran.iteration,
                                                  " failed: ", status.message()));
}

// Stops the profiler, writes the trace and logs its summary.
absl::Status Trainer::WriteTrace(uint64_t iteration) {
  std::error_code error;
  std::filesystem::create_directories(options_.profile_dir, error);
  const std::string path =
      (std::filesystem::absolute(options_.profile_dir) /
       absl::StrFormat("iteration_%d.rank_%d.trace.json", iteration, c_.env.rank))
          .string();
  VP_RETURN_IF_ERROR(StopIterationTrace(path));
  absl::StatusOr<TraceSummary> summary = SummarizeChromeTrace(path);
  if (!summary.ok()) {
    spdlog::warn("iteration {} trace written to {}, but not summarised: {}", iteration, path,
                 std::string(summary.status().message()));
    return absl::OkStatus();
  }
  spdlog::info("iteration {} trace written to {}; {}", iteration, path,
               FormatTraceSummary(*summary));
  return absl::OkStatus();
}

// The plan of `iteration`, for this rank; nothing of it is used before it
// passed the check (which names a plan of another iteration or rank).
absl::StatusOr<CheckedPlan> Trainer::FetchPlan(uint64_t iteration) {
  const RankCoordinates& coordinates = c_.coordinates;
  VP_ASSIGN_OR_RETURN(v1::ExecutionPlan fetched, c_.source.Get(iteration));
  return CheckedPlan::Check(std::make_shared<const v1::ExecutionPlan>(std::move(fetched)),
                            c_.config,
                            {.iteration = iteration,
                             .rank = coordinates.plan_rank,
                             .dp_rank = coordinates.dp_rank,
                             .pp_rank = coordinates.pp_rank,
                             .context_rank = coordinates.context_rank,
                             .layers = layout_});
}

// Iteration totals for rank 0's log line: every last-stage rank holds its
// replica's share of the global mean loss; the first pipeline rank of each
// replica counts the replica's tokens. A tensor group's ranks hold the same
// loss and tokens: its first rank counts them.
absl::StatusOr<Trainer::Totals> Trainer::Reduce(const IterationStats& stats,
                                                double step_seconds) {
  const bool first_tensor_rank = c_.coordinates.tensor_index == 0;
  const bool counts_tokens = c_.coordinates.pp_rank == 0 && first_tensor_rank;
  std::vector<float> totals{first_tensor_rank ? static_cast<float>(stats.loss) : 0.0f,
                            counts_tokens ? static_cast<float>(stats.real_tokens) : 0.0f,
                            counts_tokens ? static_cast<float>(stats.padded_tokens) : 0.0f};
  VP_RETURN_IF_ERROR(report_->AllReduceMean(totals, world_));
  const double n = static_cast<double>(c_.env.world_size);
  return Totals{
      .loss = totals[0] * n,
      .real_tokens = totals[1] * n,
      .padded_tokens = totals[2] * n,
      .step_seconds = step_seconds};
}

// The status board, the planner daemon (progress and calibration), the
// metrics and rank 0's log.
absl::Status Trainer::Report(const RanIteration& ran, const Totals& totals) {
  const uint64_t iteration = ran.iteration;
  const v1::ExecutionPlan& plan = *ran.plan;
  const IterationStats& stats = ran.stats;
  const int64_t peak_bytes = ran.peak_bytes;
  const int64_t reserved_bytes = ran.reserved_bytes;
  const int64_t optimizer_state_bytes = ran.optimizer_state_bytes;
  if (iteration == first_) {
    spdlog::info(
        "measured model state per rank: parameters {} bytes, optimizer state {} bytes "
        "(training.zero_stage {}, data-parallel degree {})",
        parameter_bytes_, optimizer_state_bytes, c_.config.training().zero_stage(),
        c_.config.parallelism().data());
  }
  c_.board.SetModelState(static_cast<uint64_t>(parameter_bytes_),
                         static_cast<uint64_t>(optimizer_state_bytes));
  c_.board.EndIteration(totals.loss, totals.real_tokens / totals.step_seconds,
                        static_cast<uint64_t>(ran.current_bytes),
                        static_cast<uint64_t>(peak_bytes));
  v1::ReportProgressRequest progress = Progress(iteration, plan, stats, totals, peak_bytes);
  progress.set_peak_reserved_bytes(static_cast<uint64_t>(reserved_bytes));
  VP_RETURN_IF_ERROR(c_.source.Done(progress));
  if (record_.iterations == 0) {
    record_.first = iteration;
    record_.first_loss = totals.loss;
  } else {
    record_.warm_tokens += totals.real_tokens;
    record_.warm_seconds += totals.step_seconds;
  }
  ++record_.iterations;
  record_.last = iteration;
  record_.last_loss = totals.loss;
  record_.tokens += totals.real_tokens;
  record_.seconds += totals.step_seconds;
  RecordIterationMetrics({.iteration = iteration,
                          .step_seconds = totals.step_seconds,
                          .compute_seconds = stats.compute_seconds,
                          .wait_seconds = stats.communication_seconds,
                          .data_seconds = stats.data_seconds,
                          .loss = totals.loss,
                          .real_tokens = totals.real_tokens,
                          .padded_tokens = totals.padded_tokens,
                          .predicted_seconds = plan.predicted_iteration_ms() / 1e3,
                          .peak_memory_bytes = static_cast<double>(peak_bytes),
                          .peak_reserved_bytes = static_cast<double>(reserved_bytes),
                          .host_reads = static_cast<double>(stats.host_reads),
                          .parameter_bytes = static_cast<double>(parameter_bytes_),
                          .optimizer_state_bytes = static_cast<double>(optimizer_state_bytes)});
  if (c_.env.rank == 0) LogIteration(iteration, plan, stats, totals, peak_bytes, reserved_bytes);
  return absl::OkStatus();
}

// What the planner daemons learn of the iteration: times per pass and what
// the plan predicted, for calibration and error statistics
// (docs/cost-model.md, "Calibration").
v1::ReportProgressRequest Trainer::Progress(uint64_t iteration, const v1::ExecutionPlan& plan,
                                            const IterationStats& stats, const Totals& totals,
                                            int64_t peak_bytes) const {
  v1::ReportProgressRequest progress;
  progress.set_iteration(iteration);
  progress.set_iteration_ms(totals.step_seconds * 1e3);
  progress.set_communication_wait_ms(stats.communication_seconds * 1e3);
  progress.set_loss(totals.loss);
  progress.set_tokens_per_second(totals.real_tokens / totals.step_seconds);
  progress.set_peak_memory_bytes(static_cast<uint64_t>(peak_bytes));
  progress.set_host_reads(static_cast<uint32_t>(stats.host_reads));
  for (const MicroBatchTime& t : stats.micro_batch_times) {
    v1::MicroBatchTiming* timing = progress.add_timings();
    timing->set_micro_batch(t.micro_batch);
    timing->set_stage(t.stage);
    timing->set_forward_ms(t.forward_seconds * 1e3);
    // A split backward reports B and W together (the cost model has one
    // backward per stage) and W apart.
    timing->set_backward_ms((t.backward_seconds + t.weight_seconds) * 1e3);
    timing->set_profiled_forward_ms(t.profiled_forward_ms);
    timing->set_profiled_backward_ms(t.profiled_backward_ms + t.profiled_weight_ms);
    timing->set_weight_ms(t.weight_seconds * 1e3);
    timing->set_profiled_weight_ms(t.profiled_weight_ms);
  }
  progress.set_predicted_iteration_ms(plan.predicted_iteration_ms());
  progress.set_calibration_version(plan.calibration_version());
  progress.set_predicted_overhead_ms(plan.predicted_overhead_ms());
  progress.set_all_reduce_ms(stats.all_reduce_seconds * 1e3);
  progress.set_optimizer_ms(stats.optimizer_seconds * 1e3);
  progress.set_profiled_all_reduce_ms(plan.profiled_all_reduce_ms());
  progress.set_profiled_optimizer_ms(plan.profiled_optimizer_ms());
  return progress;
}

// Rank 0's log line and, with --metrics_jsonl, its JSON line.
void Trainer::LogIteration(uint64_t iteration, const v1::ExecutionPlan& plan,
                           const IterationStats& stats, const Totals& totals, int64_t peak_bytes,
                           int64_t reserved_bytes) {
  const double tokens_per_second = totals.real_tokens / totals.step_seconds;
  const double peak_mib = static_cast<double>(peak_bytes) / (1024.0 * 1024.0);
  const double reserved_mib = static_cast<double>(reserved_bytes) / (1024.0 * 1024.0);
  spdlog::info(
      "iteration {}: loss {:.4f}, {:.0f} real tokens/s, padding efficiency {:.1f}%, "
      "step {:.1f} ms (rank 0: compute {:.1f} ms, waits {:.1f} ms, data {:.1f} ms, "
      "interpreter {:.3f} ms for {} instructions, host reads {}), lr {:.3g}, grad norm {:.3f}, "
      "peak memory {:.0f} MiB (reserved {:.0f} MiB)",
      iteration, totals.loss, tokens_per_second,
      totals.padded_tokens > 0 ? 100.0 * totals.real_tokens / totals.padded_tokens : 0.0,
      totals.step_seconds * 1e3, stats.compute_seconds * 1e3, stats.communication_seconds * 1e3,
      stats.data_seconds * 1e3, stats.overhead_seconds * 1e3, stats.instructions, stats.host_reads,
      stats.learning_rate, stats.grad_norm, peak_mib, reserved_mib);
  if (!metrics_.is_open()) return;
  // Rank 0's measured activation peak (CPU, counting allocator), -1 when
  // not measured.
  const double activation_peak_mib =
      stats.memory_peak_bytes >= 0
          ? static_cast<double>(stats.memory_peak_bytes - stats.memory_start_bytes) /
                (1024.0 * 1024.0)
          : -1.0;
  metrics_ << absl::StrFormat(
                  "{\"iteration\": %d, \"loss\": %.6f, \"real_tokens_per_s\": %.1f, "
                  "\"padding_efficiency\": %.4f, \"step_ms\": %.3f, "
                  "\"compute_ms\": %.3f, \"communication_ms\": %.3f, "
                  "\"interpreter_overhead_ms\": %.4f, \"instructions\": %d, "
                  "\"learning_rate\": %.6g, \"grad_norm\": %.6f, \"peak_memory_mib\": %.1f, "
                  "\"activation_peak_mib\": %.3f, "
                  "\"predicted_activation_peak_mib\": %.3f, \"predicted_ms\": %.3f, "
                  "\"predicted_makespan_ms\": %.3f, \"all_reduce_ms\": %.3f, "
                  "\"optimizer_ms\": %.3f, \"calibration_version\": %d, "
                  "\"host_reads\": %d, \"peak_reserved_mib\": %.1f}",
                  iteration, totals.loss, tokens_per_second,
                  totals.padded_tokens > 0 ? totals.real_tokens / totals.padded_tokens : 0.0,
                  totals.step_seconds * 1e3, stats.compute_seconds * 1e3,
                  stats.communication_seconds * 1e3, stats.overhead_seconds * 1e3,
                  stats.instructions, stats.learning_rate, stats.grad_norm, peak_mib,
                  activation_peak_mib, plan.predicted_activation_peak_bytes() / (1024.0 * 1024.0),
                  plan.predicted_iteration_ms(), plan.predicted_makespan_ms(),
                  stats.all_reduce_seconds * 1e3, stats.optimizer_seconds * 1e3,
                  plan.calibration_version(), stats.host_reads, reserved_mib)
           << std::endl;
}

// A checkpoint after `done` iterations when training.checkpoint_interval
// says so. Older checkpoints go only once every rank holds this one (the
// invariant AgreeOnCheckpoint relies on); the previous one stays.
absl::Status Trainer::MaybeCheckpoint(uint64_t done) {
  const std::string& checkpoint_dir = c_.config.training().checkpoint_dir();
  const uint64_t interval = c_.config.training().checkpoint_interval();
  if (checkpoint_dir.empty() || interval == 0 || done % interval != 0) return absl::OkStatus();
  const auto save_start = std::chrono::steady_clock::now();
  VP_RETURN_IF_ERROR(checkpoints_->Save(done, stage_list_, *rank_optimizer_.optimizer));
  std::vector<float> barrier{1.0f};
  VP_RETURN_IF_ERROR(host_->AllReduceMean(barrier, world_));
  if (done > interval) checkpoints_->DeleteOlderThan(done - interval);
  if (c_.env.rank == 0) {
    spdlog::info(
        "checkpoint after {} iterations written to {} ({:.0f} ms)", done,
        std::filesystem::path(checkpoints_->PathFor(done)).parent_path().string(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - save_start)
            .count());
  }
  return absl::OkStatus();
}

// --save_parameters: this rank's parameters as a LibTorch archive.
absl::Status Trainer::SaveParameters() const {
  if (options_.save_parameters.empty()) return absl::OkStatus();
  const std::string path =
      absl::StrFormat("%s.rank_%05d.pt", options_.save_parameters, c_.env.rank);
  try {
    torch::serialize::OutputArchive archive;
    for (const auto& stage : stages_) {
      for (const auto& item : stage->named_parameters()) {
        archive.write(item.key(), item.value().detach().to(torch::kCPU));
      }
    }
    archive.save_to(path);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot save the parameters: ", e.what()));
  }
  spdlog::info("parameters written to {}", path);
  return absl::OkStatus();
}

// --export_hf: the trained model as a Hugging Face checkpoint. Every
// pipeline rank of data-parallel replica 0 writes the shards of its own
// stages, rank 0 the config and index (the files equal a single process's
// export). Then a barrier over every rank: once past it, every part is
// written, and rank 0 opens the directory and finds every tensor the index
// names in its shard before calling the export complete.
absl::Status Trainer::ExportHuggingFace() {
  if (options_.export_hf.empty()) return absl::OkStatus();
  const std::string out = std::filesystem::absolute(options_.export_hf).lexically_normal().string();
  // Replica 0's first lane (the lanes hold the same parameters).
  if (c_.coordinates.dp_rank == 0 && c_.coordinates.context_rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) return absl::UnavailableError(absl::StrCat(out, ": cannot create: ", ec.message()));
    const v1::DType dtype = c_.config.model().dtype() == v1::DTYPE_UNSPECIFIED
                                ? v1::FLOAT32
                                : c_.config.model().dtype();
    VP_RETURN_IF_ERROR(ExportHuggingFaceShards(out, spec_, stage_list_, dtype));
    // Started from a Hugging Face checkpoint: its config.json and tokenizer.
    if (c_.env.rank == 0) {
      VP_RETURN_IF_ERROR(
          ExportHuggingFaceIndex(out, spec_, dtype, c_.config.training().init_from()));
    }
    spdlog::info("exported this rank's stages as a Hugging Face checkpoint in {} ({})", out,
                 v1::DType_Name(dtype));
  }
  std::vector<float> barrier{1.0f};
  VP_RETURN_IF_ERROR(host_->AllReduceMean(barrier, world_));
  if (c_.env.rank != 0) return absl::OkStatus();
  absl::StatusOr<HuggingFaceCheckpoint> written = HuggingFaceCheckpoint::Open(out);
  if (!written.ok()) return Annotate(written.status(), "--export_hf: the export is incomplete");
  const std::vector<std::string> names = written->TensorNames();
  for (const std::string& name : names) {
    if (absl::StatusOr<HuggingFaceCheckpoint::Located> found = written->Find(name); !found.ok()) {
      return Annotate(found.status(), "--export_hf: the export is incomplete");
    }
  }
  export_complete_ =
      absl::StrCat("export complete (every rank's part written: ", names.size(), " tensors in ",
                   written->sharded() ? written->opened_files().size() : 1, " files)");
  return absl::OkStatus();
}

// The end of a run on rank 0: what ran, how it went, where its outputs are.
void Trainer::LogSummary() const {
  const auto absolute = [](const std::string& path) {
    return std::filesystem::absolute(path).lexically_normal().string();
  };
  const RunRecord& r = record_;
  if (r.iterations == 0) {
    spdlog::info("run summary: no iteration ran in this launch (iterations {} to {} are done)",
                 first_, last_);
  } else {
    spdlog::info("run summary: iterations {} to {} ({} in this launch, {:.1f} s of steps)",
                 r.first, r.last, r.iterations, r.seconds);
    spdlog::info("  loss            {:.4f} (iteration {}) -> {:.4f} (iteration {})",
                 r.first_loss, r.first, r.last_loss, r.last);
    const bool warm = r.iterations > 1 && r.warm_seconds > 0;
    spdlog::info("  real tokens/s   {:.0f} (iterations {} to {}{})",
                 warm ? r.warm_tokens / r.warm_seconds : r.tokens / std::max(r.seconds, 1e-9),
                 warm ? r.first + 1 : r.first, r.last,
                 warm ? "; the first warms up" : "");
  }
  const std::string& checkpoint_dir = c_.config.training().checkpoint_dir();
  if (checkpoint_dir.empty()) {
    spdlog::info("  checkpoints     none (training.checkpoint_dir is not set)");
  } else {
    const std::vector<uint64_t> held = checkpoints_->List();
    spdlog::info("  checkpoints     {} ({})", absolute(checkpoint_dir),
                 held.empty() ? std::string("none written")
                              : absl::StrCat("newest after ", held.back(), " iterations"));
  }
  if (!options_.export_hf.empty()) {
    spdlog::info("  Hugging Face    {}: {}", absolute(options_.export_hf), export_complete_);
  }
  if (!options_.save_parameters.empty()) {
    spdlog::info("  parameters      {}.rank_NNNNN.pt (one per rank)",
                 absolute(options_.save_parameters));
  }
  if (!options_.metrics_jsonl.empty()) {
    spdlog::info("  metrics         {}", absolute(options_.metrics_jsonl));
  }
}

}  // namespace varipipe::executor
