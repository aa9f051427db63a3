#include "tests/testing/threaded_ranks.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config/rank_layout.h"
#include "common/dataset/minibatch_sampler.h"
#include "executor/comm/device_staging_transport.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "executor/comm/tensor_rank_transport.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/model/tensor_group.h"
#include "executor/runtime/checkpoint.h"
#include "executor/runtime/optimizer_sharding.h"
#include "executor/runtime/training_optimizer.h"

namespace varipipe::testing {
namespace {

using executor::ModelStage;

// Rank r of a run: its stages (looped placement for interleaved schedules:
// stage s on pipeline rank s % pp, as the executor places them), optimizer
// (sharded under training.zero_stage 1, as the executor's) and interpreter.
void RunRank(const v1::JobConfig& config,
             const std::vector<std::vector<v1::ExecutionPlan>>& iterations,
             const SampleDataset& dataset, const ThreadedRanksOptions& options, int rank, int size,
             std::vector<executor::InstructionProgress>& progress, RankRun& out) {
  std::optional<executor::ScopedAccount> account;
  if (!options.memory.empty()) account.emplace(options.memory[rank]);
  executor::GlooTransport::Options o;
  o.redis.host = options.redis_host;
  o.redis.port = options.redis_port;
  o.redis.password = options.redis_password;
  o.prefix = options.prefix;
  o.rank = rank;
  o.size = size;
  o.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<executor::GlooTransport>> gloo =
      executor::GlooTransport::Create(o);
  if (!gloo.ok()) {
    out.status = gloo.status();
    return;
  }
  // As the executor: the tensor group talks over the global ranks, the plan
  // interpreter over pipeline ranks (the tensor-rank view, the identity
  // without tensor parallelism). Ranks on a GPU (several share it; NCCL
  // refuses that) move their device buffers through host memory; host-side
  // reductions use Gloo directly.
  const std::unique_ptr<executor::Transport> global = *std::move(gloo);
  const executor::ModelSpec spec = *executor::ModelSpecFromConfig(config);
  const int tp = static_cast<int>(spec.tensor_parallel);
  const int plan_rank = rank / tp;
  // common/config/rank_layout.h: the plan rank's replica, pipeline rank and
  // lane.
  const RankLayout layout = RankLayout::Of(config.parallelism());
  const uint32_t dp_rank = layout.DpRank(plan_rank);
  const uint32_t pp_rank = layout.PpRank(plan_rank);
  const uint32_t lane = layout.ContextRank(plan_rank);
  auto tensor = std::make_shared<executor::TensorGroup>(rank, tp, spec.sequence_parallel);
  tensor->set_transport(global.get());
  // As the executor: the lanes of this replica and pipeline rank (of this
  // tensor index) on a Gloo transport of their own.
  std::shared_ptr<executor::TensorGroup> context;
  std::unique_ptr<executor::GlooTransport> context_transport;
  if (layout.context > 1) {
    o.prefix = options.prefix + "/context";
    absl::StatusOr<std::unique_ptr<executor::GlooTransport>> made =
        executor::GlooTransport::Create(o);
    if (!made.ok()) {
      out.status = made.status();
      return;
    }
    context_transport = *std::move(made);
    std::vector<int> lanes;
    for (int r : layout.ContextGroup(dp_rank, pp_rank)) {
      lanes.push_back(layout.GlobalRank(r, layout.TensorIndex(rank)));
    }
    context = std::make_shared<executor::TensorGroup>(std::move(lanes), static_cast<int>(lane),
                                                      "context-parallel");
    context->set_transport(context_transport.get());
  }
  std::unique_ptr<executor::Transport> transport =
      std::make_unique<executor::TensorRankTransport>(global.get(), tp);
  executor::Transport* host_transport = transport.get();
  if (options.device.is_cuda() || options.stage_through_host) {
    transport =
        std::make_unique<executor::DeviceStagingTransport>(std::move(transport), options.device);
  }
  const int pp = static_cast<int>(config.parallelism().pipeline());
  const int chunks = static_cast<int>(std::max(1u, config.parallelism().virtual_chunks()));
  const std::vector<executor::StageRole> roles = *executor::PipelineStageRoles(spec, pp * chunks);
  std::vector<std::unique_ptr<ModelStage>> stages;
  std::map<uint32_t, ModelStage*> by_id;
  std::vector<ModelStage*> stage_list;
  std::vector<torch::Tensor> trainable;
  for (int s = static_cast<int>(pp_rank); s < pp * chunks; s += pp) {
    stages.push_back(std::make_unique<ModelStage>(spec, roles[s], tensor, context));
    stages.back()->to(options.device);
    stages.back()->set_loss_chunk_tokens(options.loss_chunk_tokens);
    by_id[static_cast<uint32_t>(s)] = stages.back().get();
    stage_list.push_back(stages.back().get());
    for (const torch::Tensor& p : stages.back()->parameters()) trainable.push_back(p);
  }
  // As the executor: the gradient group of the pipeline rank (every
  // replica's lanes, in plan ranks; each tensor index reduces with its own),
  // this rank's shard its position in it.
  const std::vector<int> data_parallel_group = layout.DataParallelGroup(pp_rank);
  const int shard = static_cast<int>(
      std::find(data_parallel_group.begin(), data_parallel_group.end(), plan_rank) -
      data_parallel_group.begin());
  // ZeRO stage 1's shards are cut from buckets of the interpreter's size.
  absl::StatusOr<executor::RankOptimizer> rank_optimizer =
      executor::MakeRankOptimizer(by_id, config.training(), data_parallel_group, shard,
                                  options.device, options.gradient_bucket_bytes);
  if (!rank_optimizer.ok()) {
    out.status = rank_optimizer.status();
    return;
  }
  executor::TrainingOptimizer& optimizer = *rank_optimizer->optimizer;
  out.parameter_bytes = executor::TensorBytes(trainable);
  const executor::RankCheckpoints checkpoints(options.checkpoint_dir, rank, {},
                                              rank_optimizer->sharding.get());
  if (options.resume_from > 0) {
    out.status = checkpoints.Load(options.resume_from, stage_list, optimizer);
    if (!out.status.ok()) return;
  }
  executor::MicroBatchLoader loader(&dataset, SamplerOptionsFromConfig(config));
  executor::InterpreterOptions interpreter_options;
  interpreter_options.wait_timeout =
      options.timeouts.empty() ? options.timeout : options.timeouts[rank];
  interpreter_options.progress = &progress[rank];
  if (!options.memory.empty()) interpreter_options.memory = options.memory[rank];
  interpreter_options.sharding = rank_optimizer->sharding.get();
  interpreter_options.device = options.device;
  interpreter_options.gradient_bucket_bytes = options.gradient_bucket_bytes;
  interpreter_options.prefetch_inputs = options.prefetch_inputs;
  interpreter_options.host_transport = host_transport;
  interpreter_options.tensor_group = tensor.get();
  interpreter_options.context_group = context.get();
  interpreter_options.pipeline_group = layout.PipelineGroup(dp_rank, lane);
  for (const auto& stage : stages) {
    for (executor::SharedParameterGroup& group :
         executor::SharedParameterGroups(spec, roles, stage->role().stage, 0)) {
      // Stage s's holder: this lane's pipeline rank s.
      for (int& r : group.ranks) r = layout.Rank(dp_rank, static_cast<uint32_t>(r), lane);
      interpreter_options.shared_parameter_groups.push_back(std::move(group));
    }
  }
  if (options.capture_gradients) {
    interpreter_options.before_optimizer_step = [&](const executor::IterationStats&) {
      std::map<std::string, torch::Tensor>& grads = out.gradients.emplace_back();
      for (const auto& stage : stages) {
        for (const auto& item : stage->named_parameters()) {
          const torch::Tensor& g = item.value().grad();
          grads[item.key()] =
              g.defined() ? g.detach().cpu().clone() : torch::zeros_like(item.value().cpu());
        }
      }
    };
  }
  executor::PlanInterpreter interpreter(by_id, transport.get(), &loader, &optimizer,
                                        interpreter_options);
  if (options.before_run) options.before_run(rank, progress);
  for (const std::vector<v1::ExecutionPlan>& plans : iterations) {
    // What the executor does: only checked plans run.
    const v1::ExecutionPlan& plan = plans[plan_rank];
    absl::StatusOr<executor::CheckedPlan> checked =
        executor::CheckedPlan::Check(std::make_shared<const v1::ExecutionPlan>(plan), config,
                                     {.iteration = plan.iteration(),
                                      .rank = plan_rank,
                                      .dp_rank = static_cast<int>(dp_rank),
                                      .pp_rank = static_cast<int>(pp_rank),
                                      .context_rank = static_cast<int>(lane)});
    if (!checked.ok()) {
      out.status = checked.status();
      break;
    }
    absl::StatusOr<executor::IterationStats> stats = interpreter.Run(*checked);
    if (!stats.ok()) {
      out.status = stats.status();
      break;
    }
    out.stats.push_back(*std::move(stats));
    out.optimizer_state_bytes.push_back(optimizer.StateBytes());
  }
  if (out.status.ok() && !options.checkpoint_dir.empty() && !iterations.empty()) {
    out.status =
        checkpoints.Save(iterations.back()[plan_rank].iteration() + 1, stage_list, optimizer);
  }
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      out.parameters[item.key()] = item.value().detach().cpu().clone();
    }
  }
}

}  // namespace

std::vector<RankRun> RunThreadedRanks(const v1::JobConfig& config,
                                      const std::vector<std::vector<v1::ExecutionPlan>>& iterations,
                                      const SampleDataset& dataset,
                                      const ThreadedRanksOptions& options) {
  // Each plan runs on every tensor rank of its pipeline rank.
  const int tp = static_cast<int>(std::max(1u, config.parallelism().tensor()));
  const int size = iterations.empty() ? 0 : static_cast<int>(iterations.front().size()) * tp;
  std::vector<RankRun> runs(size);
  std::vector<executor::InstructionProgress> progress(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back(
        [&, r] { RunRank(config, iterations, dataset, options, r, size, progress, runs[r]); });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

}  // namespace varipipe::testing
