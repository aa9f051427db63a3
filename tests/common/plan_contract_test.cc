// The plan contract (common/plan_contract/): the rules both the planner's
// validator and the executor's plan check apply. Hand-built plans pin each
// rule and the field or instruction it names; randomized corruptions of a
// valid stream are each caught at the instruction that breaks the rule.
#include <random>
#include <string>
#include <vector>

#include "common/plan_contract/buffer_lifetimes.h"
#include "common/plan_contract/format_version.h"
#include "common/plan_contract/instruction_text.h"
#include "common/plan_contract/micro_batch_rows.h"
#include "common/plan_contract/sample_placement.h"
#include "common/plan_contract/weight_grad_order.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varipipe::plan_contract {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A GPT micro-batch of `lens` (input tokens; no target) packed into rows
// starting at `row_starts` (empty: one sample per row), samples back to back.
v1::MicroBatch Packed(const std::vector<uint32_t>& lens, const std::vector<uint32_t>& row_starts,
                      uint32_t input_len) {
  v1::MicroBatch mb;
  mb.set_input_len(input_len);
  uint32_t offset = 0;
  size_t next_row = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    if (next_row < row_starts.size() && row_starts[next_row] == i) {
      offset = 0;
      ++next_row;
    }
    if (row_starts.empty()) offset = 0;
    mb.add_sample_ids(100 + i);
    mb.add_sample_input_lens(lens[i]);
    mb.add_sample_target_lens(0);
    mb.add_sample_input_offsets(offset);
    mb.add_sample_target_offsets(0);
    offset += lens[i];
  }
  for (uint32_t s : row_starts) mb.add_row_starts(s);
  return mb;
}

TEST(PlanContract, RowsAndPaddedTokensCountPackedRowsNotSamples) {
  const v1::MicroBatch unpacked = Packed({5, 7, 3}, {}, 8);
  EXPECT_EQ(MicroBatchRows(unpacked), 3u);
  EXPECT_EQ(PaddedTokens(unpacked), 24u);
  const v1::MicroBatch packed = Packed({5, 3, 7, 1}, {0, 2}, 8);
  EXPECT_EQ(MicroBatchRows(packed), 2u);
  EXPECT_EQ(PaddedTokens(packed), 16u);
}

TEST(PlanContract, PlaceSamplesGroupsPackedRows) {
  std::vector<std::vector<SamplePlacement>> rows;
  ASSERT_FALSE(PlaceSamples(Packed({5, 3, 7, 1}, {0, 2}, 8), false, &rows).has_value());
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_EQ(rows[0].size(), 2u);
  EXPECT_EQ(rows[0][1].sample_id, 101u);
  EXPECT_EQ(rows[0][1].input_offset, 5u);
  ASSERT_EQ(rows[1].size(), 2u);
  EXPECT_EQ(rows[1][1].index, 3);
  EXPECT_EQ(rows[1][1].input_offset, 7u);
  ASSERT_FALSE(PlaceSamples(Packed({5, 7, 3}, {}, 8), false, &rows).has_value());
  EXPECT_EQ(rows.size(), 3u);
}

