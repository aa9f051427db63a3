// Padded lengths never exceed the job's data limits (data.max_sequence_length,
// data.max_target_length), whatever planner.length_multiple is: rounding up
// stops at the limit. Checked over limits that are not multiples of the
// rounding, for every partition method and setting (the DP over samples and
// over packed rows, and every baseline), decoder-only and encoder-decoder
// models, with and without tensor and sequence parallelism; and the
// validator refuses a plan over a limit, which the executor would refuse.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/microbatch/baseline_settings.h"
#include "planner/microbatch/dp_partition.h"
#include "planner/microbatch/micro_batch.h"
#include "planner/microbatch/micro_batching.h"
#include "planner/plan/validator.h"
#include "planner/planner.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr v1::PartitionMethod kMethods[] = {v1::DYNAMIC_PROGRAMMING, v1::PACKING, v1::TOKEN_BASED,
                                            v1::FIXED_SIZE, v1::PADDING};

struct Job {
  bool t5 = false;
  uint32_t max_sequence = 0;
  uint32_t max_target = 0;  // T5 only
  uint32_t multiple = 8;
  uint32_t tensor = 1;
  bool sequence_parallel = false;

  std::string Name() const {
    return absl::StrCat(t5 ? "T5" : "GPT", " max_sequence_length=", max_sequence,
                        t5 ? absl::StrCat(" max_target_length=", max_target) : "",
                        " length_multiple=", multiple, " tensor=", tensor,
                        sequence_parallel ? " sequence_parallel" : "");
  }
  uint64_t GlobalTokens() const {
    return std::max<uint64_t>(2048, 4 * (max_sequence + max_target));
  }
};

// A tiny model on 2 pipeline stages, partitioned by `method` only.
v1::JobConfig Config(const Job& job, v1::PartitionMethod method) {
  const std::string json = absl::StrCat(
      R"({"job_id": "limits", "model": {"kind": ")", job.t5 ? "T5" : "GPT",
      R"(", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1024},
      "parallelism": {"pipeline": 2, "tensor": )",
      job.tensor, R"(, "sequence_parallel": )", job.sequence_parallel ? "true" : "false", R"(},
      "cluster": {"device_memory_limit_mib": 8192, "devices_per_node": 4},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": )",
      job.GlobalTokens(), R"(, "max_sequence_length": )", job.max_sequence,
      job.t5 ? absl::StrCat(R"(, "max_target_length": )", job.max_target) : "", R"(},
      "planner": {"tmax_interval_ms": 0.05, "length_multiple": )",
      job.multiple, R"(},
      "training": {"iterations": 1}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "limits");
  EXPECT_THAT(config, IsOk()) << json;
  config->mutable_planner()->clear_partition_methods();
  config->mutable_planner()->add_partition_methods(method);
  ApplyJobConfigDefaults(*config);
  EXPECT_THAT(ValidateJobConfig(*config, "limits"), IsOk()) << json;
  return *config;
}

// Samples within the limits, half of them at or just below a limit (where
// rounding up would pass it), filling most of a global batch.
MiniBatch Draw(const Job& job, std::mt19937& rng) {
  const auto length = [&](uint32_t limit) {
    if (rng() % 2 == 0) return limit - static_cast<uint32_t>(rng() % std::min(limit, 3u));
    return 1 + static_cast<uint32_t>(rng() % limit);
  };
  MiniBatch mb;
  uint64_t tokens = 0;
  while (true) {
    SampleLengths s;
    if (job.t5) {
      s = {.input = length(job.max_sequence), .target = length(job.max_target)};
    } else {
      const uint32_t sequence = std::max(2u, length(job.max_sequence));
      s.target = 1 + static_cast<uint32_t>(rng() % (sequence - 1));
      s.input = sequence - s.target;
    }
    if (tokens + s.input + s.target > job.GlobalTokens() * 3 / 4) break;
    tokens += s.input + s.target;
    mb.sample_ids.push_back(mb.sample_ids.size());
    mb.lengths.push_back(s);
  }
  return mb;
}

