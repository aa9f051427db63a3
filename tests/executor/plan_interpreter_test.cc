// The plan interpreter running the planner's real plans: ranks as threads,
// Gloo over loopback TCP, rendezvous through a real redis-server
// (tests/testing/threaded_ranks.h). The equivalence matrix against the
// independent reference model is equivalence_test.cc; here: selective
// recomputation lowers every rank's measured activation peak, zero-bubble
// plans (split backwards) train like the reference and a wrong order of
// their weight_grads is refused, packed rows give the gradients of unpacked
// ones, and the watchdog tests drop a send
// from one rank's plan, or swap two receives, and expect a diagnostic
// instead of a hang.
#include "executor/runtime/plan_interpreter.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_config.h"
#include "common/dataset/loss_tokens.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "executor/model/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/split_backward.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/threaded_ranks.h"
#include "tests/testing/tiny_job.h"
#include "tests/testing/whole_model_batch.h"

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

v1::JobConfig TinyConfig(const Case& c, uint32_t pp, uint32_t dp) {
  ::varipipe::testing::TinyJob job;
  job.t5 = c.t5;
  job.schedule = c.schedule;
  job.recompute = c.recompute;
  job.method = c.method;
  job.pipeline = pp;
  job.data = dp;
  job.chunks = c.chunks;
  absl::StatusOr<v1::JobConfig> config = ::varipipe::testing::TinyJobConfig(job);
  EXPECT_THAT(config, IsOk());
  return config.ok() ? *config : v1::JobConfig();
}

using Parameters = std::map<std::string, torch::Tensor>;

class PlanInterpreterTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }

  // Plans iteration `iteration` of `config`'s data (PlanTinyIteration).
  std::vector<v1::ExecutionPlan> Plans(const v1::JobConfig& config, uint64_t iteration,
                                       const SampleDataset& dataset) {
    uint64_t limit = 0;
    absl::StatusOr<std::vector<v1::ExecutionPlan>> plans =
        ::varipipe::testing::PlanTinyIteration(config, iteration, dataset, &limit);
    EXPECT_THAT(plans, IsOk());
    if (!plans.ok()) return {};
    std::printf("planned with %llu MiB per device\n", static_cast<unsigned long long>(limit));
    return *std::move(plans);
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
    InstallCountingCpuAllocator();
    // Fresh accounts per run; earlier ones stay alive (tensors they paid for,
    // such as the returned parameters, may outlive the run).
    memory_.clear();
    for (int r = 0; r < size; ++r) {
      accounts_.push_back(std::make_unique<MemoryAccount>());
      memory_.push_back(accounts_.back().get());
    }
    ::varipipe::testing::ThreadedRanksOptions options;
    options.redis_host = redis_->host();
    options.redis_port = redis_->port();
    options.redis_password = redis_->password();
    options.prefix = absl::StrCat("run", ++runs_);
    options.timeout = timeout;
    options.timeouts = control.timeouts;
    options.memory = memory_;
    options.before_run = control.before_run;
    options.prefetch_inputs = prefetch_inputs_;
    const std::vector<::varipipe::testing::RankRun> runs =
        ::varipipe::testing::RunThreadedRanks(config, {plans}, dataset, options);
    std::vector<absl::StatusOr<IterationStats>> results;
    parameters->clear();
    for (const ::varipipe::testing::RankRun& run : runs) {
      if (run.status.ok()) {
        results.push_back(run.stats.front());
      } else {
        results.push_back(run.status);
      }
      parameters->push_back(run.parameters);
    }
    return results;
  }

  std::unique_ptr<RedisServer> redis_;
  int runs_ = 0;
  // InterpreterOptions::prefetch_inputs of RunRanks' ranks; tests that read
  // the measured memory set 0 (inputs built on the rank's thread when
  // taken): a prefetch thread charges its rank at times that vary.
  size_t prefetch_inputs_ = InterpreterOptions().prefetch_inputs;
  // Per rank, of the last RunRanks; every account lives as long as the test.
  std::vector<MemoryAccount*> memory_;
  std::vector<std::unique_ptr<MemoryAccount>> accounts_;
};

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
  prefetch_inputs_ = 0;  // exact measured memory
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
    // The planner's prediction is for its cost model's hardware (the
    // analytic model unless planner.cost_model_path names a measured one),
    // so it is printed, not compared.
    std::printf(
        "rank %d: measured activation peak %.1f KiB with selective recomputation, "
        "%.1f KiB without; the plan predicts %.1f KiB\n",
        r, with[r] / 1024.0, without[r] / 1024.0,
        selective[r].predicted_activation_peak_bytes() / 1024.0);
    EXPECT_GT(selective[r].predicted_activation_peak_bytes(), 0);
    EXPECT_GT(with[r], 0);
    EXPECT_LT(with[r], without[r]) << "rank " << r;
    for (const auto& [name, value] : trained_none[r]) {
      EXPECT_TRUE(torch::allclose(trained_selective[r].at(name), value, 1e-6, 1e-7)) << name;
    }
  }
}

