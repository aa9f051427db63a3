// InputPrefetcher (executor/data/input_prefetcher.h) against the loader it
// wraps: for GPT and T5 plans, packed and unpacked, every LoadInput buffer
// and every forward's lengths come out equal to what the loader gives when
// called directly, whatever the look-ahead (0: no thread); a take out of the
// plan's order is refused, naming the instruction; and a prefetcher dropped
// half-way (an iteration that failed) stops its thread.
#include "executor/data/input_prefetcher.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "executor/data/micro_batch_loader.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_job.h"

namespace varipipe::executor {
namespace {

using ::varipipe::testing::IsOk;

void ExpectSame(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (a.defined()) {
    EXPECT_TRUE(torch::equal(a, b)) << what;
  }
}

struct PlannedJob {
  v1::JobConfig config;
  std::unique_ptr<SampleDataset> dataset;
  v1::ExecutionPlan plan;
};

PlannedJob Plan(bool t5, v1::PartitionMethod method) {
  ::varipipe::testing::TinyJob job;
  job.t5 = t5;
  job.method = method;
  PlannedJob s;
  absl::StatusOr<v1::JobConfig> config = ::varipipe::testing::TinyJobConfig(job);
  EXPECT_THAT(config, IsOk());
  s.config = *config;
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(s.config);
  EXPECT_THAT(dataset, IsOk());
  s.dataset = *std::move(dataset);
  absl::StatusOr<std::vector<v1::ExecutionPlan>> plans =
      ::varipipe::testing::PlanTinyIteration(s.config, 0, *s.dataset);
  EXPECT_THAT(plans, IsOk());
  s.plan = plans->front();
  return s;
}

TEST(InputPrefetcherTest, GivesWhatTheLoaderGivesInPlanOrder) {
  for (bool t5 : {false, true}) {
    for (v1::PartitionMethod method : {v1::DYNAMIC_PROGRAMMING, v1::PACKING}) {
      const PlannedJob s = Plan(t5, method);
      const MicroBatchLoader loader(s.dataset.get(), SamplerOptionsFromConfig(s.config));
      for (size_t ahead : {0u, 1u, 8u}) {
        const std::string cell = std::string(t5 ? "T5" : "GPT") + " " +
                                 v1::PartitionMethod_Name(method) + " ahead " +
                                 std::to_string(ahead);
        InputPrefetcher inputs(&loader, s.plan, torch::kCPU, ahead);
        int loads = 0, forwards = 0;
        for (int i = 0; i < s.plan.instructions_size(); ++i) {
          const v1::Instruction& in = s.plan.instructions(i);
          const v1::MicroBatch& mb = s.plan.micro_batches(static_cast<int>(in.micro_batch()));
          if (in.has_load_input()) {
            for (int k = 0; k < in.load_input().buffer_ids_size(); ++k) {
              absl::StatusOr<torch::Tensor> got = inputs.TakeLoad(i, k);
              ASSERT_THAT(got, IsOk()) << cell;
              absl::StatusOr<torch::Tensor> want =
                  loader.Load(mb, in.load_input().contents(k), in.load_input().tensors(k));
              ASSERT_THAT(want, IsOk());
              ExpectSame(*got, *want, cell + " load #" + std::to_string(i));
              ++loads;
            }
          } else if (in.has_forward()) {
            absl::StatusOr<RowLengths> got = inputs.TakeLengths(i);
            ASSERT_THAT(got, IsOk()) << cell;
            absl::StatusOr<RowLengths> want = loader.Lengths(mb);
            ASSERT_THAT(want, IsOk());
            const std::string what = cell + " forward #" + std::to_string(i);
            ExpectSame(got->input, want->input, what);
            ExpectSame(got->target, want->target, what);
            ExpectSame(got->input_segments, want->input_segments, what);
            ExpectSame(got->input_positions, want->input_positions, what);
            ExpectSame(got->target_segments, want->target_segments, what);
            ExpectSame(got->target_positions, want->target_positions, what);
            ExpectSame(got->labelled_positions, want->labelled_positions, what);
            ++forwards;
          }
        }
        EXPECT_GT(loads, 0) << cell;
        EXPECT_EQ(forwards, s.plan.micro_batches_size()) << cell;
      }
    }
  }
}

// The head's rows come from the plan's lengths alone: RowLengths'
// labelled_positions are exactly the positions whose LABELS entry is >= 0,
// for GPT and T5, packed and unpacked, every micro-batch.
TEST(MicroBatchLoaderTest, LabelledPositionsAreThePositionsWithALabel) {
  for (bool t5 : {false, true}) {
    for (v1::PartitionMethod method : {v1::DYNAMIC_PROGRAMMING, v1::PACKING}) {
      const PlannedJob s = Plan(t5, method);
      const MicroBatchLoader loader(s.dataset.get(), SamplerOptionsFromConfig(s.config));
      int checked = 0;
      for (const v1::Instruction& in : s.plan.instructions()) {
        if (!in.has_load_input()) continue;
        const v1::MicroBatch& mb = s.plan.micro_batches(static_cast<int>(in.micro_batch()));
        for (int k = 0; k < in.load_input().buffer_ids_size(); ++k) {
          if (in.load_input().contents(k) != v1::LoadInput::LABELS) continue;
          absl::StatusOr<torch::Tensor> labels =
              loader.Load(mb, v1::LoadInput::LABELS, in.load_input().tensors(k));
          absl::StatusOr<RowLengths> lengths = loader.Lengths(mb);
          ASSERT_THAT(labels, IsOk());
          ASSERT_THAT(lengths, IsOk());
          const torch::Tensor want = (labels->reshape({-1}) >= 0).nonzero().reshape({-1});
          EXPECT_TRUE(torch::equal(lengths->labelled_positions, want))
              << (t5 ? "T5 " : "GPT ") << v1::PartitionMethod_Name(method) << " micro-batch "
              << mb.id() << ": " << lengths->labelled_positions << " vs " << want;
          EXPECT_GT(want.numel(), 0);
          ++checked;
        }
      }
      EXPECT_GT(checked, 0);
    }
  }
}

TEST(InputPrefetcherTest, RefusesATakeOutOfOrder) {
  const PlannedJob s = Plan(false, v1::DYNAMIC_PROGRAMMING);
  const MicroBatchLoader loader(s.dataset.get(), SamplerOptionsFromConfig(s.config));
  int first_forward = -1;
  for (int i = 0; i < s.plan.instructions_size() && first_forward < 0; ++i) {
    if (s.plan.instructions(i).has_forward()) first_forward = i;
  }
  ASSERT_GT(first_forward, 0) << "a LoadInput comes first";
  InputPrefetcher inputs(&loader, s.plan, torch::kCPU, 4);
  const absl::StatusOr<RowLengths> skipped = inputs.TakeLengths(first_forward);
  ASSERT_FALSE(skipped.ok());
  EXPECT_EQ(skipped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(skipped.status().message(),
                                "instruction #" + std::to_string(first_forward)))
      << skipped.status();
}

TEST(InputPrefetcherTest, StopsWhenDroppedHalfWay) {
  const PlannedJob s = Plan(true, v1::DYNAMIC_PROGRAMMING);
  const MicroBatchLoader loader(s.dataset.get(), SamplerOptionsFromConfig(s.config));
  for (size_t ahead : {1u, 1000u}) {
    // Dropped before anything is taken: the destructor must not wait for
    // the takes that never come.
    InputPrefetcher inputs(&loader, s.plan, torch::kCPU, ahead);
  }
  SUCCEED();
}

}  // namespace
}  // namespace varipipe::executor