// Every group within the limits and long enough for each of its samples
// (packed rows: for the sum of the row's samples).
void ExpectGroupsWithin(const Job& job, std::span<const SampleLengths> samples,
                        const std::vector<MicroBatchGroup>& groups) {
  for (size_t g = 0; g < groups.size(); ++g) {
    const MicroBatchGroup& group = groups[g];
    SCOPED_TRACE(absl::StrCat("group ", g, " (", group.size(), " x ", group.input_len, "+",
                              group.target_len, ")"));
    EXPECT_GE(group.input_len, 1u);
    EXPECT_LE(group.input_len, job.max_sequence);
    EXPECT_LE(group.target_len, job.t5 ? job.max_target : 0u);
    std::vector<uint32_t> starts = group.row_starts;
    if (starts.empty()) {
      for (uint32_t k = 0; k < group.samples.size(); ++k) starts.push_back(k);
    }
    starts.push_back(static_cast<uint32_t>(group.samples.size()));
    for (size_t r = 0; r + 1 < starts.size(); ++r) {
      uint64_t input = 0;
      uint64_t target = 0;
      for (uint32_t k = starts[r]; k < starts[r + 1]; ++k) {
        const SampleLengths& s = samples[group.samples[k]];
        input += job.t5 ? s.input : s.input + s.target;
        target += job.t5 ? s.target : 0;
      }
      EXPECT_LE(input, group.input_len) << "row " << r;
      EXPECT_LE(target, group.target_len) << "row " << r;
    }
  }
}

// Every micro-batch of every rank's plan within the limits.
void ExpectPlansWithin(const Job& job, const std::vector<v1::ExecutionPlan>& plans) {
  for (const v1::ExecutionPlan& plan : plans) {
    for (const v1::MicroBatch& mb : plan.micro_batches()) {
      SCOPED_TRACE(absl::StrCat("rank ", plan.rank(), " micro-batch ", mb.id()));
      EXPECT_GE(mb.input_len(), 1u);
      EXPECT_LE(mb.input_len(), job.max_sequence);
      if (job.t5) {
        EXPECT_GE(mb.target_len(), 1u);
        EXPECT_LE(mb.target_len(), job.max_target);
      } else {
        EXPECT_EQ(mb.target_len(), 0u);
      }
    }
  }
  EXPECT_THAT(ValidatePlans(plans), IsOk());
  EXPECT_THAT(ValidateMicroBatchLengths(plans, {.max_input = job.max_sequence,
                                                .max_target = job.t5 ? job.max_target : 0}),
              IsOk());
}

// A limit in [low, high] that `multiple` does not divide.
uint32_t LimitNotMultipleOf(uint32_t multiple, uint32_t low, uint32_t high, std::mt19937& rng) {
  uint32_t limit = low + static_cast<uint32_t>(rng() % (high - low + 1));
  if (limit % multiple == 0) ++limit;
  return limit;
}

std::vector<Job> Jobs(std::mt19937& rng) {
  // The issue's cases, then random ones.
  std::vector<Job> jobs = {
      {.t5 = false, .max_sequence = 30},
      {.t5 = false, .max_sequence = 1021},
      {.t5 = true, .max_sequence = 20, .max_target = 11},
      {.t5 = false, .max_sequence = 45, .tensor = 2, .sequence_parallel = true},
      {.t5 = true, .max_sequence = 37, .max_target = 13, .tensor = 2, .sequence_parallel = true}};
  constexpr uint32_t kMultiples[] = {3, 8, 16, 64};
  for (int k = 0; k < 12; ++k) {
    Job job;
    job.t5 = k % 2 == 1;
    job.multiple = kMultiples[rng() % std::size(kMultiples)];
    job.max_sequence = LimitNotMultipleOf(job.multiple, 9, 300, rng);
    if (job.t5) job.max_target = LimitNotMultipleOf(job.multiple, 5, 100, rng);
    job.tensor = rng() % 2 == 0 ? 1 : 2;
    job.sequence_parallel = job.tensor > 1 && rng() % 2 == 0;
    jobs.push_back(job);
  }
  return jobs;
}

TEST(LengthLimits, NoMethodPadsPastTheDataLimits) {
  std::mt19937 rng(varipipe::testing::TestSeed("LengthLimits.NoMethodPadsPastTheDataLimits"));
  for (const Job& job : Jobs(rng)) {
    SCOPED_TRACE(job.Name());
    const MiniBatch mb = Draw(job, rng);
    for (v1::PartitionMethod method : kMethods) {
      SCOPED_TRACE(v1::PartitionMethod_Name(method));
      const v1::JobConfig config = Config(job, method);
      absl::StatusOr<Planner> planner = Planner::Create(config);
      ASSERT_THAT(planner, IsOk());
      // Every setting of the method and every (recompute mode, budget)
      // pair, not only the one the planner keeps.
      const PartitionMethod ours = PartitionMethodFromProto(method);
      int solved = 0;  // a large setting may lie beyond the cost grid
      for (const BaselineSetting& setting : BaselineSettings(config, ours)) {
        SCOPED_TRACE(setting.Describe());
        MicroBatchingOptions options = MicroBatchingOptionsFromConfig(config, ours);
        setting.ApplyTo(options);
        options.fail_without_pair = false;
        options.share_bound = false;
        absl::StatusOr<MicroBatchingResult> r =
            PlanMicroBatches(mb.lengths, planner->cost_model(), options);
        ASSERT_THAT(r, IsOk());
        for (const MicroBatchingCandidate& c : r->candidates) {
          if (!c.solved()) continue;
          ++solved;
          ExpectGroupsWithin(job, r->samples, c.groups);
        }
      }
      EXPECT_GT(solved, 0);
      absl::StatusOr<PlanningResult> planned = planner->Plan(mb);
      ASSERT_THAT(planned, IsOk());
      ExpectPlansWithin(job, planned->plans);
    }
  }
}