// Split backwards (zero-bubble schedules) as executed: the planner's
// ZB-H1 and adaptive zero-bubble plans (one SGD step) give the parameters of
// the independent reference model (1e-5 relative); every rank's backwards
// keep the linear layers' operands for W (IterationStats::
// weight_grad_peak_bytes), and the counting allocator sees each weight_grad
// release them (the live bytes fall across every weight_grad but the first
// of each stage, which also allocates its weight gradients).
class ZeroBubbleEquivalence : public PlanInterpreterTest {};

TEST_P(ZeroBubbleEquivalence, OneSgdStepMatchesTheReference) {
  const Case& c = GetParam();
  ::varipipe::testing::TinyJob job;
  job.t5 = c.t5;
  job.schedule = c.schedule;
  job.recompute = c.recompute;
  job.pipeline = 2;
  job.optimizer = v1::SGD;
  job.iterations = 1;
  absl::StatusOr<v1::JobConfig> config = ::varipipe::testing::TinyJobConfig(job);
  ASSERT_THAT(config, IsOk());
  // The DP over the samples alone: its micro-batches give every rank split
  // backwards to check (over packed rows the adaptive zero-bubble schedule
  // of this tiny T5 job splits none on rank 0).
  config->mutable_planner()->set_dp_packed_rows(false);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<v1::ExecutionPlan> plans = Plans(*config, 0, **dataset);
  ASSERT_EQ(plans.size(), 2u);
  ASSERT_GE(::varipipe::testing::SplitBackwards(plans), 1);
  std::vector<Parameters> after;
  prefetch_inputs_ = 0;  // no prefetch lands inside a weight_grad
  const auto results = RunRanks(*config, plans, **dataset, &after, absl::Seconds(60));
  ::varipipe::testing::ReferenceModel reference(*config);
  const ::varipipe::testing::ReferencePass pass =
      reference.Gradients(::varipipe::testing::IterationSamples(plans), **dataset);
  reference.SgdStep(pass.gradients, config->training().learning_rate());
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    const IterationStats& stats = *results[r];
    const ::varipipe::testing::TensorDifference d =
        ::varipipe::testing::MaxRelativeDifference(after[r], reference.parameters());
    EXPECT_LE(d.worst, 1e-5) << "rank " << r << ": parameter " << d.worst_name;
    EXPECT_GT(stats.weight_grad_peak_bytes, 0) << "rank " << r;
    std::set<uint32_t> stages_seen;
    int weight_grads = 0;
    int falling = 0;
    for (int i = 1; i < plans[r].instructions_size(); ++i) {
      const v1::Instruction& in = plans[r].instructions(i);
      if (!in.has_weight_grad()) continue;
      ++weight_grads;
      const bool first_of_stage = stages_seen.insert(in.stage()).second;
      const int64_t released =
          stats.instruction_memory[i - 1].current_bytes - stats.instruction_memory[i].current_bytes;
      if (released > 0) ++falling;
      if (!first_of_stage) {
        EXPECT_GT(released, 0) << "rank " << r << " instruction #" << i;
      }
    }
    double weight_ms = 0;
    double profiled_weight_ms = 0;
    for (const MicroBatchTime& t : stats.micro_batch_times) {
      weight_ms += t.weight_seconds * 1e3;
      profiled_weight_ms += t.profiled_weight_ms;
    }
    EXPECT_GT(weight_ms, 0);
    EXPECT_GT(profiled_weight_ms, 0);
    std::printf(
        "rank %zu: %d weight_grads (%d released memory), backwards kept at most %.1f KiB for "
        "them; measured activation peak %.1f KiB, the plan predicts %.1f KiB; parameters "
        "within %.3g of the reference; W %.2f ms (profiled %.2f ms)\n",
        r, weight_grads, falling, stats.weight_grad_peak_bytes / 1024.0,
        (stats.memory_peak_bytes - stats.memory_start_bytes) / 1024.0,
        plans[r].predicted_activation_peak_bytes() / 1024.0, d.worst, weight_ms,
        profiled_weight_ms);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, ZeroBubbleEquivalence,
    ::testing::Values(Case{.schedule = v1::ZERO_BUBBLE_H1, .name = "GptZeroBubbleH1"},
                      Case{.schedule = v1::ADAPTIVE_ZERO_BUBBLE, .name = "GptAdaptiveZeroBubble"},
                      Case{.t5 = true,
                           .schedule = v1::ZERO_BUBBLE_H1,
                           .recompute = v1::RECOMPUTE_SELECTIVE,
                           .name = "T5ZeroBubbleH1Selective"},
                      Case{.t5 = true,
                           .schedule = v1::ADAPTIVE_ZERO_BUBBLE,
                           .recompute = v1::RECOMPUTE_FULL,
                           .name = "T5AdaptiveZeroBubbleFull"}),
    [](const auto& info) { return info.param.name; });

