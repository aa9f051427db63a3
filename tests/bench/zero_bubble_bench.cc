// The adaptive zero-bubble schedule against the adaptive schedule: the
// predicted iteration of the plans Planner::Plan chooses when it may use only
// one of them (every recompute mode searched, the dynamic program, the
// A100-40GB analytic cost model, 40,960 MiB per device as in
// planner_bench.cc), on the same mini-batches.
//
// Settings (planner_bench.cc's): GPT-6.7B-like pp = 4 and T5-11B-like
// pp = 8, 65,536 tokens per mini-batch, FLAN-like and documents-like
// mixtures (common/dataset/synthetic_mixture.h). Each benchmark plans
// kBatches mini-batches with both planners once before timing and reports:
//   adaptive_ms, zb_ms:    median predicted iteration of each;
//   median_ratio:          median over mini-batches of zb / adaptive;
//   max_ratio:             the worst mini-batch's ratio;
//   max_peak_over_limit:   the largest simulated device peak over its own
//                          limit among the zero-bubble plans (<= 1 fits);
//   *_bubble, *_makespan_ms: medians of the simulated bubble fraction (1 -
//                          busy / makespan, mean over devices) and makespan
//                          (the iteration without all-reduce, optimizer
//                          step and overhead);
//   floor_ratio:           median over mini-batches of (the adaptive plan's
//                          busiest device's compute + update) / its
//                          iteration: the lowest ratio any schedule of the
//                          adaptive plan's micro-batches, recompute mode and
//                          stage split can reach (a device cannot finish
//                          before its own compute);
//   zb_floor_ratio:        the same for the zero-bubble plan's own
//                          micro-batches and recompute mode: (its busiest
//                          device's compute + update) / the adaptive
//                          iteration;
//   zb_busiest_share:      median of the zero-bubble plan's busiest device's
//                          compute / its makespan (1: no idle time left on
//                          the device that bounds the iteration).
// The timed loop plans with the zero-bubble planner (planning speed).
//
// Run: build/bench/zero_bubble_bench --benchmark_repetitions=1
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/config/job_config.h"
#include "common/median.h"
#include "planner/planner.h"
#include "tests/bench/synthetic_batches.h"
#include "tests/testing/paper_models.h"

namespace varipipe::planner {
namespace {

constexpr int kBatches = 15;

v1::JobConfig Config(bool t5, v1::ScheduleKind schedule) {
  return testing::PaperBenchmarkJob(t5, {schedule});
}

void Compare(benchmark::State& state, bool t5, bool documents) {
  absl::StatusOr<Planner> adaptive = Planner::Create(Config(t5, v1::ADAPTIVE));
  absl::StatusOr<Planner> zb = Planner::Create(Config(t5, v1::ADAPTIVE_ZERO_BUBBLE));
  if (!adaptive.ok() || !zb.ok()) {
    state.SkipWithError("planner");
    return;
  }
  const std::vector<MiniBatch> batches =
      SyntheticBatches(Config(t5, v1::ADAPTIVE), documents, kBatches);
  std::vector<double> a_ms;
  std::vector<double> z_ms;
  std::vector<double> ratios;
  std::vector<double> a_bubble;
  std::vector<double> z_bubble;
  std::vector<double> a_makespan;
  std::vector<double> z_makespan;
  std::vector<double> floors;
  std::vector<double> z_floors;
  std::vector<double> z_busiest_share;
  double over = 0;
  std::string label;
  for (const MiniBatch& mb : batches) {
    absl::StatusOr<PlanningResult> a = adaptive->Plan(mb);
    absl::StatusOr<PlanningResult> z = zb->Plan(mb);
    if (!a.ok() || !z.ok()) {
      state.SkipWithError(std::string((a.ok() ? z : a).status().message()).c_str());
      return;
    }
    a_ms.push_back(a->report.predicted_iteration_ms);
    z_ms.push_back(z->report.predicted_iteration_ms);
    ratios.push_back(z_ms.back() / a_ms.back());
    a_bubble.push_back(a->report.bubble_fraction);
    z_bubble.push_back(z->report.bubble_fraction);
    a_makespan.push_back(a->report.predicted_makespan_ms);
    z_makespan.push_back(z->report.predicted_makespan_ms);
    floors.push_back((a->report.busiest_device_ms + a->report.predicted_update_ms) /
                     a->report.predicted_iteration_ms);
    z_floors.push_back((z->report.busiest_device_ms + z->report.predicted_update_ms) /
                       a->report.predicted_iteration_ms);
    z_busiest_share.push_back(z->report.busiest_device_ms / z->report.predicted_makespan_ms);
    for (size_t r = 0; r < z->report.peak_bytes.size(); ++r) {
      over = std::max(over, z->report.peak_bytes[r] / z->report.memory_limit_per_rank[r]);
    }
    if (label.empty()) label = z->report.recompute + "/" + a->report.recompute;
  }
  int i = 0;
  for (auto _ : state) {
    absl::StatusOr<PlanningResult> r = zb->Plan(batches[i++ % kBatches]);
    benchmark::DoNotOptimize(r.ok());
  }
  state.counters["adaptive_ms"] = Median(a_ms);
  state.counters["zb_ms"] = Median(z_ms);
  state.counters["median_ratio"] = Median(ratios);
  state.counters["max_ratio"] = *std::max_element(ratios.begin(), ratios.end());
  state.counters["max_peak_over_limit"] = over;
  state.counters["adaptive_bubble"] = Median(a_bubble);
  state.counters["zb_bubble"] = Median(z_bubble);
  state.counters["adaptive_makespan_ms"] = Median(a_makespan);
  state.counters["zb_makespan_ms"] = Median(z_makespan);
  state.counters["floor_ratio"] = Median(floors);
  state.counters["zb_floor_ratio"] = Median(z_floors);
  state.counters["zb_busiest_share"] = Median(z_busiest_share);
  state.SetLabel(absl::StrCat("recompute zb/adaptive (first batch): ", label));
}

void BM_ZeroBubbleGpt(benchmark::State& s) { Compare(s, false, false); }
void BM_ZeroBubbleGptDocuments(benchmark::State& s) { Compare(s, false, true); }
void BM_ZeroBubbleT5(benchmark::State& s) { Compare(s, true, false); }
void BM_ZeroBubbleT5Documents(benchmark::State& s) { Compare(s, true, true); }
BENCHMARK(BM_ZeroBubbleGpt)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ZeroBubbleGptDocuments)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ZeroBubbleT5)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ZeroBubbleT5Documents)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace varipipe::planner

BENCHMARK_MAIN();
