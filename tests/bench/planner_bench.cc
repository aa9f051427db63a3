// Full planning speed: Planner::Plan end to end (micro-batching, schedule
// search with simulation, communication planning, plan building and
// validation), one thread unless the name says otherwise.
//
// DynaPipe's setting: 65,536-token mini-batches per replica, maximum length
// 2048 (T5 targets 512), A100-40GB analytic cost model, schedules adaptive
// and 1F1B, all three recompute modes, the dynamic program:
//   GPT-6.7B-like, pp = 4;  T5-11B-like, pp = 8.
// Length mixtures (common/dataset/synthetic_mixture.h): FLAN-like (about
// 180 samples per 65,536 tokens) and documents-like (about 350, mostly
// short, a long tail up to the maximum length).
//
// *DefaultSearch: the config's default search instead (every partition
// method with its setting tuned per mini-batch, every schedule, every
// recompute mode: planner.h), what a job that lists nothing plans with.
//
// Baselines in the same process:
//   *PerPair:      every (recompute mode, budget) pair solved to its optimum
//                  and scheduled (no shared bound);
//   *OneFOneBOnly: without the adaptive schedule;
//   BM_Scale*:     GPT-6.7B pp = 8, maximum length 8192, 65,536 tokens per
//                  replica, dp = 1, 8, 32, 64, one and two threads;
//                  *ThreadRatio: one and two threads alternately in one
//                  benchmark (counter speedup);
//   BM_T5Memory*:  T5-11B pp = 8 (deploy/configs/t5-11b-pp8.json: A100-80GB,
//                  adaptive and 1F1B; *OneFOneB: 1F1B only), argument: MiB per
//                  device. The same 30 mini-batches planned with each
//                  device's own room and with the common budget: counters
//                  own_iter_ms, common_iter_ms, common_over_own and each
//                  variant's selective share; the label names the plans
//                  chosen (recompute/schedule and how often).
//
// Run: build/bench/planner_bench --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/config/job_config.h"
#include "common/median.h"
#include "planner/planner.h"
#include "tests/bench/synthetic_batches.h"
#include "tests/testing/paper_models.h"

