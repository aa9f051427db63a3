// The validator's memory replay (memory_replay.h): a rank's peak from its
// plan's own instructions, and plans refused where their live buffers go
// over the limit, naming the rank and the instruction.
#include "planner/plan/memory_replay.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan/validator.h"
#include "planner/planner.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr double kMiB = 1 << 20;

v1::TensorSpec OneMiB() {
  v1::TensorSpec spec;
  for (int64_t d : {1, 1024, 256}) spec.add_dims(d);
  spec.set_dtype(v1::FLOAT32);
  return spec;
}

v1::Transfer Transfer(v1::CommKind kind, uint32_t buffer) {
  v1::Transfer t;
  t.set_kind(kind);
  t.set_peer(0);
  t.add_buffer_ids(buffer);
  *t.add_tensors() = OneMiB();
  return t;
}

// The last stage of two (stage 1), two micro-batches: each received
// activation (1 MiB) is taken by its forward, each input gradient (1 MiB)
// sent back; `waits_at_end`: the gradient sends are waited (and their
// buffers freed) at the end, as the communication plan does, otherwise
// right after they start.
v1::ExecutionPlan LastStage(bool waits_at_end) {
  v1::ExecutionPlan plan;
  const auto add = [&](uint32_t mb) {
    v1::Instruction* i = plan.add_instructions();
    i->set_stage(1);
    i->set_micro_batch(mb);
    return i;
  };
  const auto free = [&](uint32_t mb, uint32_t buffer) {
    add(mb)->mutable_free_buffer()->add_buffer_ids(buffer);
  };
  for (uint32_t mb = 0; mb < 2; ++mb) {
    const uint32_t activation = 2 * mb;
    const uint32_t gradient = 2 * mb + 1;
    *add(mb)->mutable_recv_start() = Transfer(v1::ACTIVATION, activation);
    *add(mb)->mutable_recv_wait() = Transfer(v1::ACTIVATION, activation);
    add(mb)->mutable_forward()->add_input_buffer_ids(activation);
    free(mb, activation);
    v1::BackwardPass* b = add(mb)->mutable_backward();
    b->add_input_grad_buffer_ids(gradient);
    *b->add_input_grad_tensors() = OneMiB();
    *add(mb)->mutable_send_start() = Transfer(v1::GRADIENT, gradient);
    if (!waits_at_end) {
      *add(mb)->mutable_send_wait() = Transfer(v1::GRADIENT, gradient);
      free(mb, gradient);
    }
  }
  if (waits_at_end) {
    for (uint32_t mb = 0; mb < 2; ++mb) {
      *add(mb)->mutable_send_wait() = Transfer(v1::GRADIENT, 2 * mb + 1);
      free(mb, 2 * mb + 1);
    }
  }
  return plan;
}

// Stage 1 of each micro-batch stores 8 MiB and peaks at 12 MiB.
StageCostTable Costs() {
  StageOpCost c;
  c.stored_bytes = 8 * kMiB;
  c.peak_bytes = 12 * kMiB;
  return StageCostTable(2, std::vector<StageOpCost>(2, c));
}

TEST(MemoryReplay, GradientsSentAndWaitedAtTheEndStayLive) {
  const v1::ExecutionPlan early = LastStage(false);
  const v1::ExecutionPlan late = LastStage(true);
  absl::StatusOr<ReplayedPeak> a = ReplayActivationMemory(early, Costs());
  absl::StatusOr<ReplayedPeak> b = ReplayActivationMemory(late, Costs());
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  // Freed at once: each forward runs alone (12 MiB; its input is its own).
  EXPECT_EQ(a->bytes, 12 * kMiB);
  EXPECT_EQ(early.instructions(a->instruction).op_case(), v1::Instruction::kForward);
  // Waited at the end: the second forward runs beside the first gradient,
  // and the second activation arrived beside that gradient too.
  EXPECT_EQ(b->bytes, 13 * kMiB);
  EXPECT_EQ(late.instructions(b->instruction).op_case(), v1::Instruction::kForward);
  EXPECT_EQ(late.instructions(b->instruction).micro_batch(), 1u);
}

