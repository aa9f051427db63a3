// Work-balanced stages: the predicted iteration of Planner::Plan with the
// stage layout parallelism.stage_layout AUTO chooses (ChooseStageLayout over
// the job's first kLayoutSampleMiniBatches mini-batches, as the planner
// daemons choose it) against the even split, on the zero-bubble benchmark's
// jobs and mini-batches (zero_bubble_bench.cc: GPT-6.7B-like pp = 4 and
// T5-11B-like pp = 8, A100-40GB analytic model, 40,960 MiB per device,
// every recompute mode, the DP), once with the adaptive schedule and once
// with the adaptive zero-bubble schedule. Reports, over kBatches
// mini-batches:
//   even_ms, auto_ms:   median predicted iteration of each layout;
//   median_ratio:       median over mini-batches of auto / even;
//   max_ratio:          the worst mini-batch's ratio (> 1: auto slower);
//   even_floor, auto_floor: median of (busiest device's compute + update) /
//                       the even layout's iteration: the lowest ratio any
//                       schedule of those micro-batches can reach;
//   auto_busiest_share: median of the auto plan's busiest device's compute
//                       over its makespan;
//   choose_ms:          time ChooseStageLayout took (once per job).
// The label names the chosen layout.
//
// Run: build/bench/stage_layout_bench --benchmark_repetitions=1
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/config/job_config.h"
#include "common/median.h"
#include "planner/layout/stage_layout_search.h"
#include "planner/planner.h"
#include "tests/bench/synthetic_batches.h"
#include "tests/testing/paper_models.h"

namespace varipipe::planner {
namespace {

constexpr int kBatches = 15;

v1::JobConfig Config(bool t5, v1::ScheduleKind schedule) {
  return testing::PaperBenchmarkJob(t5, {schedule});
}

void Compare(benchmark::State& state, bool t5, bool documents, v1::ScheduleKind schedule) {
  const v1::JobConfig config = Config(t5, schedule);
  absl::StatusOr<Planner> even = Planner::Create(config);
  if (!even.ok()) {
    state.SkipWithError(std::string(even.status().message()).c_str());
    return;
  }
  const std::vector<MiniBatch> batches = SyntheticBatches(config, documents, kBatches);
  const std::vector<MiniBatch> sample(batches.begin(), batches.begin() + kLayoutSampleMiniBatches);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<LayoutChoice> choice = ChooseStageLayout(*even, sample);
  const double choose_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!choice.ok()) {
    state.SkipWithError(std::string(choice.status().message()).c_str());
    return;
  }
  const Planner chosen = even->WithStageLayout(choice->chosen);
  std::vector<double> e_ms, a_ms, ratios, e_floor, a_floor, a_share;
  for (const MiniBatch& mb : batches) {
    absl::StatusOr<PlanningResult> e = even->Plan(mb);
    absl::StatusOr<PlanningResult> a = chosen.Plan(mb);
    if (!e.ok() || !a.ok()) {
      state.SkipWithError(std::string((e.ok() ? a : e).status().message()).c_str());
      return;
    }
    e_ms.push_back(e->report.predicted_iteration_ms);
    a_ms.push_back(a->report.predicted_iteration_ms);
    ratios.push_back(a_ms.back() / e_ms.back());
    e_floor.push_back((e->report.busiest_device_ms + e->report.predicted_update_ms) /
                      e->report.predicted_iteration_ms);
    a_floor.push_back((a->report.busiest_device_ms + a->report.predicted_update_ms) /
                      e->report.predicted_iteration_ms);
    a_share.push_back(a->report.busiest_device_ms / a->report.predicted_makespan_ms);
  }
  int i = 0;
  for (auto _ : state) {
    absl::StatusOr<PlanningResult> r = chosen.Plan(batches[i++ % kBatches]);
    benchmark::DoNotOptimize(r.ok());
  }
  state.counters["even_ms"] = Median(e_ms);
  state.counters["auto_ms"] = Median(a_ms);
  state.counters["median_ratio"] = Median(ratios);
  state.counters["max_ratio"] = *std::max_element(ratios.begin(), ratios.end());
  state.counters["even_floor"] = Median(e_floor);
  state.counters["auto_floor"] = Median(a_floor);
  state.counters["auto_busiest_share"] = Median(a_share);
  state.counters["choose_ms"] = choose_ms;
  state.SetLabel(
      absl::StrCat("auto: ", choice->chosen.ToString(), "; even: ", choice->even.ToString()));
}

void BM_LayoutGptAdaptive(benchmark::State& s) { Compare(s, false, false, v1::ADAPTIVE); }
void BM_LayoutGptDocumentsAdaptive(benchmark::State& s) { Compare(s, false, true, v1::ADAPTIVE); }
void BM_LayoutT5Adaptive(benchmark::State& s) { Compare(s, true, false, v1::ADAPTIVE); }
void BM_LayoutT5DocumentsAdaptive(benchmark::State& s) { Compare(s, true, true, v1::ADAPTIVE); }
void BM_LayoutGptZeroBubble(benchmark::State& s) {
  Compare(s, false, false, v1::ADAPTIVE_ZERO_BUBBLE);
}
void BM_LayoutGptDocumentsZeroBubble(benchmark::State& s) {
  Compare(s, false, true, v1::ADAPTIVE_ZERO_BUBBLE);
}
void BM_LayoutT5ZeroBubble(benchmark::State& s) {
  Compare(s, true, false, v1::ADAPTIVE_ZERO_BUBBLE);
}
void BM_LayoutT5DocumentsZeroBubble(benchmark::State& s) {
  Compare(s, true, true, v1::ADAPTIVE_ZERO_BUBBLE);
}
BENCHMARK(BM_LayoutGptAdaptive)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutGptDocumentsAdaptive)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutT5Adaptive)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutT5DocumentsAdaptive)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutGptZeroBubble)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutGptDocumentsZeroBubble)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutT5ZeroBubble)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_LayoutT5DocumentsZeroBubble)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
}  // namespace varipipe::planner

BENCHMARK_MAIN();
