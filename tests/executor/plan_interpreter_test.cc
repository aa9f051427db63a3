// The plan interpreter running the planner's real plans: ranks as threads,
// Gloo over loopback TCP, rendezvous through a real redis-server.
//
// Equivalence: one optimizer step on a fixed mini-batch with pp=2, dp=2
// leaves the same parameters (1e-5 relative, fp32) as one process training
// the whole mini-batch unpipelined, for GPT and T5 with every schedule
// (GPipe, 1F1B, kFkB, adaptive; interleaved 1F1B with 2 and 3 virtual chunks
// for GPT) and every recompute mode. Selective recomputation lowers every
// rank's measured activation peak. The watchdog tests drop a send from one
// rank's plan, or swap two receives, and expect a diagnostic instead of a
// hang.
#include "executor/runtime/plan_interpreter.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/loss_tokens.h"
#include "common/dataset/sample_dataset.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "executor/model/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/unpipelined_reference.h"

namespace varipipe::executor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;

struct Case {
  bool t5 = false;
  v1::ScheduleKind schedule = v1::ONE_F_ONE_B;
  v1::RecomputeMode recompute = v1::RECOMPUTE_NONE;
  std::string name;
  uint32_t chunks = 1;  // parallelism.virtual_chunks (interleaved 1F1B)
  v1::PartitionMethod method = v1::DYNAMIC_PROGRAMMING;
};

// adam_epsilon is 1e-6 rather than 1e-8: some gradients are exactly zero in
// exact arithmetic (the key bias: softmax ignores a constant added to every
// key) and only rounding noise (~1e-12) in floating point; Adam divides that
// noise by its own magnitude, so with a tiny epsilon two summation orders of
// zero give visibly different updates. A larger epsilon leaves every real
// gradient's update as it was.
v1::JobConfig TinyConfig(const Case& c, uint32_t pp, uint32_t dp) {
  const std::string json = absl::StrCat(
      R"({"job_id": "interp", "model": {"kind": ")", c.t5 ? "T5" : "GPT",
      R"(", "num_layers": )", std::max(4u, pp * c.chunks), R"(, )",
      c.t5 ? R"("num_decoder_layers": 4, )" : "", R"("hidden_size": 32,
      "num_attention_heads": 4, "ffn_hidden_size": 64, "vocab_size": 61, "dtype": "FLOAT32"},
      "parallelism": {"pipeline": )",
      pp, R"(, "data": )", dp, R"(, "virtual_chunks": )", c.chunks, R"(},
      "cluster": {"device_memory_limit_mib": )",
      c.t5 && c.recompute == v1::RECOMPUTE_NONE ? 8 : 4,
      R"(, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 1200,
               "max_sequence_length": 96, )", c.t5 ? R"("max_target_length": 48, )" : "", R"("seed": 11,
               "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01, "partition_methods": ["dynamic_programming"]},
      "training": {"iterations": 10, "learning_rate": 0.001, "adam_epsilon": 1e-6}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  EXPECT_THAT(config, IsOk());
  config->mutable_planner()->clear_schedules();
  config->mutable_planner()->add_schedules(c.schedule);
  config->mutable_planner()->clear_recompute_modes();
  config->mutable_planner()->add_recompute_modes(c.recompute);
  config->mutable_planner()->clear_partition_methods();
  config->mutable_planner()->add_partition_methods(c.method);
  ApplyJobConfigDefaults(*config);
  EXPECT_THAT(ValidateJobConfig(*config, "test"), IsOk());
  return *config;
}


using Parameters = std::map<std::string, torch::Tensor>;

class PlanInterpreterTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }

  // Plans iteration `iteration` of `config`'s data.
  std::vector<v1::ExecutionPlan> Plans(const v1::JobConfig& config, uint64_t iteration,
                                       const SampleDataset& dataset) {
    absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler =
        MiniBatchSampler::Create(dataset.AllLengths(), SamplerOptionsFromConfig(config));
    EXPECT_THAT(sampler, IsOk());
    const SampledMiniBatch sampled = (*sampler)->Get(iteration);
    // The config's memory limit, raised by a quarter while no plan fits
    // (GPipe keeps every micro-batch; some schedules need more room): the
    // smallest limit that plans gives the most micro-batches. The executor
    // ignores the limit.
    v1::JobConfig planning = config;
    absl::StatusOr<planner::PlanningResult> result;
    for (int attempt = 0; attempt < 12; ++attempt) {
      absl::StatusOr<planner::Planner> planner = planner::Planner::Create(planning);
      EXPECT_THAT(planner, IsOk());
      if (!planner.ok()) return {};
      result = planner->Plan(
          {.iteration = iteration, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths});
      if (!absl::IsResourceExhausted(result.status())) break;
      const uint64_t limit = planning.cluster().device_memory_limit_mib();
      planning.mutable_cluster()->set_device_memory_limit_mib(std::max(limit + 1, limit * 5 / 4));
    }
    EXPECT_THAT(result, IsOk());
    if (result.ok()) {
      std::printf("planned with %llu MiB per device\n",
                  static_cast<unsigned long long>(planning.cluster().device_memory_limit_mib()));
    }
    return result.ok() ? result->plans : std::vector<v1::ExecutionPlan>{};
  }

  // What a test controls about each rank's run.
  struct RankControl {
    // Watchdog timeout per rank (empty: RunRanks' `timeout` for every rank).
    std::vector<absl::Duration> timeouts;
    // Called on rank r's thread after the rendezvous, before its plan runs,
    // with every rank's instruction progress: a test can hold a rank back
    // until another one has provably reached an instruction.
    std::function<void(int rank, const std::vector<InstructionProgress>& progress)> before_run;
  };

  // Runs `plans` (one per rank) on threads; returns each rank's parameters
  // after the step and each rank's status.
  std::vector<absl::StatusOr<IterationStats>> RunRanks(const v1::JobConfig& config,
                                                       const std::vector<v1::ExecutionPlan>& plans,
                                                       const SampleDataset& dataset,
                                                       std::vector<Parameters>* parameters,
                                                       absl::Duration timeout,
                                                       const RankControl& control = {}) {
    const int size = static_cast<int>(plans.size());
    const int pp = static_cast<int>(config.parallelism().pipeline());
    std::vector<InstructionProgress> progress(size);
    InstallCountingCpuAllocator();
    // Fresh accounts per run; earlier ones stay alive (tensors they paid for,
    // such as the returned parameters, may outlive the run).
    memory_.clear();
    for (int r = 0; r < size; ++r) {
      accounts_.push_back(std::make_unique<MemoryAccount>());
      memory_.push_back(accounts_.back().get());
    }
    std::vector<absl::StatusOr<IterationStats>> results(size, absl::UnknownError("not run"));
    parameters->assign(size, {});
    std::vector<std::thread> threads;
    const std::string run = absl::StrCat("run", ++runs_);
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        ScopedAccount account(memory_[r]);
        GlooTransport::Options o;
        o.redis.host = redis_->host();
        o.redis.port = redis_->port();
        o.redis.password = redis_->password();
        o.prefix = run;
        o.rank = r;
        o.size = size;
        o.connect_timeout = absl::Seconds(30);
        absl::StatusOr<std::unique_ptr<GlooTransport>> transport = GlooTransport::Create(o);
        if (!transport.ok()) {
          results[r] = transport.status();
          return;
        }
        // Looped placement (interleaved schedules): stage s on pipeline rank
        // s % pp, as the executor places them.
        const ModelSpec spec = *ModelSpecFromConfig(config);
        const int chunks = static_cast<int>(std::max(1u, config.parallelism().virtual_chunks()));
        const std::vector<StageRole> roles = *PipelineStageRoles(spec, pp * chunks);
        std::vector<std::unique_ptr<ModelStage>> stages;
        std::map<uint32_t, ModelStage*> by_id;
        std::vector<torch::Tensor> trainable;
        for (int s = r % pp; s < pp * chunks; s += pp) {
          stages.push_back(std::make_unique<ModelStage>(spec, roles[s]));
          by_id[static_cast<uint32_t>(s)] = stages.back().get();
          for (const torch::Tensor& p : stages.back()->parameters()) trainable.push_back(p);
        }
        TrainingOptimizer optimizer(trainable, config.training());
        MicroBatchLoader loader(&dataset, SamplerOptionsFromConfig(config));
        InterpreterOptions options;
        options.wait_timeout = control.timeouts.empty() ? timeout : control.timeouts[r];
        options.progress = &progress[r];
        options.memory = memory_[r];
        for (int k = 0; k < pp; ++k) options.pipeline_group.push_back(r / pp * pp + k);
        PlanInterpreter interpreter(by_id, transport->get(), &loader, &optimizer, options);
        if (control.before_run) control.before_run(r, progress);
        results[r] = interpreter.Run(plans[r]);
        for (const auto& stage : stages) {
          for (const auto& item : stage->named_parameters()) {
            (*parameters)[r][item.key()] = item.value().detach().clone();
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  std::unique_ptr<RedisServer> redis_;
  int runs_ = 0;
  // Per rank, of the last RunRanks; every account lives as long as the test.
  std::vector<MemoryAccount*> memory_;
  std::vector<std::unique_ptr<MemoryAccount>> accounts_;
};

TEST_P(PlanInterpreterTest, OneStepEqualsUnpipelinedTraining) {
  const Case& c = GetParam();
  const v1::JobConfig config = TinyConfig(c, 2, 2);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<v1::ExecutionPlan> plans = Plans(config, 3, **dataset);
  ASSERT_EQ(plans.size(), 4u);
  int micro_batches = 0;
  for (const v1::ExecutionPlan& plan : plans) {
    if (plan.pp_rank() == 0) micro_batches += plan.micro_batches_size();
    EXPECT_EQ(plan.recompute(), c.recompute == v1::RECOMPUTE_FULL        ? "full"
                                : c.recompute == v1::RECOMPUTE_SELECTIVE ? "selective"
                                                                         : "none");
  }
  std::printf("%s: %d micro-batches over 2 replicas, %d instructions on rank 0\n",
              c.name.c_str(), micro_batches, plans[0].instructions_size());
  EXPECT_GE(micro_batches, 2);  // at least one micro-batch per replica

  std::vector<Parameters> trained;
  const auto results = RunRanks(config, plans, **dataset, &trained, absl::Seconds(60));
  double pipelined_loss = 0;
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    if (results[r]->has_loss) pipelined_loss += results[r]->loss;
  }
  const ::varipipe::testing::ReferenceStep reference =
      ::varipipe::testing::UnpipelinedStep(config, plans, **dataset);
  std::printf("loss: pipelined %.9f, unpipelined %.9f\n", pipelined_loss, reference.loss);
  EXPECT_NEAR(pipelined_loss, reference.loss, 1e-5 * reference.loss);
  // Normwise relative differences per tensor: of the parameters (the
  // acceptance criterion, 1e-5) and, stricter, of the updates the step
  // applied (1e-3 of an update of size ~learning rate).
  int compared = 0;
  double worst_parameter = 0;
  double worst_update = 0;
  for (int r = 0; r < 4; ++r) {
    const ::varipipe::testing::Differences d = ::varipipe::testing::Compare(trained[r], reference);
    EXPECT_LE(d.parameters, 1e-5) << "rank " << r;
    EXPECT_LE(d.updates, 1e-3) << "rank " << r;
    worst_parameter = std::max(worst_parameter, d.parameters);
    worst_update = std::max(worst_update, d.updates);
    compared += d.compared;
  }
  std::printf("worst relative difference: parameters %.3g, updates %.3g\n", worst_parameter,
              worst_update);
  EXPECT_EQ(compared, 2 * static_cast<int>(reference.trained.size()));  // each replica has the model
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PlanInterpreterTest,
    ::testing::Values(Case{false, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, "Gpt1F1B"},
                      Case{false, v1::ADAPTIVE, v1::RECOMPUTE_NONE, "GptAdaptive"},
                      Case{false, v1::ADAPTIVE, v1::RECOMPUTE_FULL, "GptAdaptiveRecompute"},
                      Case{false, v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, "Gpt1F1BSelective"},
                      Case{true, v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, "T51F1BSelective"},
                      Case{false, v1::GPIPE, v1::RECOMPUTE_NONE, "GptGPipe"},
                      Case{false, v1::KFKB, v1::RECOMPUTE_NONE, "GptKfkb"},
                      Case{false, v1::INTERLEAVED_1F1B, v1::RECOMPUTE_NONE, "GptInterleaved2", 2},
                      Case{false, v1::INTERLEAVED_1F1B, v1::RECOMPUTE_NONE, "GptInterleaved3", 3},
                      Case{true, v1::GPIPE, v1::RECOMPUTE_FULL, "T5GPipeRecompute"},
                      Case{true, v1::KFKB, v1::RECOMPUTE_NONE, "T5Kfkb"},
                      Case{false, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, "GptPacked1F1B", 1,
                           v1::PACKING},
                      Case{true, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, "T5Packed1F1B", 1,
                           v1::PACKING},
                      Case{true, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, "T51F1B"},
                      Case{true, v1::ADAPTIVE, v1::RECOMPUTE_FULL, "T5AdaptiveRecompute"}),
    [](const auto& info) { return info.param.name; });

// Selective recomputation as executed: the same plan (planned for selective
// recomputation) run as planned and with its recompute field set to "none"
// gives the same parameters, and every rank's measured activation peak
// (counting CPU allocator) is lower with selective recomputation.
TEST_F(PlanInterpreterTest, SelectiveRecomputationLowersTheMeasuredActivationPeak) {
  Case planned_selective;
  planned_selective.recompute = v1::RECOMPUTE_SELECTIVE;
  const v1::JobConfig config = TinyConfig(planned_selective, 2, 1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<v1::ExecutionPlan> selective = Plans(config, 1, **dataset);
  ASSERT_EQ(selective.size(), 2u);
  ASSERT_EQ(selective[0].recompute(), "selective");
  std::vector<v1::ExecutionPlan> none = selective;
  for (v1::ExecutionPlan& plan : none) plan.set_recompute("none");
  const auto activation_peaks = [&](const std::vector<v1::ExecutionPlan>& plans,
                                    std::vector<Parameters>* trained) {
    std::vector<int64_t> peaks;
    for (const auto& r : RunRanks(config, plans, **dataset, trained, absl::Seconds(60))) {
      EXPECT_THAT(r, IsOk());
      peaks.push_back(r.ok() ? r->memory_peak_bytes - r->memory_start_bytes : -1);
      if (r.ok()) {
        EXPECT_EQ(r->instruction_memory.size(), static_cast<size_t>(r->instructions));
      }
    }
    return peaks;
  };
  std::vector<Parameters> trained_selective;
  std::vector<Parameters> trained_none;
  const std::vector<int64_t> with = activation_peaks(selective, &trained_selective);
  const std::vector<int64_t> without = activation_peaks(none, &trained_none);
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d: measured activation peak %.1f KiB with selective recomputation, "
                "%.1f KiB without\n",
                r, with[r] / 1024.0, without[r] / 1024.0);
    EXPECT_GT(with[r], 0);
    EXPECT_LT(with[r], without[r]) << "rank " << r;
    for (const auto& [name, value] : trained_none[r]) {
      EXPECT_TRUE(torch::allclose(trained_selective[r].at(name), value, 1e-6, 1e-7)) << name;
    }
  }
}

