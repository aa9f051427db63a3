// The plan interpreter running the planner's real plans: ranks as threads,
// Gloo over loopback TCP, rendezvous through a real redis-server.
//
// Equivalence: one optimizer step on a fixed mini-batch with pp=2, dp=2
// leaves the same parameters (1e-5 relative, fp32) as one process training
// the whole mini-batch unpipelined, for GPT and T5, with the 1F1B and the
// adaptive schedules and with full recomputation. The watchdog test drops a
// send from one rank's plan and expects a diagnostic instead of a hang.
#include "executor/runtime/plan_interpreter.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
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
      R"(", "num_layers": 4, )", c.t5 ? R"("num_decoder_layers": 4, )" : "", R"("hidden_size": 32,
      "num_attention_heads": 4, "ffn_hidden_size": 64, "vocab_size": 61, "dtype": "FLOAT32"},
      "parallelism": {"pipeline": )",
      pp, R"(, "data": )", dp, R"(},
      "cluster": {"device_memory_limit_mib": )", c.t5 && c.recompute == v1::RECOMPUTE_NONE ? 8 : 4, R"(, "devices_per_node": 8},
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
    absl::StatusOr<planner::Planner> planner = planner::Planner::Create(config);
    EXPECT_THAT(planner, IsOk());
    absl::StatusOr<planner::PlanningResult> result = planner->Plan(
        {.iteration = iteration, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths});
    EXPECT_THAT(result, IsOk());
    return result.ok() ? result->plans : std::vector<v1::ExecutionPlan>{};
  }

  // Runs `plans` (one per rank) on threads; returns each rank's parameters
  // after the step and each rank's status.
  std::vector<absl::StatusOr<IterationStats>> RunRanks(const v1::JobConfig& config,
                                                       const std::vector<v1::ExecutionPlan>& plans,
                                                       const SampleDataset& dataset,
                                                       std::vector<Parameters>* parameters,
                                                       absl::Duration timeout) {
    const int size = static_cast<int>(plans.size());
    const int pp = static_cast<int>(config.parallelism().pipeline());
    std::vector<absl::StatusOr<IterationStats>> results(size, absl::UnknownError("not run"));
    parameters->assign(size, {});
    std::vector<std::thread> threads;
    const std::string run = absl::StrCat("run", ++runs_);
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
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
        const ModelSpec spec = *ModelSpecFromConfig(config);
        const std::vector<StageRole> roles = *PipelineStageRoles(spec, pp);
        ModelStage stage(spec, roles[r % pp]);
        TrainingOptimizer optimizer(stage.parameters(), config.training());
        MicroBatchLoader loader(&dataset, SamplerOptionsFromConfig(config));
        InterpreterOptions options;
        options.wait_timeout = timeout;
        for (int k = 0; k < pp; ++k) options.pipeline_group.push_back(r / pp * pp + k);
        PlanInterpreter interpreter({{static_cast<uint32_t>(r % pp), &stage}}, transport->get(),
                                    &loader, &optimizer, options);
        results[r] = interpreter.Run(plans[r]);
        for (const auto& item : stage.named_parameters()) {
          (*parameters)[r][item.key()] = item.value().detach().clone();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  std::unique_ptr<RedisServer> redis_;
  int runs_ = 0;
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
    EXPECT_EQ(plan.recompute(), c.recompute == v1::RECOMPUTE_FULL ? "full" : "none");
  }
  std::printf("%s: %d micro-batches over 2 replicas, %d instructions on rank 0\n",
              c.name.c_str(), micro_batches, plans[0].instructions_size());
  EXPECT_GE(micro_batches, 3);  // really micro-batched

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
                      Case{true, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, "T51F1B"},
                      Case{true, v1::ADAPTIVE, v1::RECOMPUTE_FULL, "T5AdaptiveRecompute"}),
    [](const auto& info) { return info.param.name; });

class WatchdogTest : public PlanInterpreterTest {};

TEST_F(WatchdogTest, DroppedSendTripsTheWatchdogWithADiagnostic) {
  const v1::JobConfig config = TinyConfig({}, 2, 1);
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
  for (int i = 0; i < faulty.instructions_size(); ++i) {
    const v1::Instruction& in = faulty.instructions(i);
    const bool drop = in.micro_batch() == dropped_mb &&
                      ((in.has_send_start() && in.send_start().kind() == v1::ACTIVATION) ||
                       (in.has_send_wait() && in.send_wait().kind() == v1::ACTIVATION));
    if (!drop) *edited.add_instructions() = in;
  }
  faulty = edited;
  std::vector<Parameters> unused;
  const auto results = RunRanks(config, plans, **dataset, &unused, absl::Seconds(2));
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
