// The planner end to end: random mini-batches and job shapes, every plan
// validated, deterministic serialization, and the validator's fault
// detection.
#include "planner/planner.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan/plan_builder.h"
#include "planner/plan/validator.h"
#include "planner/schedule/backward_split.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

v1::JobConfig Config(bool t5, uint32_t pp, uint32_t dp, uint32_t v,
                     std::vector<v1::ScheduleKind> schedules, uint32_t memory_mib = 4096) {
  const std::string json =
      absl::StrCat(R"({"job_id": "test", "model": {"kind": ")", t5 ? "T5" : "GPT",
                   R"(", "num_layers": 8, "hidden_size": 256,
      "num_attention_heads": 4, "vocab_size": 32000},
      "parallelism": {"pipeline": )",
                   pp, R"(, "data": )", dp, R"(, "virtual_chunks": )", v, R"(},
      "cluster": {"device_memory_limit_mib": )",
                   memory_mib, R"(, "devices_per_node": 4},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 8192, "max_sequence_length": 1024},
      "planner": {"tmax_interval_ms": 0.05},
      "training": {"iterations": 1}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  EXPECT_THAT(config, IsOk());
  config->mutable_planner()->clear_schedules();
  for (auto s : schedules) config->mutable_planner()->add_schedules(s);
  ApplyJobConfigDefaults(*config);
  EXPECT_THAT(ValidateJobConfig(*config, "test"), IsOk());
  return *config;
}

MiniBatch Draw(const SyntheticMixture& mixture, uint64_t* cursor, bool t5) {
  MiniBatch mb;
  uint64_t tokens = 0;
  while (true) {
    SampleLengths s = mixture.Sample(*cursor);
    s.target = std::min(s.target, 512u);
    s.input = std::min(s.input, 1024u - (t5 ? 0 : s.target));
    if (tokens + s.input + s.target > 8192) break;
    tokens += s.input + s.target;
    mb.sample_ids.push_back(*cursor);
    mb.lengths.push_back(s);
    ++*cursor;
  }
  return mb;
}

struct Shape {
  bool t5;
  uint32_t pp, dp, v;
  std::vector<v1::ScheduleKind> schedules;
};

TEST(Planner, PlansValidateAcrossShapesAndAreDeterministic) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("Planner.PlansValidateAcrossShapesAndAreDeterministic"));
  const std::vector<Shape> shapes = {
      {false, 1, 1, 1, {v1::ONE_F_ONE_B}},
      {false, 2, 2, 1, {v1::ADAPTIVE, v1::ONE_F_ONE_B}},
      {false, 4, 1, 1, {v1::GPIPE, v1::KFKB}},
      {false, 2, 1, 2, {v1::INTERLEAVED_1F1B}},
      {false, 4, 2, 2, {v1::INTERLEAVED_1F1B, v1::ADAPTIVE}},
      {true, 1, 1, 1, {v1::ONE_F_ONE_B}},
      {true, 2, 1, 1, {v1::ADAPTIVE, v1::ONE_F_ONE_B}},
      {true, 4, 2, 1, {v1::ADAPTIVE, v1::ONE_F_ONE_B, v1::KFKB}},
      {false, 4, 1, 1, {v1::ZERO_BUBBLE_H1, v1::ADAPTIVE_ZERO_BUBBLE}},
      {true, 4, 1, 1, {v1::ADAPTIVE_ZERO_BUBBLE}},
  };
  int validated = 0;
  for (const Shape& shape : shapes) {
    absl::StatusOr<Planner> planner =
        Planner::Create(Config(shape.t5, shape.pp, shape.dp, shape.v, shape.schedules));
    ASSERT_THAT(planner, IsOk());
    const SyntheticMixture mixture = SyntheticMixture::Flan(rng());
    uint64_t cursor = 0;
    for (int iteration = 0; iteration < 8; ++iteration) {
      MiniBatch mb = Draw(mixture, &cursor, shape.t5);
      mb.iteration = iteration;
      SCOPED_TRACE(absl::StrCat(shape.t5 ? "T5" : "GPT", " pp=", shape.pp, " dp=", shape.dp,
                                " v=", shape.v, " iteration ", iteration));
      absl::StatusOr<PlanningResult> a = planner->Plan(mb);
      ASSERT_THAT(a, IsOk());
      ASSERT_EQ(a->plans.size(), shape.pp * shape.dp);
      EXPECT_THAT(ValidatePlans(a->plans), IsOk());
      // The busiest device's compute bounds the makespan from below and,
      // with one replica, is at least the mean device's.
      EXPECT_GT(a->report.busiest_device_ms, 0);
      EXPECT_LE(a->report.busiest_device_ms, a->report.predicted_makespan_ms * (1 + 1e-9));
      if (shape.dp == 1) {
        EXPECT_GE(a->report.busiest_device_ms,
                  (1 - a->report.bubble_fraction) * a->report.predicted_makespan_ms * (1 - 1e-9));
      }
      absl::StatusOr<PlanningResult> b = planner->Plan(mb);
      ASSERT_THAT(b, IsOk());
      for (size_t r = 0; r < a->plans.size(); ++r) {
        EXPECT_EQ(SerializePlanDeterministically(a->plans[r]),
                  SerializePlanDeterministically(b->plans[r]));
      }
      ++validated;
    }
  }
  EXPECT_EQ(validated, 80);
}