// Packed rows (several samples back to back, block-diagonal attention,
// positions restarting per sample, each sample's own labels) give the loss and
// every gradient of the same samples one per row: the whole model on one
// stage, the micro-batches built by the executor's loader.
class PackingTest : public ::testing::TestWithParam<bool> {};

struct WholeModelPass {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
};

WholeModelPass RunWholeModel(const v1::JobConfig& config, const MicroBatchLoader& loader,
                             const v1::MicroBatch& mb, double loss_scale) {
  const ModelSpec spec = *ModelSpecFromConfig(config);
  ModelStage stage(spec, (*PipelineStageRoles(spec, 1))[0]);
  EXPECT_THAT(loader.Lengths(mb), IsOk());
  const StageBatch batch =
      ::varipipe::testing::WholeModelBatch(loader, mb, spec.encoder_decoder, loss_scale);
  WholeModelPass pass;
  StageActivations out = stage.Forward({}, batch);
  pass.loss = out.loss.item<double>();
  out.loss.backward();
  for (const auto& item : stage.named_parameters()) {
    pass.grads[item.key()] = item.value().grad().clone();
  }
  return pass;
}

TEST_P(PackingTest, PackedRowsGiveTheGradientsOfUnpackedRows) {
  const bool t5 = GetParam();
  Case model;
  model.t5 = t5;
  const v1::JobConfig config = TinyConfig(model, 1, 1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  const SamplerOptions sampler = SamplerOptionsFromConfig(config);
  MicroBatchLoader loader(dataset->get(), sampler);
  // Seven samples: unpacked one per row; packed 3 + 2 + 2 per row.
  v1::MicroBatch unpacked;
  v1::MicroBatch packed;
  std::vector<uint32_t> row_input(3, 0);
  std::vector<uint32_t> row_target(3, 0);
  const std::vector<int> row_of = {0, 0, 0, 1, 1, 2, 2};
  double loss_tokens = 0;
  for (int i = 0; i < 7; ++i) {
    const uint64_t id = 100 + 37 * static_cast<uint64_t>(i);
    const SampleLengths s = TruncateSample((*dataset)->Lengths(id), sampler);
    const uint32_t sequence = t5 ? s.input : s.input + s.target;
    unpacked.add_sample_ids(id);
    packed.add_sample_ids(id);
    unpacked.set_input_len(std::max(unpacked.input_len(), sequence));
    unpacked.set_target_len(std::max(unpacked.target_len(), t5 ? s.target : 0));
    row_input[row_of[i]] += sequence;
    row_target[row_of[i]] += t5 ? s.target : 0;
    loss_tokens += static_cast<double>(LossTokens(s, t5));
  }
  for (int start : {0, 3, 5}) packed.add_row_starts(start);
  packed.set_input_len(*std::max_element(row_input.begin(), row_input.end()) + 3);
  packed.set_target_len(t5 ? *std::max_element(row_target.begin(), row_target.end()) + 2 : 0);
  const WholeModelPass one_per_row = RunWholeModel(config, loader, unpacked, 1.0 / loss_tokens);
  const WholeModelPass rows = RunWholeModel(config, loader, packed, 1.0 / loss_tokens);
  std::printf("loss: packed %.9f, unpacked %.9f (rows %u/%u/%u tokens, padded to %u)\n",
              rows.loss, one_per_row.loss, row_input[0], row_input[1], row_input[2],
              packed.input_len());
  EXPECT_NEAR(rows.loss, one_per_row.loss, 1e-6 * one_per_row.loss);
  double worst = 0;
  for (const auto& [name, grad] : one_per_row.grads) {
    const double scale = std::max(grad.abs().max().item<double>(), 1e-30);
    const double difference = (rows.grads.at(name) - grad).abs().max().item<double>() / scale;
    EXPECT_LE(difference, 1e-5) << name;
    worst = std::max(worst, difference);
  }
  std::printf("worst relative gradient difference %.3g over %zu tensors\n", worst,
              one_per_row.grads.size());
}

INSTANTIATE_TEST_SUITE_P(GptAndT5, PackingTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "T5" : "Gpt"; });