namespace varipipe::planner {
namespace {

constexpr int kMiniBatches = 8;

struct Setting {
  bool t5 = false;
  bool adaptive = true;
  bool default_search = false;  // all methods and schedules (the config defaults)
  bool documents = false;
  uint32_t pipeline = 0;  // 0: 8 for T5, 4 for GPT
  uint32_t data = 1;
  uint32_t max_length = 2048;
  int threads = 1;
  bool per_pair = false;
  bool per_device_memory = true;
  uint32_t memory_mib = 40960;
  const char* hardware = "a100-40gb";
  // The default search without the DP over packed rows and with packed
  // rows priced over the whole row (the search before both).
  bool dp_packed_rows = true;
  v1::PackedAttention packed_attention = v1::PACKED_ATTENTION_UNSPECIFIED;
};

v1::JobConfig Config(const Setting& s) {
  v1::JobConfig c;
  c.set_job_id(s.t5 ? "t5-11b" : "gpt-6.7b");
  *c.mutable_model() = s.t5 ? testing::T511bConfig() : testing::Gpt67bConfig();
  c.mutable_parallelism()->set_pipeline(s.pipeline != 0 ? s.pipeline : (s.t5 ? 8 : 4));
  c.mutable_parallelism()->set_data(s.data);
  c.mutable_cluster()->set_device_memory_limit_mib(s.memory_mib);
  c.mutable_cluster()->set_hardware(s.hardware);
  c.mutable_data()->set_format(v1::SYNTHETIC);
  c.mutable_data()->set_tokens_per_global_batch(65536ull * s.data);
  c.mutable_data()->set_max_sequence_length(s.max_length);
  if (s.t5) c.mutable_data()->set_max_target_length(512);
  if (!s.default_search) {
    c.mutable_planner()->add_partition_methods(v1::DYNAMIC_PROGRAMMING);
    if (s.adaptive) c.mutable_planner()->add_schedules(v1::ADAPTIVE);
    c.mutable_planner()->add_schedules(v1::ONE_F_ONE_B);
  }
  c.mutable_planner()->set_threads(s.threads);
  c.mutable_planner()->set_dp_packed_rows(s.dp_packed_rows);
  c.mutable_model()->set_packed_attention(s.packed_attention);
  c.mutable_training()->set_iterations(1);
  ApplyJobConfigDefaults(c);
  return c;
}

void Run(benchmark::State& state, const Setting& setting) {
  const v1::JobConfig config = Config(setting);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  if (!planner.ok()) {
    state.SkipWithError(std::string(planner.status().message()).c_str());
    return;
  }
  planner->set_options({.threads = setting.threads,
                        .share_micro_batching_bound = !setting.per_pair,
                        .per_device_memory = setting.per_device_memory});
  const std::vector<MiniBatch> batches = SyntheticBatches(config, setting.documents, kMiniBatches);
  int i = 0;
  double samples = 0;
  double predicted = 0;
  int planned = 0;
  PlanReport last;
  for (auto _ : state) {
    const MiniBatch& mb = batches[i++ % kMiniBatches];
    absl::StatusOr<PlanningResult> r = planner->Plan(mb);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(r->plans.size());
    samples += mb.sample_ids.size();
    predicted += r->report.predicted_iteration_ms;
    ++planned;
    last = std::move(r->report);
  }
  state.counters["samples"] = samples / std::max(1, planned);
  state.counters["pred_iter_ms"] = predicted / std::max(1, planned);
  state.counters["micro_batches"] = last.micro_batches;
  state.counters["micro_batching_ms"] = last.micro_batching_ms;
  state.counters["scheduling_ms"] = last.scheduling_ms;
  state.counters["building_ms"] = last.plan_building_ms;
  state.counters["validation_ms"] = last.validation_ms;
  int simulated = 0;
  int pruned = 0;
  for (const CandidateReport& c : last.candidates) {
    simulated += c.makespan_ms > 0;
    pruned += c.rejected_at == "bound";
  }
  state.counters["candidates"] = static_cast<double>(last.candidates.size());
  state.counters["simulated"] = simulated;
  state.counters["pruned"] = pruned;
}

void BM_PlanGpt(benchmark::State& s) { Run(s, {}); }
void BM_PlanGptPerPair(benchmark::State& s) { Run(s, {.per_pair = true}); }
void BM_PlanGptOneFOneBOnly(benchmark::State& s) { Run(s, {.adaptive = false}); }
void BM_PlanGptDocuments(benchmark::State& s) { Run(s, {.documents = true}); }
void BM_PlanGptDocumentsPerPair(benchmark::State& s) {
  Run(s, {.documents = true, .per_pair = true});
}
// The documents-like setting at 36,000 MiB per device.
void BM_PlanGptDocuments36000(benchmark::State& s) {
  Run(s, {.documents = true, .memory_mib = 36000});
}
void BM_PlanGptDocuments36000PerPair(benchmark::State& s) {
  Run(s, {.documents = true, .per_pair = true, .memory_mib = 36000});
}
void BM_PlanGptDocumentsDefaultSearch(benchmark::State& s) {
  Run(s, {.default_search = true, .documents = true});
}
void BM_PlanGptDefaultSearch(benchmark::State& s) { Run(s, {.default_search = true}); }
// The default search without the DP over packed rows, packed rows priced
// over the whole row: the baseline of the two in the same process.
constexpr Setting kWithoutPackedRows = {
    .default_search = true, .dp_packed_rows = false, .packed_attention = v1::BLOCK_DIAGONAL_MASK};
void BM_PlanGptDocumentsDefaultSearchWithoutPackedRows(benchmark::State& s) {
  Setting setting = kWithoutPackedRows;
  setting.documents = true;
  Run(s, setting);
}
void BM_PlanT5DefaultSearchWithoutPackedRows(benchmark::State& s) {
  Setting setting = kWithoutPackedRows;
  setting.t5 = true;
  Run(s, setting);
}
void BM_PlanT5(benchmark::State& s) { Run(s, {.t5 = true}); }
void BM_PlanT5DefaultSearch(benchmark::State& s) { Run(s, {.t5 = true, .default_search = true}); }
void BM_PlanT5DocumentsDefaultSearch(benchmark::State& s) {
  Run(s, {.t5 = true, .default_search = true, .documents = true});
}
void BM_PlanT5PerPair(benchmark::State& s) { Run(s, {.t5 = true, .per_pair = true}); }
void BM_PlanT5OneFOneBOnly(benchmark::State& s) { Run(s, {.t5 = true, .adaptive = false}); }
void BM_PlanT5Documents(benchmark::State& s) { Run(s, {.t5 = true, .documents = true}); }
// A fixed number of plans, whole passes over the mini-batches: every build
// times the same work (a time-chosen count would plan a different mix).
constexpr int kTimedPlans = 3 * kMiniBatches;
BENCHMARK(BM_PlanGpt)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptPerPair)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptOneFOneBOnly)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDocuments)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDocumentsPerPair)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDocuments36000)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDocuments36000PerPair)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDefaultSearch)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDocumentsDefaultSearch)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanGptDocumentsDefaultSearchWithoutPackedRows)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5DefaultSearch)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5DefaultSearchWithoutPackedRows)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5DocumentsDefaultSearch)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5PerPair)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5OneFOneBOnly)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);
BENCHMARK(BM_PlanT5Documents)->Unit(benchmark::kMillisecond)->Iterations(kTimedPlans);