TEST(MemoryReplay, RefusesCostsThatDoNotCoverThePlan) {
  const StageCostTable one_stage(1, std::vector<StageOpCost>(2));
  EXPECT_THAT(ReplayActivationMemory(LastStage(true), one_stage),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 1")));
}

TEST(MemoryReplay, TensorSpecBytesByDtype) {
  v1::TensorSpec spec = OneMiB();
  EXPECT_EQ(TensorSpecBytes(spec), kMiB);
  spec.set_dtype(v1::BFLOAT16);
  EXPECT_EQ(TensorSpecBytes(spec), kMiB / 2);
  spec.set_dtype(v1::INT64);
  EXPECT_EQ(TensorSpecBytes(spec), 2 * kMiB);
}

// Fault injection on the planner's own plans (GPT, pp = 2, dp = 2, 1F1B over
// micro-batches of 2 samples): with
// every rank's limit at its replayed peak they validate; once a rank's
// buffers are never freed (its free_buffer instructions dropped), its live
// buffers pass that limit and the validator names the rank and the
// instruction.
TEST(MemoryReplay, ValidatorRefusesAPlanWhoseLiveBuffersExceedTheLimit) {
  const std::string json = R"({"job_id": "replay", "model": {"kind": "GPT", "num_layers": 4,
      "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 32000},
      "parallelism": {"pipeline": 2, "data": 2},
      "cluster": {"device_memory_limit_mib": 4096, "devices_per_node": 4},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 8192, "max_sequence_length": 1024},
      "planner": {"partition_methods": ["FIXED_SIZE"], "fixed_micro_batch_size": 2,
                  "schedules": ["ONE_F_ONE_B"]},
      "training": {"iterations": 1}})";
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  ASSERT_THAT(config, IsOk());
  ApplyJobConfigDefaults(*config);
  ASSERT_THAT(ValidateJobConfig(*config, "test"), IsOk());
  absl::StatusOr<Planner> planner = Planner::Create(*config);
  ASSERT_THAT(planner, IsOk());
  const SyntheticMixture mixture = SyntheticMixture::Flan(7);
  MiniBatch mb;
  uint64_t tokens = 0;
  for (uint64_t id = 0;; ++id) {
    SampleLengths s = mixture.Sample(id);
    s.input = std::min(s.input, 1024u);
    s.target = 0;
    if (tokens + s.input > 8192) break;
    tokens += s.input;
    mb.sample_ids.push_back(id);
    mb.lengths.push_back(s);
  }
  absl::StatusOr<PlanningResult> result = planner->Plan(mb);
  ASSERT_THAT(result, IsOk());
  std::vector<v1::ExecutionPlan> plans = result->plans;
  ASSERT_EQ(plans.size(), 4u);
  // Costs of the test's own (each stage of each micro-batch stores 1 MiB
  // and peaks at 2 MiB): the replay needs only some.
  StageOpCost c;
  c.stored_bytes = kMiB;
  c.peak_bytes = 2 * kMiB;
  size_t micro_batches = 0;
  for (const v1::ExecutionPlan& plan : plans) {
    micro_batches = std::max<size_t>(micro_batches, plan.micro_batches_size());
  }
  const StageCostTable costs(2, std::vector<StageOpCost>(micro_batches, c));
  const std::vector<const StageCostTable*> rank_costs(4, &costs);
  std::vector<double> limits;
  for (const v1::ExecutionPlan& plan : plans) {
    absl::StatusOr<ReplayedPeak> peak = ReplayActivationMemory(plan, costs);
    ASSERT_THAT(peak, IsOk());
    limits.push_back(peak->bytes);
    std::printf("rank %zu: %d micro-batches, replayed peak %.2f MiB\n", limits.size() - 1,
                plan.micro_batches_size(), peak->bytes / kMiB);
  }
  EXPECT_THAT(ValidatePlans(plans, {}, limits, 2, rank_costs), IsOk());
  // Rank 2 (replica 1, stage 0) never frees a buffer.
  v1::ExecutionPlan& leaky = plans[2];
  google::protobuf::RepeatedPtrField<v1::Instruction> kept;
  for (const v1::Instruction& in : leaky.instructions()) {
    if (!in.has_free_buffer()) *kept.Add() = in;
  }
  leaky.mutable_instructions()->Swap(&kept);
  const absl::Status refused = ValidatePlans(plans, {}, limits, 2, rank_costs);
  std::printf("%s\n", std::string(refused.message()).c_str());
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument,
                                AllOf(HasSubstr("rank 2"), HasSubstr("after instruction"),
                                      HasSubstr("over its limit"))));
}

}  // namespace
}  // namespace varipipe::planner