class WatchdogTest : public PlanInterpreterTest {};

// GPipe, so that rank 0 posts every activation send before it needs anything
// from rank 1, and rank 1 starts only once rank 0 has done so: every receive
// before the dropped one then only waits for data already on its way, and the
// watchdog can fire nowhere but at the dropped micro-batch, however slow the
// machine. (With 1F1B, a slow rank 0 tripped rank 1's watchdog at an earlier
// receive.) The 10 s watchdog is a wide margin over a loopback transfer of a
// few kilobytes; rank 0's own watchdog is longer still, so it is still waiting
// when rank 1 reports.
TEST_F(WatchdogTest, DroppedSendTripsTheWatchdogWithADiagnostic) {
  Case gpipe;
  gpipe.schedule = v1::GPIPE;
  const v1::JobConfig config = TinyConfig(gpipe, 2, 1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  std::vector<v1::ExecutionPlan> plans = Plans(config, 0, **dataset);
  ASSERT_EQ(plans.size(), 2u);
  // Rank 0 "forgets" to send the activations of the last micro-batch.
  v1::ExecutionPlan& faulty = plans[0];
  uint32_t dropped_mb = 0;
  int last_send = -1;
  for (int i = 0; i < faulty.instructions_size(); ++i) {
    if (faulty.instructions(i).has_send_start() &&
        faulty.instructions(i).send_start().kind() == v1::ACTIVATION) {
      last_send = i;
    }
  }
  ASSERT_GE(last_send, 0);
  dropped_mb = faulty.instructions(last_send).micro_batch();
  v1::ExecutionPlan edited = faulty;
  edited.clear_instructions();
  // Index (in the edited plan) of rank 0's first Wait: every activation send
  // it makes was started before it.
  int first_wait = -1;
  for (int i = 0; i < faulty.instructions_size(); ++i) {
    const v1::Instruction& in = faulty.instructions(i);
    const bool drop = in.micro_batch() == dropped_mb &&
                      ((in.has_send_start() && in.send_start().kind() == v1::ACTIVATION) ||
                       (in.has_send_wait() && in.send_wait().kind() == v1::ACTIVATION));
    if (drop) continue;
    if (first_wait < 0 && (in.has_send_wait() || in.has_recv_wait())) {
      first_wait = edited.instructions_size();
    }
    *edited.add_instructions() = in;
  }
  faulty = edited;
  ASSERT_GE(first_wait, 0);
  RankControl control;
  control.timeouts = {absl::Minutes(5), absl::Seconds(10)};
  control.before_run = [&](int rank, const std::vector<InstructionProgress>& progress) {
    if (rank != 1) return;
    const absl::Time give_up = absl::Now() + absl::Minutes(5);
    while (progress[0].index.load() < first_wait && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_GE(progress[0].index.load(), first_wait) << "rank 0 never reached its first wait";
  };
  std::vector<Parameters> unused;
  const auto results = RunRanks(config, plans, **dataset, &unused, absl::Seconds(10), control);
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kDeadlineExceeded)
      << results[1].status();
  EXPECT_THAT(std::string(results[1].status().message()),
              AllOf(HasSubstr("rank 1"), HasSubstr("instruction #"), HasSubstr("from rank 0"),
                    HasSubstr(absl::StrCat("micro-batch ", dropped_mb)), HasSubstr("watchdog")));
  std::printf("diagnostic: %s\n", std::string(results[1].status().message()).c_str());
}

}  // namespace
}  // namespace varipipe::executor

