// What a context-parallel lane is handed before any model runs: its plans
// pass the plan check, which refuses a plan of the wrong degree or lane, a
// whole micro-batch of another lane, and a split micro-batch whose length
// is not the lane's all_gather_count, naming the field; and the loader
// gives each lane exactly the whole micro-batch's tokens and labels at its
// local positions (every sample position on exactly one lane), ignored
// labels at its padding, and the labelled positions of its labels.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/plan_contract/context_parallel_split.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/plan_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/context_lanes.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_job.h"

namespace varipipe::executor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

struct LanePlans {
  v1::JobConfig config;
  std::unique_ptr<SampleDataset> dataset;
  std::vector<v1::ExecutionPlan> whole;  // without context parallelism
  std::vector<v1::ExecutionPlan> lanes;  // by plan rank
};

LanePlans Plan(uint32_t c, uint32_t pp, bool mixed, v1::PartitionMethod method) {
  ::varipipe::testing::TinyJob job;
  job.pipeline = pp;
  job.context = c;
  job.method = method;
  LanePlans s;
  absl::StatusOr<v1::JobConfig> config = ::varipipe::testing::TinyJobConfig(job);
  EXPECT_THAT(config, IsOk());
  s.config = *config;
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(s.config);
  EXPECT_THAT(dataset, IsOk());
  s.dataset = *std::move(dataset);
  v1::JobConfig whole = s.config;
  whole.mutable_parallelism()->set_context(1);
  absl::StatusOr<std::vector<v1::ExecutionPlan>> plans =
      ::varipipe::testing::PlanTinyIteration(whole, 0, *s.dataset);
  EXPECT_THAT(plans, IsOk());
  s.whole = *plans;
  absl::StatusOr<std::vector<v1::ExecutionPlan>> lanes = ::varipipe::testing::LowerToContextLanes(
      s.whole, s.config, c,
      mixed ? ::varipipe::testing::SplitEvenIds(c)
            : ::varipipe::testing::ContextPlacementFn(::varipipe::testing::SplitAll));
  EXPECT_THAT(lanes, IsOk());
  s.lanes = *lanes;
  return s;
}

PlanRecipient RecipientOf(const v1::ExecutionPlan& plan) {
  return {.iteration = plan.iteration(),
          .rank = plan.rank(),
          .dp_rank = plan.dp_rank(),
          .pp_rank = plan.pp_rank(),
          .context_rank = static_cast<int>(plan.context_rank()),
          .layers = std::nullopt};
}