// A zero-bubble plan whose weight_grad is missing (so the all-reduce would
// read incomplete gradients), repeated, or before its backward, on every
// rank, is refused before any instruction runs, naming
// the instruction; the parameters stay untouched.
TEST_F(PlanInterpreterTest, RefusesZeroBubblePlansWithWrongWeightGradOrders) {
  Case zb;
  zb.schedule = v1::ZERO_BUBBLE_H1;
  const v1::JobConfig config = TinyConfig(zb, 2, 1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<v1::ExecutionPlan> plans = Plans(config, 0, **dataset);
  ASSERT_EQ(plans.size(), 2u);
  // The untouched parameters: a run of no instruction.
  std::vector<v1::ExecutionPlan> empty = plans;
  for (v1::ExecutionPlan& plan : empty) {
    plan.clear_instructions();
    plan.set_num_buffers(0);
  }
  std::vector<Parameters> initial;
  for (const auto& r : RunRanks(config, empty, **dataset, &initial, absl::Seconds(60))) {
    ASSERT_THAT(r, IsOk());
  }
  enum Fault { kMissing, kTwice, kBeforeBackward };
  for (Fault fault : {kMissing, kTwice, kBeforeBackward}) {
    std::vector<v1::ExecutionPlan> faulty = plans;
    for (v1::ExecutionPlan& plan : faulty) {
      int w = -1;
      for (int i = 0; i < plan.instructions_size(); ++i) {
        if (plan.instructions(i).has_weight_grad()) w = i;
      }
      ASSERT_GE(w, 0) << "rank " << plan.rank() << " has no weight_grad";
      auto* instructions = plan.mutable_instructions();
      if (fault == kMissing) {
        instructions->DeleteSubrange(w, 1);
      } else if (fault == kTwice) {
        *plan.add_instructions() = plan.instructions(w);
        for (int i = plan.instructions_size() - 1; i > w + 1; --i) {
          instructions->SwapElements(i, i - 1);
        }
      } else {
        for (int i = w; i > 0; --i) instructions->SwapElements(i, i - 1);
      }
    }
    std::vector<Parameters> after;
    const auto results = RunRanks(config, faulty, **dataset, &after, absl::Seconds(60));
    // A missing weight_grad is caught at the all_reduce that follows.
    const std::string op = fault == kMissing ? "(all_reduce," : "(weight_grad,";
    const std::string expected = fault == kMissing ? "reads the gradients before the weight_grad"
                                 : fault == kTwice ? "weight_grad runs twice"
                                                   : "weight_grad without a backward";
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_THAT(results[r].status(),
                  ::varipipe::testing::StatusIs(
                      absl::StatusCode::kInvalidArgument,
                      AllOf(HasSubstr(absl::StrCat("for rank ", r, ": instruction #")),
                            HasSubstr(op), HasSubstr(expected))))
          << "fault " << fault;
      for (const auto& [name, value] : initial[r]) {
        const auto it = after[r].find(name);
        ASSERT_NE(it, after[r].end()) << "rank " << r << " returned no " << name;
        EXPECT_TRUE(torch::equal(it->second, value)) << name;
      }
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
    for (v1::MicroBatch* mb : {&unpacked, &packed}) {
      mb->add_sample_input_lens(s.input);
      mb->add_sample_target_lens(s.target);
    }
    unpacked.add_sample_input_offsets(0);
    unpacked.add_sample_target_offsets(0);
    packed.add_sample_input_offsets(row_input[row_of[i]]);
    packed.add_sample_target_offsets(row_target[row_of[i]]);
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
  std::printf("loss: packed %.9f, unpacked %.9f (rows %u/%u/%u tokens, padded to %u)\n", rows.loss,
              one_per_row.loss, row_input[0], row_input[1], row_input[2], packed.input_len());
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
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kDeadlineExceeded) << results[1].status();
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