// Per-device memory: T5-11B pp = 8, FLAN-like. Each variant plans the same
// 30 mini-batches once before timing; the timed loop plans with own rooms.
constexpr int kQualityBatches = 30;

struct Quality {
  double mean_ms = 0;
  int selective = 0;
  std::map<std::string, int> chosen;  // "recompute/schedule" -> count
};

absl::StatusOr<Quality> PlanAll(const Planner& planner, const std::vector<MiniBatch>& batches) {
  Quality q;
  for (const MiniBatch& mb : batches) {
    absl::StatusOr<PlanningResult> r = planner.Plan(mb);
    if (!r.ok()) return r.status();
    q.mean_ms += r->report.predicted_iteration_ms / batches.size();
    q.selective += r->report.recompute == "selective";
    ++q.chosen[r->report.recompute + "/" + r->report.schedule];
  }
  return q;
}

std::string Chosen(const Quality& q) {
  std::string out;
  for (const auto& [plan, count] : q.chosen) {
    out += (out.empty() ? "" : ", ") + plan + " " + std::to_string(count);
  }
  return out;
}

void RunMemory(benchmark::State& state, bool adaptive) {
  const Setting setting{.t5 = true,
                        .adaptive = adaptive,
                        .memory_mib = static_cast<uint32_t>(state.range(0)),
                        .hardware = "a100-80gb"};
  const v1::JobConfig config = Config(setting);
  absl::StatusOr<Planner> own = Planner::Create(config);
  if (!own.ok()) {
    state.SkipWithError(std::string(own.status().message()).c_str());
    return;
  }
  own->set_options({.threads = 1, .per_device_memory = true});
  Planner common = *own;
  common.set_options({.threads = 1, .per_device_memory = false});
  const std::vector<MiniBatch> quality = SyntheticBatches(config, false, kQualityBatches);
  absl::StatusOr<Quality> own_q = PlanAll(*own, quality);
  absl::StatusOr<Quality> common_q = PlanAll(common, quality);
  if (!own_q.ok() || !common_q.ok()) {
    state.SkipWithError(std::string((own_q.ok() ? common_q : own_q).status().message()).c_str());
    return;
  }
  const std::vector<MiniBatch> batches = SyntheticBatches(config, false, kMiniBatches);
  int i = 0;
  for (auto _ : state) {
    absl::StatusOr<PlanningResult> r = own->Plan(batches[i++ % kMiniBatches]);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(r->plans.size());
  }
  state.counters["own_iter_ms"] = own_q->mean_ms;
  state.counters["common_iter_ms"] = common_q->mean_ms;
  state.counters["common_over_own"] = common_q->mean_ms / own_q->mean_ms;
  state.counters["own_selective"] = static_cast<double>(own_q->selective) / kQualityBatches;
  state.counters["common_selective"] = static_cast<double>(common_q->selective) / kQualityBatches;
  state.SetLabel("own: " + Chosen(*own_q) + " | common: " + Chosen(*common_q));
}