// The FLAN-T5-XL preset (T5V11, pp = 4, dp = 2) plans FLAN-like
// mini-batches with the analytic model, zero-bubble schedules included (the
// T5V11 backward split), and every plan validates; each rank's predicted
// peak stays within its own room, which is its device's limit less its own
// model state (the embedding's and the bias tables' replicas included).
TEST(Planner, FlanT5XlPresetPlansAndValidates) {
  absl::StatusOr<v1::JobConfig> config =
      LoadJobConfigFile(absl::StrCat(VARIPIPE_SOURCE_DIR, "/deploy/configs/flan-t5-xl.json"));
  ASSERT_THAT(config, IsOk());
  config->mutable_planner()->add_schedules(v1::ADAPTIVE_ZERO_BUBBLE);
  config->mutable_planner()->set_threads(1);
  absl::StatusOr<Planner> planner = Planner::Create(*config);
  ASSERT_THAT(planner, IsOk());
  EXPECT_THAT(planner->cost_model().description(), HasSubstr("T5V11 layers"));
  const SyntheticMixture mixture = SyntheticMixture::Flan(
      varipipe::testing::TestSeed("Planner.FlanT5XlPresetPlansAndValidates"));
  uint64_t cursor = 0;
  for (int iteration = 0; iteration < 2; ++iteration) {
    SCOPED_TRACE(iteration);
    MiniBatch mb;
    mb.iteration = iteration;
    uint64_t tokens = 0;
    while (true) {
      SampleLengths s = mixture.Sample(cursor);
      s.input = std::min(s.input, 2048u);
      s.target = std::min(s.target, 512u);
      if (tokens + s.input + s.target > 65536) break;
      tokens += s.input + s.target;
      mb.sample_ids.push_back(cursor);
      mb.lengths.push_back(s);
      ++cursor;
    }
    absl::StatusOr<PlanningResult> result = planner->Plan(mb);
    ASSERT_THAT(result, IsOk());
    ASSERT_EQ(result->plans.size(), 8u);
    EXPECT_THAT(ValidatePlans(result->plans), IsOk());
    ASSERT_EQ(result->report.peak_bytes.size(), result->report.memory_limit_per_rank.size());
    for (size_t r = 0; r < result->report.peak_bytes.size(); ++r) {
      EXPECT_LE(result->report.peak_bytes[r], result->report.memory_limit_per_rank[r]) << r;
    }
  }
}