TEST(LengthLimits, PadLengthRoundsUpToTheLimitAndNoFurther) {
  EXPECT_EQ(PadLength(17, 8, 30), 24u);
  EXPECT_EQ(PadLength(25, 8, 30), 30u);
  EXPECT_EQ(PadLength(30, 8, 30), 30u);
  EXPECT_EQ(PadLength(24, 8, 30), 24u);
  EXPECT_EQ(PadLength(25, 8, 0), 32u);   // no limit
  EXPECT_EQ(PadLength(31, 8, 30), 31u);  // never below the length itself
  EXPECT_EQ(PadLength(1020, 8, 1021), 1021u);
  const LengthPolicy t5{.encoder_decoder = true, .multiple = 8, .max_input = 20, .max_target = 11};
  EXPECT_EQ(PaddedInputLength(19, t5), 20u);
  EXPECT_EQ(PaddedTargetLength(10, t5), 11u);
  EXPECT_EQ(PaddedTargetLength(10, {.encoder_decoder = false, .multiple = 8}), 0u);
}

TEST(LengthLimits, DpRefusesSamplesOverThePolicyLimit) {
  const Job job{.t5 = false, .max_sequence = 30};
  const v1::JobConfig config = Config(job, v1::DYNAMIC_PROGRAMMING);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const MicroBatchingOptions options =
      MicroBatchingOptionsFromConfig(config, PartitionMethod::kDynamicProgramming);
  absl::StatusOr<StageLayout> layout = MakeStageLayout(options.dims, 2, 1);
  ASSERT_THAT(layout, IsOk());
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(planner->cost_model(), *layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  const std::vector<SampleLengths> samples = {{20, 5}, {30, 1}};
  const std::vector<uint32_t> order = {1, 0};
  const DpProblem problem{.samples = samples,
                          .order = order,
                          .policy = {.encoder_decoder = false, .multiple = 8, .max_input = 30},
                          .cost = &cost.value(),
                          .pipeline_stages = 2,
                          .stored_limit_bytes = 1e12,
                          .peak_limit_bytes = 1e12};
  EXPECT_THAT(SolveMicroBatchDp(problem),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sample at position 1 (31 input, 1 target tokens)")));
}

TEST(LengthLimits, ValidatorRefusesAMicroBatchOverALimit) {
  for (const bool t5 : {false, true}) {
    const Job job{.t5 = t5, .max_sequence = 30, .max_target = t5 ? 11u : 0u};
    SCOPED_TRACE(job.Name());
    absl::StatusOr<Planner> planner = Planner::Create(Config(job, v1::FIXED_SIZE));
    ASSERT_THAT(planner, IsOk());
    MiniBatch mb;
    for (uint32_t k = 0; k < 8; ++k) {
      mb.sample_ids.push_back(k);
      mb.lengths.push_back(t5 ? SampleLengths{30 - k, 11 - k} : SampleLengths{29 - k, 1});
    }
    absl::StatusOr<PlanningResult> planned = planner->Plan(mb);
    ASSERT_THAT(planned, IsOk());
    const LengthLimits limits{.max_input = 30, .max_target = t5 ? 11u : 0u};
    ASSERT_THAT(ValidateMicroBatchLengths(planned->plans, limits), IsOk());
    ASSERT_GE(planned->plans.size(), 2u);
    ASSERT_GE(planned->plans[1].micro_batches_size(), 1);

    std::vector<v1::ExecutionPlan> over = planned->plans;
    over[1].mutable_micro_batches(0)->set_input_len(31);
    EXPECT_THAT(ValidateMicroBatchLengths(over, limits),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("rank 1"), HasSubstr("micro_batches[0].input_len is 31"),
                               HasSubstr("data.max_sequence_length 30"))));
    if (t5) {
      over = planned->plans;
      over[0].mutable_micro_batches(0)->set_target_len(16);
      EXPECT_THAT(
          ValidateMicroBatchLengths(over, limits),
          StatusIs(absl::StatusCode::kInvalidArgument,
                   AllOf(HasSubstr("rank 0"), HasSubstr("micro_batches[0].target_len is 16"),
                         HasSubstr("data.max_target_length 11"))));
    }
  }
}

}  // namespace
}  // namespace varipipe::planner
