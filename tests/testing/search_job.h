// Small planner jobs and mini-batches for the tests of the planner's search
// (planner_search_test, default_search_test): an 8-layer GPT or T5 at
// hidden 256, synthetic mini-batches drawn from a length mixture, and the
// serialized plans to compare searches by.
#ifndef VARIPIPE_TESTS_TESTING_SEARCH_JOB_H_
#define VARIPIPE_TESTS_TESTING_SEARCH_JOB_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gtest/gtest.h"
#include "planner/plan/plan_builder.h"
#include "planner/planner.h"

namespace varipipe::testing {

struct SearchJob {
  bool t5 = false;
  uint32_t pp = 4;
  uint32_t dp = 1;
  uint32_t memory_mib = 4096;
  uint64_t tokens = 8192;
  // More planner fields, JSON (", \"schedules\": [...]"); none: the default
  // search.
  const char* planner_extra = "";
};

// The job's config, defaults applied and validated (a failure fails the
// calling test).
inline v1::JobConfig SearchJobConfig(const SearchJob& job) {
  const std::string json = absl::StrCat(
      R"({"job_id": "search", "model": {"kind": ")", job.t5 ? "T5" : "GPT",
      R"(", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 32000},
      "parallelism": {"pipeline": )",
      job.pp, R"(, "data": )", job.dp, R"(},
      "cluster": {"device_memory_limit_mib": )",
      job.memory_mib, R"(, "devices_per_node": 4},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": )",
      job.tokens, R"(, "max_sequence_length": 1024},
      "planner": {"tmax_interval_ms": 0.05, "threads": 1)",
      job.planner_extra, R"(},
      "training": {"iterations": 1}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyJobConfigDefaults(*config);
  const absl::Status valid = ValidateJobConfig(*config, "test");
  EXPECT_TRUE(valid.ok()) << valid;
  return *config;
}

// The mixture's samples from *cursor on, targets cut to `max_target` and
// inputs to the rest of 1,024, up to `tokens_budget` tokens.
inline planner::MiniBatch DrawMiniBatch(const SyntheticMixture& mixture, uint64_t* cursor,
                                        uint64_t tokens_budget, uint64_t iteration,
                                        uint32_t max_target = 512) {
  planner::MiniBatch mb;
  mb.iteration = iteration;
  uint64_t tokens = 0;
  while (true) {
    SampleLengths s = mixture.Sample(*cursor);
    s.target = std::min(s.target, max_target);
    s.input = std::min(s.input, 1024u - s.target);
    if (tokens + s.input + s.target > tokens_budget) break;
    tokens += s.input + s.target;
    mb.sample_ids.push_back(*cursor);
    mb.lengths.push_back(s);
    ++*cursor;
  }
  return mb;
}

// Every rank's plan, serialized deterministically.
inline std::vector<std::string> PlanBytes(const planner::PlanningResult& r) {
  std::vector<std::string> bytes;
  for (const v1::ExecutionPlan& plan : r.plans) {
    bytes.push_back(planner::SerializePlanDeterministically(plan));
  }
  return bytes;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_SEARCH_JOB_H_