// Zero-bubble plans split every backward: each deferred backward has one
// weight_grad after it and before the all-reduce; the validator refuses a
// plan that drops one, runs one early or adds one.
TEST(Planner, ZeroBubblePlansCarryWeightGradients) {
  for (v1::ScheduleKind schedule : {v1::ZERO_BUBBLE_H1, v1::ADAPTIVE_ZERO_BUBBLE}) {
    v1::JobConfig config = Config(false, 4, 1, 1, {schedule});
    config.mutable_planner()->clear_recompute_modes();
    config.mutable_planner()->add_recompute_modes(v1::RECOMPUTE_NONE);
    absl::StatusOr<Planner> planner = Planner::Create(config);
    ASSERT_THAT(planner, IsOk());
    uint64_t cursor = 0;
    MiniBatch mb = Draw(SyntheticMixture::Flan(11), &cursor, false);
    absl::StatusOr<PlanningResult> r = planner->Plan(mb);
    ASSERT_THAT(r, IsOk());
    ASSERT_THAT(ValidatePlans(r->plans), IsOk());
    for (const v1::ExecutionPlan& plan : r->plans) {
      int deferred = 0;
      int weights = 0;
      int first_weight = -1;
      int last_weight = -1;
      int all_reduce = -1;
      for (int i = 0; i < plan.instructions_size(); ++i) {
        const v1::Instruction& in = plan.instructions(i);
        if (in.has_backward() && in.backward().weight_grad_deferred()) ++deferred;
        if (in.has_weight_grad()) {
          ++weights;
          if (first_weight < 0) first_weight = i;
          last_weight = i;
          EXPECT_GT(in.weight_grad().profiled_ms(), 0);
        }
        if (in.has_all_reduce()) all_reduce = i;
      }
      EXPECT_EQ(deferred, plan.micro_batches_size());
      EXPECT_EQ(weights, plan.micro_batches_size());
      EXPECT_LT(last_weight, all_reduce);
      std::vector<v1::ExecutionPlan> broken = r->plans;
      v1::ExecutionPlan& b = broken[plan.rank()];
      b.mutable_instructions()->DeleteSubrange(last_weight, 1);
      EXPECT_THAT(ValidatePlans(broken),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("reads the gradients before the weight_grad of micro-batch")));
      b.mutable_instructions()->DeleteSubrange(b.instructions_size() - 2, 2);
      EXPECT_THAT(
          ValidatePlans(broken),
          StatusIs(
              absl::StatusCode::kInvalidArgument,
              HasSubstr(
                  "defers its weight gradient (weight_grad_deferred) but no weight_grad follows")));
      broken = r->plans;
      *broken[plan.rank()].add_instructions() = plan.instructions(first_weight);
      EXPECT_THAT(ValidatePlans(broken), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("weight_grad runs twice")));
      broken = r->plans;
      broken[plan.rank()].mutable_instructions()->SwapElements(last_weight, all_reduce);
      EXPECT_THAT(ValidatePlans(broken),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("reads the gradients before the weight_grad")));
    }
  }
}