namespace varipipe::executor {
namespace {

// A receive-order fault: rank 1 posts the receives of two micro-batches of
// different shapes in the wrong order. The transfers pair by channel order,
// so rank 1 receives a message of the wrong size: the iteration must end
// with a diagnostic naming the rank, instruction, peer and micro-batch
// (from the transport's size check or the watchdog), never hang.
TEST_F(WatchdogTest, SwappedReceiveOrderEndsWithADiagnostic) {
  const v1::JobConfig config = TinyConfig({}, 2, 1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  std::vector<v1::ExecutionPlan> plans = Plans(config, 0, **dataset);
  ASSERT_EQ(plans.size(), 2u);
  v1::ExecutionPlan& plan = plans[1];
  int first = -1;
  int second = -1;
  for (int i = 0; i < plan.instructions_size() && second < 0; ++i) {
    const v1::Instruction& in = plan.instructions(i);
    if (!in.has_recv_start() || in.recv_start().kind() != v1::ACTIVATION) continue;
    if (first < 0) {
      first = i;
    } else if (in.recv_start().tensors(0).dims(1) !=
               plan.instructions(first).recv_start().tensors(0).dims(1)) {
      second = i;
    }
  }
  ASSERT_GE(second, 0) << "no two activation receives of different shapes";
  // Post the later receive first (moved to just before the earlier one).
  for (int i = second; i > first; --i) plan.mutable_instructions()->SwapElements(i, i - 1);
  std::vector<Parameters> unused;
  const absl::Time start = absl::Now();
  const auto results = RunRanks(config, plans, **dataset, &unused, absl::Seconds(3));
  ASSERT_FALSE(results[1].ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_THAT(std::string(results[1].status().message()),
              AllOf(HasSubstr("rank 1"), HasSubstr("instruction #"), HasSubstr("from rank 0"),
                    HasSubstr("micro-batch")));
  std::printf("diagnostic: %s\n", std::string(results[1].status().message()).c_str());
}

}  // namespace
}  // namespace varipipe::executor
