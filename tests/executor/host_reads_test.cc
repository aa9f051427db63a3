// The host waits for the device once per iteration, whatever the plan: the
// interpreter's device-to-host reads all go through HostReads
// (executor/runtime/host_reads.h), which counts them, and on CPUs the code
// path is the GPU's. Here GPT, Llama and T5 plans of 1 to 40 micro-batches,
// with pipeline 1 and 2 and data parallelism 1 and 2 (and GPT and T5 with
// tensor parallelism 2), run on threaded ranks over Gloo; every rank of every iteration reads exactly once (the gradient
// norm and the loss sum together). A loss read per micro-batch, a norm read
// per parameter or a read of packed segments per pass would each fail it.
// With data parallelism 2 the gradient buckets (8 KiB here, several per
// stage) start their all-reduces inside the last backward pass; under ZeRO
// stage 1 (training.zero_stage 1) their reduce-scatters, a tied LLAMA's
// shared embedding holding its bucket back until the instruction.
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dataset/sample_dataset.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/threaded_ranks.h"
#include "tests/testing/tiny_job.h"

namespace varipipe::testing {
namespace {

struct ReadsCell {
  std::string name;
  TinyJob job;
  // planner.fixed_micro_batch_size with FIXED_SIZE (0: the dynamic program).
  uint32_t micro_batch_size = 0;
  uint32_t zero_stage = 0;  // training.zero_stage
  friend void PrintTo(const ReadsCell& cell, std::ostream* os) { *os << cell.name; }
};

std::vector<ReadsCell> Cells() {
  std::vector<ReadsCell> cells;
  for (const char* model : {"Gpt", "Llama", "T5"}) {
    for (uint32_t dp : {1u, 2u}) {
      for (uint32_t pp : {1u, 2u}) {
        // Many one-sample micro-batches, and the dynamic program's few.
        for (uint32_t size : {1u, 0u}) {
          ReadsCell c;
          c.job.t5 = std::string(model) == "T5";
          c.job.llama = std::string(model) == "Llama";
          c.job.data = dp;
          c.job.pipeline = pp;
          c.job.iterations = 2;
          // About 40 samples a mini-batch (lengths up to 96).
          c.job.tokens_per_global_batch = 3400;
          c.job.method = size > 0 ? v1::FIXED_SIZE : v1::DYNAMIC_PROGRAMMING;
          c.micro_batch_size = size;
          c.name = absl::StrCat(model, "Dp", dp, "Pp", pp, size > 0 ? "OneSample" : "Dp");
          cells.push_back(c);
        }
      }
    }
  }
  // Tensor parallelism 2: the tensor group's collectives wait for nothing
  // on the host in the passes (on NCCL they are ordered on the device and
  // drained before the iteration's read; on Gloo each finishes at once).
  for (const char* model : {"Gpt", "T5"}) {
    for (uint32_t pp : {1u, 2u}) {
      ReadsCell c;
      c.job.t5 = std::string(model) == "T5";
      c.job.tensor = 2;
      c.job.pipeline = pp;
      c.job.iterations = 2;
      c.job.tokens_per_global_batch = 3400;
      c.job.method = v1::FIXED_SIZE;
      c.micro_batch_size = 1;
      c.name = absl::StrCat(model, "Tp2Pp", pp, "OneSample");
      cells.push_back(c);
    }
  }
  // ZeRO stage 1 at data parallelism 2: the buckets' reduce-scatters.
  for (const char* model : {"Gpt", "Llama", "LlamaTied", "T5"}) {
    for (uint32_t pp : {1u, 2u}) {
      ReadsCell c;
      c.job.t5 = std::string(model) == "T5";
      c.job.llama = absl::StartsWith(model, "Llama");
      c.job.tie_word_embeddings = std::string(model) == "LlamaTied";
      c.job.data = 2;
      c.job.pipeline = pp;
      c.job.iterations = 2;
      c.job.tokens_per_global_batch = 3400;
      c.job.method = v1::FIXED_SIZE;
      c.micro_batch_size = 1;
      c.zero_stage = 1;
      c.name = absl::StrCat(model, "Dp2Pp", pp, "Zero1OneSample");
      cells.push_back(c);
    }
  }
  return cells;
}

class HostReadsTest : public ::testing::TestWithParam<ReadsCell> {};

TEST_P(HostReadsTest, OneReadPerIterationOnEveryRank) {
  const ReadsCell& cell = GetParam();
  absl::StatusOr<v1::JobConfig> config = TinyJobConfig(cell.job);
  ASSERT_THAT(config, IsOk());
  if (cell.micro_batch_size > 0) {
    config->mutable_planner()->set_fixed_micro_batch_size(cell.micro_batch_size);
  }
  config->mutable_training()->set_zero_stage(cell.zero_stage);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  std::vector<std::vector<v1::ExecutionPlan>> plans;
  for (uint64_t it = 0; it < cell.job.iterations; ++it) {
    absl::StatusOr<std::vector<v1::ExecutionPlan>> p = PlanTinyIteration(*config, it, **dataset);
    ASSERT_THAT(p, IsOk());
    plans.push_back(*std::move(p));
  }
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  ThreadedRanksOptions options;
  options.redis_host = (*redis)->host();
  options.redis_port = (*redis)->port();
  options.redis_password = (*redis)->password();
  options.prefix = cell.name;
  const std::vector<RankRun> runs = RunThreadedRanks(*config, plans, **dataset, options);
  // Tensor parallelism: global ranks r * tp .. r * tp + tp - 1 run plan r.
  const size_t tp = cell.job.tensor;
  ASSERT_EQ(runs.size(), plans.front().size() * tp);
  int most_micro_batches = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_THAT(runs[r].status, IsOk()) << "rank " << r;
    ASSERT_EQ(runs[r].stats.size(), plans.size());
    for (size_t it = 0; it < plans.size(); ++it) {
      const v1::ExecutionPlan& plan = plans[it][r / tp];
      const int micro_batches = plan.micro_batches_size();
      most_micro_batches = std::max(most_micro_batches, micro_batches);
      EXPECT_EQ(runs[r].stats[it].host_reads, 1)
          << "rank " << r << ", iteration " << it << " (" << micro_batches << " micro-batches, "
          << plan.instructions_size() << " instructions)";
    }
    // Data parallelism: the gradients' all-reduces (ZeRO stage 1:
    // reduce-scatters) start inside the last backward pass once an earlier
    // pass counted the accumulations (from the second iteration on, whatever
    // the micro-batch count).
    if (cell.job.data > 1) {
      const executor::IterationStats& steady = runs[r].stats.back();
      EXPECT_GT(steady.buckets, 1) << "rank " << r;
      EXPECT_GE(steady.buckets_started_in_backward, 1) << "rank " << r;
    }
  }
  std::printf("%s: up to %d micro-batches per rank, 1 host read per iteration expected",
              cell.name.c_str(), most_micro_batches);
  if (cell.job.data > 1) {
    std::printf("; rank 0's steady iteration: %d of %d buckets started in the backward",
                runs[0].stats.back().buckets_started_in_backward, runs[0].stats.back().buckets);
  }
  std::printf("\n");
  if (cell.micro_batch_size == 1 && cell.job.data == 1 && cell.job.pipeline == 1) {
    EXPECT_GE(most_micro_batches, 30) << "the mini-batch should hold 30 to 41 samples";
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, HostReadsTest, ::testing::ValuesIn(Cells()),
                         [](const ::testing::TestParamInfo<ReadsCell>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace varipipe::testing