// With layers that do not divide evenly (30 over 4 stages: 8, 8, 7, 7, as
// the executor splits them), each stage's W time follows the backward split
// rule for the stage's own layer count, the LM head included on the last.
TEST(Planner, ZeroBubbleWeightTimesUseEachStagesOwnLayers) {
  v1::JobConfig config = Config(false, 4, 1, 1, {v1::ZERO_BUBBLE_H1});
  config.mutable_model()->set_num_layers(30);
  // A small vocabulary, so that W stays below half the backward (the rule's
  // cap) on the LM head's stage too.
  config.mutable_model()->set_vocab_size(1024);
  config.mutable_planner()->clear_recompute_modes();
  config.mutable_planner()->add_recompute_modes(v1::RECOMPUTE_NONE);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const BackwardSplitRule rule(ModelDimsFromConfig(config.model()));
  uint64_t cursor = 0;
  const MiniBatch mb = Draw(SyntheticMixture::Flan(5), &cursor, false);
  absl::StatusOr<PlanningResult> r = planner->Plan(mb);
  ASSERT_THAT(r, IsOk());
  const std::vector<uint32_t> layers = {8, 8, 7, 7};
  int checked = 0;
  for (const v1::ExecutionPlan& plan : r->plans) {
    const uint32_t stage = plan.rank();
    absl::flat_hash_map<uint32_t, double> forward_ms;
    absl::flat_hash_map<uint32_t, double> input_grad_ms;
    for (const v1::Instruction& in : plan.instructions()) {
      if (in.has_forward()) forward_ms[in.micro_batch()] = in.forward().profiled_ms();
      if (in.has_backward()) input_grad_ms[in.micro_batch()] = in.backward().profiled_ms();
      if (!in.has_weight_grad()) continue;
      const v1::MicroBatch* m = nullptr;
      for (const v1::MicroBatch& candidate : plan.micro_batches()) {
        if (candidate.id() == in.micro_batch()) m = &candidate;
      }
      ASSERT_NE(m, nullptr);
      const StageLayers own{.samples = static_cast<double>(m->sample_ids_size()),
                            .input_len = m->input_len(),
                            .encoder_layers = layers[stage],
                            .head = stage == 3};
      ASSERT_TRUE(forward_ms.contains(in.micro_batch()));
      ASSERT_TRUE(input_grad_ms.contains(in.micro_batch()));
      // t_W = min(t_F * share, t_bwd / 2) with t_bwd = t_B + t_W.
      const double w = in.weight_grad().profiled_ms();
      const double backward_ms = input_grad_ms[in.micro_batch()] + w;
      EXPECT_NEAR(
          w, std::min(forward_ms[in.micro_batch()] * rule.WeightGemmShare(own), backward_ms / 2),
          1e-9 * backward_ms)
          << "stage " << stage << ", micro-batch " << in.micro_batch();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * r->report.micro_batches);
}

// The validator accepts every plan of every schedule over thousands of
// random mini-batches (random lengths, sizes and job shapes).
TEST(Planner, ValidatorAcceptsThousandsOfRandomPlans) {
  std::mt19937 rng(varipipe::testing::TestSeed("Planner.ValidatorAcceptsThousandsOfRandomPlans"));
  struct Job {
    bool t5;
    uint32_t pp, dp, v;
    v1::ScheduleKind schedule;
  };
  const std::vector<Job> jobs = {{false, 4, 1, 1, v1::GPIPE},
                                 {false, 3, 2, 1, v1::ONE_F_ONE_B},
                                 {false, 2, 1, 3, v1::INTERLEAVED_1F1B},
                                 {false, 4, 1, 2, v1::INTERLEAVED_1F1B},
                                 {false, 4, 1, 1, v1::KFKB},
                                 {false, 4, 2, 1, v1::ADAPTIVE},
                                 {true, 2, 1, 1, v1::ONE_F_ONE_B},
                                 {true, 4, 1, 1, v1::ADAPTIVE},
                                 {true, 3, 1, 1, v1::KFKB},
                                 {true, 4, 1, 1, v1::GPIPE},
                                 {false, 4, 2, 1, v1::ADAPTIVE_ZERO_BUBBLE},
                                 {false, 3, 1, 1, v1::ZERO_BUBBLE_H1},
                                 {true, 4, 1, 1, v1::ADAPTIVE_ZERO_BUBBLE},
                                 {true, 3, 1, 1, v1::ZERO_BUBBLE_H1}};
  int accepted = 0;
  for (const Job& job : jobs) {
    v1::JobConfig config = Config(job.t5, job.pp, job.dp, job.v, {job.schedule}, 65536);
    config.mutable_planner()->clear_recompute_modes();
    config.mutable_planner()->add_recompute_modes(v1::RECOMPUTE_NONE);
    absl::StatusOr<Planner> planner = Planner::Create(config);
    ASSERT_THAT(planner, IsOk());
    for (int trial = 0; trial < 200; ++trial) {
      MiniBatch mb;
      mb.iteration = trial;
      const int n = job.dp * 2 + static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) {
        const uint32_t target = 1 + rng() % 64;
        const uint32_t input = 1 + rng() % (job.t5 ? 1000 : 1000 - target);
        mb.sample_ids.push_back(1000 * trial + i);
        mb.lengths.push_back({input, target});
      }
      absl::StatusOr<PlanningResult> r = planner->Plan(mb);
      if (!r.ok() && absl::IsFailedPrecondition(r.status()) &&
          absl::StrContains(r.status().message(), "fewer micro-batches than the")) {
        continue;  // fewer micro-batches than replicas
      }
      ASSERT_THAT(r, IsOk()) << "job " << (&job - jobs.data()) << " trial " << trial;
      ++accepted;
      // Serialized plans parse back to equal plans.
      for (const v1::ExecutionPlan& plan : r->plans) {
        v1::ExecutionPlan back;
        ASSERT_TRUE(back.ParseFromString(SerializePlanDeterministically(plan)));
        EXPECT_EQ(SerializePlanDeterministically(back), SerializePlanDeterministically(plan));
      }
    }
  }
  std::printf("validated plans for %d random mini-batches\n", accepted);
  EXPECT_GE(accepted, 1900);
}