void BM_T5MemoryOwnVsCommon(benchmark::State& s) { RunMemory(s, true); }
void BM_T5MemoryOwnVsCommonOneFOneB(benchmark::State& s) { RunMemory(s, false); }
// Selective recomputation fits each device's own room under 1F1B from
// about 60,400 MiB, the common budget from about 66,000 (docs/benchmarks.md).
void MemoryArgs(benchmark::internal::Benchmark* b) {
  for (int64_t mib :
       {40960, 49152, 57344, 59392, 60416, 61440, 63488, 65536, 69632, 73728, 81920}) {
    b->Arg(mib);
  }
  b->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_T5MemoryOwnVsCommon)->Apply(MemoryArgs);
BENCHMARK(BM_T5MemoryOwnVsCommonOneFOneB)->Apply(MemoryArgs);

// The scale curve: GPT-6.7B, pp = 8, maximum length 8192, 65,536 tokens per
// replica, documents-like; argument: dp.
void BM_ScaleGpt(benchmark::State& s) {
  Run(s, {.documents = true,
          .pipeline = 8,
          .data = static_cast<uint32_t>(s.range(0)),
          .max_length = 8192});
}
void BM_ScaleGptTwoThreads(benchmark::State& s) {
  Run(s, {.documents = true,
          .pipeline = 8,
          .data = static_cast<uint32_t>(s.range(0)),
          .max_length = 8192,
          .threads = 2});
}
void BM_ScaleGptFlan(benchmark::State& s) {
  Run(s, {.pipeline = 8, .data = static_cast<uint32_t>(s.range(0)), .max_length = 8192});
}
BENCHMARK(BM_ScaleGptFlan)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScaleGpt)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond);
void BM_ScaleGptFlanTwoThreads(benchmark::State& s) {
  Run(s,
      {.pipeline = 8, .data = static_cast<uint32_t>(s.range(0)), .max_length = 8192, .threads = 2});
}
BENCHMARK(BM_ScaleGptTwoThreads)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScaleGptFlanTwoThreads)->Arg(64)->Unit(benchmark::kMillisecond);

// One and two threads alternately on the same mini-batches, each plan timed
// with its result's destruction; whichever runs first alternates, so work
// elsewhere on the machine hits both alike. Counters: the median of each
// and speedup = one_thread_ms / two_threads_ms. The benchmark's own time is
// the pair's.
void RunThreadRatio(benchmark::State& state, const Setting& setting) {
  const v1::JobConfig config = Config(setting);
  absl::StatusOr<Planner> one = Planner::Create(config);
  if (!one.ok()) {
    state.SkipWithError(std::string(one.status().message()).c_str());
    return;
  }
  one->set_options({.threads = 1});
  Planner two = *one;
  two.set_options({.threads = 2});
  const std::vector<MiniBatch> batches = SyntheticBatches(config, setting.documents, kMiniBatches);
  std::array<std::vector<double>, 2> ms;
  int i = 0;
  for (auto _ : state) {
    const MiniBatch& mb = batches[i % kMiniBatches];
    for (int pass = 0; pass < 2; ++pass) {
      const int which = (i + pass) % 2;  // 0: one thread
      const auto start = std::chrono::steady_clock::now();
      {
        absl::StatusOr<PlanningResult> r = (which == 0 ? *one : two).Plan(mb);
        if (!r.ok()) {
          state.SkipWithError(std::string(r.status().message()).c_str());
          return;
        }
        benchmark::DoNotOptimize(r->plans.size());
      }
      ms[which].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    ++i;
  }
  state.counters["one_thread_ms"] = Median(ms[0]);
  state.counters["two_threads_ms"] = Median(ms[1]);
  state.counters["speedup"] = Median(ms[0]) / std::max(1e-9, Median(ms[1]));
}

void BM_ScaleGptThreadRatio(benchmark::State& s) {
  RunThreadRatio(s, {.documents = true,
                     .pipeline = 8,
                     .data = static_cast<uint32_t>(s.range(0)),
                     .max_length = 8192});
}
void BM_ScaleGptFlanThreadRatio(benchmark::State& s) {
  RunThreadRatio(s, {.pipeline = 8, .data = static_cast<uint32_t>(s.range(0)), .max_length = 8192});
}
BENCHMARK(BM_ScaleGptFlanThreadRatio)->Arg(64)->MinTime(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScaleGptThreadRatio)->Arg(64)->MinTime(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace varipipe::planner

BENCHMARK_MAIN();