TEST(PlanContract, PlaceSamplesNamesTheFieldAtFault) {
  std::vector<std::vector<SamplePlacement>> rows;
  struct Case {
    std::string what;
    std::function<void(v1::MicroBatch&)> corrupt;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"a missing length", [](v1::MicroBatch& mb) { mb.mutable_sample_input_lens()->RemoveLast(); },
       "sample_input_lens"},
      {"rows not from 0", [](v1::MicroBatch& mb) { mb.set_row_starts(0, 1); }, "row_starts[0]"},
      {"rows not rising", [](v1::MicroBatch& mb) { mb.set_row_starts(1, 0); }, "row_starts[1]"},
      {"overlapping samples", [](v1::MicroBatch& mb) { mb.set_sample_input_offsets(1, 4); },
       "sample_input_offsets[1]"},
      {"past the padded length", [](v1::MicroBatch& mb) { mb.set_sample_input_lens(3, 2); },
       "sample_input_offsets[3]"},
      {"an empty sample", [](v1::MicroBatch& mb) { mb.set_sample_input_lens(2, 0); },
       "sample_input_lens[2]"},
      {"a GPT target offset", [](v1::MicroBatch& mb) { mb.set_sample_target_offsets(0, 1); },
       "sample_target_offsets[0]"},
  };
  for (const Case& c : cases) {
    v1::MicroBatch mb = Packed({5, 3, 7, 1}, {0, 2}, 8);
    c.corrupt(mb);
    const std::optional<ContractViolation> violation = PlaceSamples(mb, false, &rows);
    ASSERT_TRUE(violation.has_value()) << c.what;
    EXPECT_EQ(violation->field, c.field) << c.what << ": " << violation->Describe();
  }
  // Unpacked samples start at 0.
  v1::MicroBatch unpacked = Packed({5, 7}, {}, 8);
  unpacked.set_sample_input_offsets(0, 1);
  const auto violation = PlaceSamples(unpacked, false, &rows);
  ASSERT_TRUE(violation.has_value());
  EXPECT_THAT(violation->problem, HasSubstr("unpacked samples start at 0"));
}

TEST(PlanContract, T5SamplesNeedTargetTokensInsideTheTargetLength) {
  v1::MicroBatch mb;
  mb.set_input_len(8);
  mb.set_target_len(4);
  for (uint32_t v : {101u}) mb.add_sample_ids(v);
  mb.add_sample_input_lens(6);
  mb.add_sample_target_lens(4);
  mb.add_sample_input_offsets(0);
  mb.add_sample_target_offsets(0);
  std::vector<std::vector<SamplePlacement>> rows;
  EXPECT_FALSE(PlaceSamples(mb, true, &rows).has_value());
  // As GPT, the same sample is one sequence of 10 tokens: too long.
  EXPECT_TRUE(PlaceSamples(mb, false, &rows).has_value());
  mb.set_sample_target_lens(0, 0);
  const auto violation = PlaceSamples(mb, true, &rows);
  ASSERT_TRUE(violation.has_value());
  EXPECT_EQ(violation->field, "sample_target_lens[0]");
}

TEST(PlanContract, FormatVersion) {
  v1::ExecutionPlan plan;
  plan.set_format_version(kPlanFormatVersion);
  EXPECT_FALSE(CheckFormatVersion(plan).has_value());
  plan.set_format_version(7);
  const auto violation = CheckFormatVersion(plan);
  ASSERT_TRUE(violation.has_value());
  EXPECT_EQ(violation->Describe(), "format_version is 7 (expected 1)");
}

// A last-stage rank's plan for two micro-batches: receive the activation,
// forward, backward (optionally split), send the gradient, free, then the
// gradients' all_reduce.
v1::ExecutionPlan LastStagePlan(bool split) {
  v1::ExecutionPlan plan;
  plan.set_format_version(kPlanFormatVersion);
  plan.set_rank(1);
  plan.set_num_buffers(6);
  const auto add = [&plan](uint32_t mb) -> v1::Instruction& {
    v1::Instruction& in = *plan.add_instructions();
    in.set_micro_batch(mb);
    in.set_stage(1);
    return in;
  };
  for (uint32_t mb = 0; mb < 2; ++mb) {
    const uint32_t base = 3 * mb;
    v1::Transfer activation;
    activation.set_kind(v1::ACTIVATION);
    activation.set_peer(0);
    activation.add_buffer_ids(base);
    v1::TensorSpec& spec = *activation.add_tensors();
    spec.add_dims(2);
    spec.set_dtype(v1::FLOAT32);
    *add(mb).mutable_recv_start() = activation;
    *add(mb).mutable_recv_wait() = activation;
    v1::Instruction& forward = add(mb);
    forward.mutable_forward()->add_input_buffer_ids(base);
    forward.mutable_forward()->add_output_buffer_ids(base + 1);
    v1::Instruction& backward = add(mb);
    backward.mutable_backward()->add_output_grad_buffer_ids(base + 1);
    backward.mutable_backward()->add_input_grad_buffer_ids(base + 2);
    backward.mutable_backward()->set_weight_grad_deferred(split);
    v1::Transfer gradient = activation;
    gradient.set_kind(v1::GRADIENT);
    gradient.set_buffer_ids(0, base + 2);
    *add(mb).mutable_send_start() = gradient;
    if (split) add(mb).mutable_weight_grad();
    *add(mb).mutable_send_wait() = gradient;
    v1::Instruction& free = add(mb);
    for (uint32_t id : {base, base + 1, base + 2}) free.mutable_free_buffer()->add_buffer_ids(id);
  }
  plan.add_instructions()->mutable_all_reduce()->add_stages(1);
  return plan;
}