// A mini-batch that splits into fewer micro-batches than there are
// data-parallel replicas is refused as such, not as a memory failure.
TEST(Planner, TooFewMicroBatchesForTheReplicasIsNamedAsSuch) {
  absl::StatusOr<Planner> planner = Planner::Create(Config(false, 2, 4, 1, {v1::ONE_F_ONE_B}));
  ASSERT_THAT(planner, IsOk());
  MiniBatch mb;
  mb.iteration = 7;
  mb.sample_ids = {11, 12};
  mb.lengths = {{30, 10}, {40, 10}};
  EXPECT_THAT(planner->Plan(mb),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("iteration 7"), HasSubstr("2 samples"),
                             HasSubstr("fewer micro-batches than the 4 data-parallel replicas"),
                             HasSubstr("gets no micro-batch"))));
}

// The simulator places a pipeline's stages on global devices: with tensor
// 2, stage 0's ranks are devices 0-1 and stage 1's 2-3, so in nodes of 2
// every send between the stages crosses nodes (1 GB/s here) and the
// iteration predicts slower than in nodes of 4, where they share one. (Plan
// ranks 0 and 1 would sit in one node of 2 and hide the difference.)
TEST(Planner, PipelineSendsCrossNodesAtGlobalDevices) {
  const SyntheticMixture mixture = SyntheticMixture::Flan(5);
  uint64_t cursor = 0;
  const MiniBatch mb = Draw(mixture, &cursor, false);
  const auto makespan = [&](uint32_t devices_per_node) {
    v1::JobConfig config = Config(false, 2, 1, 1, {v1::ONE_F_ONE_B});
    config.mutable_parallelism()->set_tensor(2);
    config.mutable_cluster()->set_devices_per_node(devices_per_node);
    config.mutable_cluster()->set_inter_node_bandwidth_gbps(1);
    config.mutable_cluster()->set_inter_node_latency_us(500);
    EXPECT_THAT(ValidateJobConfig(config, "test"), IsOk());
    absl::StatusOr<Planner> planner = Planner::Create(config);
    EXPECT_THAT(planner, IsOk());
    if (!planner.ok()) return 0.0;
    absl::StatusOr<PlanningResult> result = planner->Plan(mb);
    EXPECT_THAT(result, IsOk());
    return result.ok() ? result->report.predicted_makespan_ms : 0.0;
  };
  const double one_node = makespan(4);
  const double two_nodes = makespan(2);
  std::printf("tensor 2, pipeline 2: one node %.3f ms, a node per stage %.3f ms\n", one_node,
              two_nodes);
  EXPECT_GT(two_nodes, one_node);
}

class ValidatorFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Planner> planner = Planner::Create(Config(false, 4, 1, 1, {v1::ONE_F_ONE_B}));
    ASSERT_THAT(planner, IsOk());
    const SyntheticMixture mixture = SyntheticMixture::Flan(5);
    uint64_t cursor = 0;
    absl::StatusOr<PlanningResult> r = planner->Plan(Draw(mixture, &cursor, false));
    ASSERT_THAT(r, IsOk());
    plans_ = r->plans;
    ASSERT_THAT(ValidatePlans(plans_), IsOk());
  }
  // Index of the n-th instruction of `kind` on `rank`.
  int Find(int rank, v1::Instruction::OpCase kind, int n = 0) {
    for (int i = 0; i < plans_[rank].instructions_size(); ++i) {
      if (plans_[rank].instructions(i).op_case() == kind && n-- == 0) return i;
    }
    return -1;
  }
  std::vector<v1::ExecutionPlan> plans_;
};