TEST(ContextParallelPlanCheck, LanePlansPassAndCorruptionsAreNamed) {
  for (uint32_t c : {2u, 4u}) {
    for (bool mixed : {false, true}) {
      const LanePlans s = Plan(c, 2, mixed, v1::DYNAMIC_PROGRAMMING);
      ASSERT_EQ(s.lanes.size(), 2u * c);
      for (const v1::ExecutionPlan& plan : s.lanes) {
        EXPECT_THAT(CheckPlan(plan, s.config, RecipientOf(plan)), IsOk()) << "rank " << plan.rank();
      }
    }
  }
  const LanePlans s = Plan(2, 2, /*mixed=*/true, v1::DYNAMIC_PROGRAMMING);
  const v1::ExecutionPlan& plan = s.lanes[1];  // lane 1 of pipeline rank 0
  ASSERT_EQ(plan.context_rank(), 1u);
  {
    v1::ExecutionPlan bad = plan;
    bad.set_context_parallel(4);
    EXPECT_THAT(
        CheckPlan(bad, s.config, RecipientOf(plan)),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("context_parallel is 4"), HasSubstr("parallelism.context 2"))));
  }
  {
    PlanRecipient other = RecipientOf(plan);
    other.context_rank = 0;
    EXPECT_THAT(CheckPlan(plan, s.config, other),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context_rank is 1")));
  }
  {
    // The plan of the lane without context parallelism in the config.
    v1::JobConfig whole = s.config;
    whole.mutable_parallelism()->set_context(1);
    EXPECT_THAT(CheckPlan(plan, whole, RecipientOf(plan)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context_parallel")));
  }
  {
    // A split micro-batch one position longer than the lane's part.
    v1::ExecutionPlan bad = plan;
    for (v1::MicroBatch& mb : *bad.mutable_micro_batches()) {
      if (mb.context().split()) {
        mb.set_input_len(mb.input_len() + 1);
        break;
      }
    }
    EXPECT_THAT(CheckPlan(bad, s.config, RecipientOf(plan)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(".input_len"), HasSubstr("all_gather_count"))));
  }
  {
    // An instruction of another lane's whole micro-batch.
    v1::ExecutionPlan bad = plan;
    uint32_t other = 0;
    bool found = false;
    for (const v1::MicroBatch& mb : bad.micro_batches()) {
      if (!mb.context().split() && mb.context().lane() != 1) {
        other = mb.id();
        found = true;
        break;
      }
    }
    ASSERT_TRUE(found);
    for (v1::Instruction& in : *bad.mutable_instructions()) {
      if (in.has_forward()) {
        in.set_micro_batch(other);
        break;
      }
    }
    EXPECT_THAT(CheckPlan(bad, s.config, RecipientOf(plan)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("micro_batch"), HasSubstr("runs whole on lane 0"))));
  }
  {
    v1::ExecutionPlan bad = plan;
    bad.mutable_micro_batches(0)->mutable_context()->set_lane(2);
    bad.mutable_micro_batches(0)->mutable_context()->set_split(false);
    EXPECT_THAT(CheckPlan(bad, s.config, RecipientOf(plan)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context.lane is 2")));
  }
}

// The whole micro-batch's tokens and labels of sample s at position p, as
// the loader gives them for the same samples one per row.
struct WholeSample {
  std::vector<int64_t> tokens;
  std::vector<int64_t> labels;
};

TEST(ContextParallelLoader, LanesGetTheWholeMicroBatchsTokensAndLabels) {
  for (uint32_t c : {2u, 4u}) {
    for (v1::PartitionMethod method : {v1::DYNAMIC_PROGRAMMING, v1::PACKING}) {
      const LanePlans s = Plan(c, 1, /*mixed=*/false, method);
      const MicroBatchLoader loader(s.dataset.get(), SamplerOptionsFromConfig(s.config));
      const v1::ExecutionPlan& original = s.whole.front();
      int split_checked = 0;
      for (int m = 0; m < original.micro_batches_size(); ++m) {
        // The same samples one per row, unsplit.
        v1::MicroBatch rows = original.micro_batches(m);
        rows.clear_row_starts();
        rows.clear_packed_attention();
        uint32_t longest = 0;
        for (int i = 0; i < rows.sample_ids_size(); ++i) {
          rows.set_sample_input_offsets(i, 0);
          longest = std::max(longest, rows.sample_input_lens(i) + rows.sample_target_lens(i));
        }
        rows.set_input_len(longest);
        v1::TensorSpec spec;
        spec.set_dtype(v1::INT64);
        spec.add_dims(rows.sample_ids_size());
        spec.add_dims(longest);
        absl::StatusOr<torch::Tensor> tokens = loader.Load(rows, v1::LoadInput::INPUT_TOKENS, spec);
        absl::StatusOr<torch::Tensor> labels = loader.Load(rows, v1::LoadInput::LABELS, spec);
        ASSERT_THAT(tokens, IsOk());
        ASSERT_THAT(labels, IsOk());
        std::vector<int64_t> lengths;
        for (int i = 0; i < rows.sample_ids_size(); ++i) {
          lengths.push_back(int64_t{rows.sample_input_lens(i)} + rows.sample_target_lens(i));
        }
        std::map<std::pair<int64_t, int64_t>, int> seen;  // (sample, position) -> lanes
        for (uint32_t k = 0; k < c; ++k) {
          const v1::MicroBatch& mb = s.lanes[k].micro_batches(m);
          ASSERT_TRUE(mb.context().split());
          const ContextLane lane{.group_size = static_cast<int>(c), .index = static_cast<int>(k)};
          v1::TensorSpec row;
          row.set_dtype(v1::INT64);
          row.add_dims(1);
          row.add_dims(mb.input_len());
          absl::StatusOr<torch::Tensor> local =
              loader.Load(mb, v1::LoadInput::INPUT_TOKENS, row, lane);
          absl::StatusOr<torch::Tensor> local_labels =
              loader.Load(mb, v1::LoadInput::LABELS, row, lane);
          absl::StatusOr<RowLengths> local_lengths = loader.Lengths(mb, lane);
          ASSERT_THAT(local, IsOk());
          ASSERT_THAT(local_labels, IsOk());
          ASSERT_THAT(local_lengths, IsOk());
          ASSERT_NE(local_lengths->context_split, nullptr);
          const ContextParallelSplit split =
              *ContextParallelSplit::Of(lengths, static_cast<int>(c), static_cast<int>(k));
          ASSERT_EQ(local_lengths->context_split->local_tokens(), split.local_tokens());
          EXPECT_EQ(local_lengths->input[0].item<int64_t>(), split.local_count());
          int64_t u = 0;
          for (const ContextParallelSplit::Chunk& chunk : split.chunks()) {
            for (int64_t p = chunk.begin; p < chunk.end; ++p, ++u) {
              ++seen[{chunk.sample, p}];
              EXPECT_EQ((*local)[0][u].item<int64_t>(), (*tokens)[chunk.sample][p].item<int64_t>());
              EXPECT_EQ((*local_labels)[0][u].item<int64_t>(),
                        (*labels)[chunk.sample][p].item<int64_t>());
            }
          }
          for (; u < mb.input_len(); ++u) {
            EXPECT_EQ((*local_labels)[0][u].item<int64_t>(), kIgnoredLabel);
          }
          EXPECT_TRUE(
              torch::equal(local_lengths->labelled_positions, LabelledPositionsOf(*local_labels)));
          ++split_checked;
        }
        int64_t positions = 0;
        for (const int64_t l : lengths) positions += l;
        EXPECT_EQ(static_cast<int64_t>(seen.size()), positions);
        for (const auto& [where, lanes] : seen) EXPECT_EQ(lanes, 1);
      }
      EXPECT_GE(split_checked, 2 * static_cast<int>(c));
    }
  }
}

}  // namespace
}  // namespace varipipe::executor