TEST(PlanContract, AValidStreamPassesAndWaitsPointAtTheirStarts) {
  for (const bool split : {false, true}) {
    const v1::ExecutionPlan plan = LastStagePlan(split);
    std::vector<int> start_of_wait;
    EXPECT_FALSE(CheckBufferLifetimes(plan, &start_of_wait).has_value()) << split;
    EXPECT_FALSE(CheckWeightGradOrder(plan).has_value()) << split;
    ASSERT_EQ(start_of_wait.size(), static_cast<size_t>(plan.instructions_size()));
    EXPECT_EQ(start_of_wait[0], -1);
    EXPECT_EQ(start_of_wait[1], 0);  // recv_wait completes recv_start
  }
  // A corrupt num_buffers costs nothing: the state is sized by the ids named.
  v1::ExecutionPlan huge = LastStagePlan(false);
  huge.set_num_buffers(0xffffffffu);
  EXPECT_FALSE(CheckBufferLifetimes(huge).has_value());
}

TEST(PlanContract, BufferLifetimeViolationsNameTheirInstruction) {
  struct Case {
    std::string what;
    std::function<void(v1::ExecutionPlan&)> corrupt;
    int instruction;
    std::string problem;
  };
  // Instructions (no split): micro-batch 0's recv_start 0, recv_wait 1,
  // forward 2, backward 3, send_start 4, send_wait 5, free_buffer 6;
  // micro-batch 1's from 7 (forward 9, backward 10); all_reduce 14.
  const std::vector<Case> cases = {
      {"a read before the receive completes",
       [](v1::ExecutionPlan& p) { p.mutable_instructions()->SwapElements(1, 2); }, 1,
       "buffer 0 read before its RecvWait"},
      {"a double free",
       [](v1::ExecutionPlan& p) {
         p.mutable_instructions(6)->mutable_free_buffer()->add_buffer_ids(0);
       },
       6, "buffer 0 freed twice"},
      {"a read after free",
       [](v1::ExecutionPlan& p) {
         p.mutable_instructions(9)->mutable_forward()->set_input_buffer_ids(0, 1);
       },
       9, "buffer 1 read after it was freed"},
      {"a second write",
       [](v1::ExecutionPlan& p) {
         p.mutable_instructions(9)->mutable_forward()->set_output_buffer_ids(0, 2);
       },
       9, "buffer 2 written twice"},
      {"an id beyond num_buffers", [](v1::ExecutionPlan& p) { p.set_num_buffers(5); }, 10,
       "buffer 5 >= num_buffers 5"},
      {"a wait without its start",
       [](v1::ExecutionPlan& p) { p.mutable_instructions(5)->mutable_send_wait()->set_peer(2); }, 5,
       "Wait without a matching Start before it"},
  };
  for (const Case& c : cases) {
    v1::ExecutionPlan plan = LastStagePlan(false);
    c.corrupt(plan);
    const std::optional<ContractViolation> violation = CheckBufferLifetimes(plan);
    ASSERT_TRUE(violation.has_value()) << c.what;
    EXPECT_EQ(violation->instruction, c.instruction) << c.what << ": " << violation->problem;
    EXPECT_EQ(violation->problem, c.problem) << c.what;
  }
}

