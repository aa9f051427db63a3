// The planner end to end: random mini-batches and job shapes, every plan
// validated, deterministic serialization, and the validator's fault
// detection.
#include "planner/planner.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan/plan_builder.h"
#include "planner/plan/validator.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

v1::JobConfig Config(bool t5, uint32_t pp, uint32_t dp, uint32_t v,
                     std::vector<v1::ScheduleKind> schedules) {
  const std::string json =
      absl::StrCat(R"({"job_id": "test", "model": {"kind": ")", t5 ? "T5" : "GPT",
                   R"(", "num_layers": 8, "hidden_size": 256,
      "num_attention_heads": 4, "vocab_size": 32000},
      "parallelism": {"pipeline": )",
                   pp, R"(, "data": )", dp, R"(, "virtual_chunks": )", v, R"(},
      "cluster": {"device_memory_limit_mib": 4096, "devices_per_node": 4},
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
      absl::StatusOr<PlanningResult> b = planner->Plan(mb);
      ASSERT_THAT(b, IsOk());
      for (size_t r = 0; r < a->plans.size(); ++r) {
        EXPECT_EQ(SerializePlanDeterministically(a->plans[r]),
                  SerializePlanDeterministically(b->plans[r]));
      }
      ++validated;
    }
  }
  EXPECT_EQ(validated, 64);
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

TEST_F(ValidatorFaults, SwappedReceivesAreCaught) {
  // Rank 1 receives activations of micro-batches 0 and 1 from rank 0 and
  // gradients from rank 2; swap its first two receive starts.
  const int a = Find(1, v1::Instruction::kRecvStart, 0);
  const int b = Find(1, v1::Instruction::kRecvStart, 1);
  ASSERT_GE(b, 0);
  plans_[1].mutable_instructions()->SwapElements(a, b);
  EXPECT_THAT(ValidatePlans(plans_), StatusIs(absl::StatusCode::kInvalidArgument));
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

TEST_F(ValidatorFaults, DeadlockIsReportedWithWhereRanksWait) {
  // Rank 0 waits for a gradient before it has started its sends.
  const int wait = Find(0, v1::Instruction::kRecvWait);
  const int first_send = Find(0, v1::Instruction::kSendStart);
  ASSERT_GT(wait, first_send);
  auto* list = plans_[0].mutable_instructions();
  for (int k = wait; k > first_send; --k) list->SwapElements(k, k - 1);
  EXPECT_THAT(ValidatePlans(plans_), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace varipipe::planner