TEST_F(ValidatorFaults, SwappedTransfersOnAChannelAreCaught) {
  // Rank 1 receives activations from rank 0 and sends it gradients on the
  // same channel; starting its first gradient send before its first
  // activation receive breaks the channel order.
  int recv = -1;
  int send = -1;
  for (int i = 0; i < plans_[1].instructions_size(); ++i) {
    const v1::Instruction& in = plans_[1].instructions(i);
    if (recv < 0 && in.has_recv_start() && in.recv_start().peer() == 0) recv = i;
    if (send < 0 && in.has_send_start() && in.send_start().peer() == 0) send = i;
  }
  ASSERT_GE(recv, 0);
  ASSERT_GT(send, recv);
  // Move the send start (only) before the receive start; its buffers are
  // then read before the backward wrote them, or the channel mismatches.
  auto* list = plans_[1].mutable_instructions();
  for (int k = send; k > recv; --k) list->SwapElements(k, k - 1);
  EXPECT_THAT(ValidatePlans(plans_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AnyOf(HasSubstr("does not match"), HasSubstr("on both sides"),
                                        HasSubstr("read before it was written"))));
}

// Three ranks that each wait for a receive before they send: every channel
// is consistently ordered, yet nobody can proceed.
TEST(Validator, DetectsACycleOfWaits) {
  std::vector<v1::ExecutionPlan> plans(3);
  for (int r = 0; r < 3; ++r) {
    v1::ExecutionPlan& p = plans[r];
    p.set_format_version(v1::PLAN_FORMAT_V1);
    p.set_rank(r);
    p.set_num_buffers(1);
    v1::Transfer in;
    in.set_kind(v1::ACTIVATION);
    in.set_peer((r + 2) % 3);
    in.add_buffer_ids(0);
    v1::TensorSpec* spec = in.add_tensors();
    spec->add_dims(4);
    spec->set_dtype(v1::FLOAT32);
    v1::Transfer out = in;
    out.set_peer((r + 1) % 3);
    *p.add_instructions()->mutable_recv_start() = in;
    *p.add_instructions()->mutable_recv_wait() = in;
    *p.add_instructions()->mutable_send_start() = out;
    *p.add_instructions()->mutable_send_wait() = out;
  }
  EXPECT_THAT(
      ValidatePlans(plans),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("deadlock"), HasSubstr("rank 2 at instruction 1"))));
}

TEST_F(ValidatorFaults, ChangedShapeIsCaught) {
  // The receive (start and wait alike) expects a different length.
  const int i = Find(2, v1::Instruction::kRecvStart);
  const int w = Find(2, v1::Instruction::kRecvWait);
  ASSERT_GE(i, 0);
  ASSERT_GE(w, 0);
  plans_[2].mutable_instructions(i)->mutable_recv_start()->mutable_tensors(0)->set_dims(1, 7);
  plans_[2].mutable_instructions(w)->mutable_recv_wait()->mutable_tensors(0)->set_dims(1, 7);
  EXPECT_THAT(ValidatePlans(plans_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not match")));
}

TEST_F(ValidatorFaults, RemovedWaitIsCaught) {
  const int i = Find(3, v1::Instruction::kRecvWait);
  ASSERT_GE(i, 0);
  plans_[3].mutable_instructions()->DeleteSubrange(i, 1);
  EXPECT_THAT(ValidatePlans(plans_), StatusIs(absl::StatusCode::kInvalidArgument,
                                              ::testing::AnyOf(HasSubstr("before its RecvWait"),
                                                               HasSubstr("Start without a Wait"))));
}

TEST_F(ValidatorFaults, EarlyFreeIsCaught) {
  // Free the first forward's output buffers right after the forward, before
  // they are sent.
  const int f = Find(0, v1::Instruction::kForward);
  ASSERT_GE(f, 0);
  v1::Instruction free;
  for (uint32_t id : plans_[0].instructions(f).forward().output_buffer_ids()) {
    free.mutable_free_buffer()->add_buffer_ids(id);
  }
  auto* list = plans_[0].mutable_instructions();
  list->Add()->CopyFrom(free);
  for (int k = list->size() - 1; k > f + 1; --k) list->SwapElements(k, k - 1);
  EXPECT_THAT(ValidatePlans(plans_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("read after it was freed")));
}

}  // namespace
}  // namespace varipipe::planner