TEST(PlanContract, WeightGradOrderViolations) {
  // Instructions of micro-batch 0 with a split backward: recv_start 0,
  // recv_wait 1, forward 2, backward 3, send_start 4, weight_grad 5,
  // send_wait 6, free_buffer 7; micro-batch 1's from 8; all_reduce 16.
  v1::ExecutionPlan missing = LastStagePlan(true);
  missing.mutable_instructions()->DeleteSubrange(5, 1);
  auto violation = CheckWeightGradOrder(missing);
  ASSERT_TRUE(violation.has_value());
  EXPECT_EQ(violation->instruction, missing.instructions_size() - 1);  // the all_reduce
  EXPECT_THAT(violation->problem, HasSubstr("reads the gradients before the weight_grad of "
                                            "micro-batch 0 on stage 1 (its backward is "
                                            "instruction #3"));
  v1::ExecutionPlan twice = LastStagePlan(true);
  *twice.mutable_instructions(6) = twice.instructions(5);
  violation = CheckWeightGradOrder(twice);
  ASSERT_TRUE(violation.has_value());
  EXPECT_EQ(violation->instruction, 6);
  EXPECT_EQ(violation->problem, "weight_grad runs twice (first at instruction #5)");
  v1::ExecutionPlan early = LastStagePlan(true);
  early.mutable_instructions()->SwapElements(3, 5);
  violation = CheckWeightGradOrder(early);
  ASSERT_TRUE(violation.has_value());
  EXPECT_EQ(violation->instruction, 3);
  EXPECT_THAT(violation->problem, HasSubstr("weight_grad without a backward"));
  v1::ExecutionPlan unfinished = LastStagePlan(true);
  unfinished.mutable_instructions()->RemoveLast();           // the all_reduce
  unfinished.mutable_instructions()->DeleteSubrange(13, 1);  // micro-batch 1's weight_grad
  violation = CheckWeightGradOrder(unfinished);
  ASSERT_TRUE(violation.has_value());
  EXPECT_EQ(violation->instruction, 11);  // micro-batch 1's backward
  EXPECT_THAT(violation->problem, HasSubstr("no weight_grad follows"));
}

// Any one instruction moved elsewhere in a valid stream breaks a rule that
// CheckBufferLifetimes or CheckWeightGradOrder names, or leaves a stream
// that still keeps every rule (a free or an independent transfer moved
// within its slack); never a crash, and never a violation pointing outside
// the plan.
TEST(PlanContract, RandomMovesAreCaughtOrHarmless) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int caught = 0;
  for (int trial = 0; trial < 200; ++trial) {
    v1::ExecutionPlan plan = LastStagePlan(trial % 2 == 1);
    const int n = plan.instructions_size();
    const int from = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const int to = std::uniform_int_distribution<int>(0, n - 1)(rng);
    auto& instructions = *plan.mutable_instructions();
    for (int i = from; i < to; ++i) instructions.SwapElements(i, i + 1);
    for (int i = from; i > to; --i) instructions.SwapElements(i, i - 1);
    for (const auto& violation : {CheckBufferLifetimes(plan), CheckWeightGradOrder(plan)}) {
      if (!violation.has_value()) continue;
      ++caught;
      EXPECT_GE(violation->instruction, 0);
      EXPECT_LT(violation->instruction, n);
      EXPECT_FALSE(violation->problem.empty());
    }
  }
  EXPECT_GT(caught, 50);
}

TEST(PlanContract, InstructionText) {
  const v1::ExecutionPlan plan = LastStagePlan(true);
  EXPECT_EQ(OpName(plan.instructions(3)), "backward");
  EXPECT_EQ(OpName(v1::Instruction()), "no operation");
  EXPECT_EQ(FormatInstruction(plan.instructions(3)), "backward(input) grad-in 1 grad-out 2 mb0 s1");
  EXPECT_EQ(FormatInstruction(plan.instructions(1)),
            "recv_wait ACTIVATION from 0 [2 FLOAT32] buffers 0 mb0 s1");
  EXPECT_EQ(WhereInPlan(plan, 3),
            "plan of iteration 0 for rank 1: instruction #3 (backward, micro-batch 0, stage 1): ");
  EXPECT_EQ(WhereInPlan(plan, -1), "plan of iteration 0 for rank 1: ");
}

}  // namespace
}  // namespace varipipe::plan_contract
