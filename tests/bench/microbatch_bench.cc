// Micro-batch construction speed on DynaPipe's evaluation setting: global
// mini-batches of 65,536 tokens (maximum length 2048) drawn from the
// FLAN-like synthetic mixture, on the A100-40GB analytic cost model.
//
//   GPT: 6.7B-like (32 layers, hidden 4096, 32 heads, ffn 16384), pp = 4
//   T5:  11B-like (24 + 24 layers, hidden 1024, 128 heads, kv 128,
//        ffn 65536), pp = 8
//
// Each iteration plans one mini-batch end to end: validation, ordering, the
// DP for every recompute mode and memory budget, balancing and statistics
// (PlanMicroBatches, as Planner::Plan calls it). Mixtures: FLAN-like and
// documents-like (*Documents: about 350 samples per mini-batch). Baselines
// in the same process: the same DP without the candidate bound, and exact
// (unbucketed) tmax candidates.
//
// Run: build/bench/microbatch_bench --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
#include <cstdio>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/dataset/synthetic_mixture.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/microbatch/dp_partition.h"
#include "planner/microbatch/micro_batching.h"

namespace varipipe::planner {
namespace {

constexpr uint64_t kTokensPerBatch = 65536;
constexpr uint32_t kMaxLength = 2048;
constexpr uint32_t kMaxTarget = 512;
constexpr int kMiniBatches = 16;

struct Setup {
  ModelDims dims;
  CostModel model;
  MicroBatchingOptions options;
  std::vector<std::vector<SampleLengths>> batches;
  std::vector<std::vector<SampleLengths>> documents;
};

// Consecutive samples of the mixture, truncated, until the token budget.
std::vector<std::vector<SampleLengths>> MakeBatches(bool t5, bool documents) {
  const SyntheticMixture mixture =
      documents ? SyntheticMixture::Documents(2024) : SyntheticMixture::Flan(2024);
  std::vector<std::vector<SampleLengths>> batches;
  uint64_t index = 0;
  for (int b = 0; b < kMiniBatches; ++b) {
    std::vector<SampleLengths> batch;
    uint64_t tokens = 0;
    while (true) {
      SampleLengths s = mixture.Sample(index);
      if (t5) {
        s = {std::min(s.input, kMaxLength), std::min(s.target, kMaxTarget)};
      } else {
        s.target = std::min(s.target, kMaxLength);
        s.input = std::min(s.input, kMaxLength - s.target);
      }
      if (tokens + s.input + s.target > kTokensPerBatch) break;
      tokens += s.input + s.target;
      batch.push_back(s);
      ++index;
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

const Setup& GetSetup(bool t5) {
  static Setup* setups[2] = {nullptr, nullptr};
  if (setups[t5] != nullptr) return *setups[t5];
  auto* s = new Setup;
  s->dims = t5 ? ModelDims{.kind = ModelKind::kT5,
                           .encoder_layers = 24,
                           .decoder_layers = 24,
                           .hidden = 1024,
                           .heads = 128,
                           .kv_channels = 128,
                           .ffn = 65536,
                           .vocab = 32128,
                           .dtype_bytes = 2}
               : ModelDims{.kind = ModelKind::kGpt,
                           .encoder_layers = 32,
                           .hidden = 4096,
                           .heads = 32,
                           .kv_channels = 128,
                           .ffn = 16384,
                           .vocab = 50432,
                           .dtype_bytes = 2};
  s->model = *BuildAnalyticCostModel(s->dims, *HardwarePreset("a100-40gb"),
                                     {.max_micro_batch_size = 8192, .max_seq_len = kMaxLength});
  MicroBatchingOptions& o = s->options;
  o.dims = s->dims;
  o.pipeline = t5 ? 8 : 4;
  o.data_parallel = 1;
  o.device_memory_limit_bytes = 40.0 * (1 << 30);
  o.max_input_len = kMaxLength;
  o.max_target_len = t5 ? kMaxTarget : 0;
  o.tmax_interval_ms = 0.5;
  s->batches = MakeBatches(t5, false);
  s->documents = MakeBatches(t5, true);
  setups[t5] = s;
  return *s;
}

void Report(benchmark::State& state, const MicroBatchingResult& r, size_t samples) {
  state.counters["samples"] = static_cast<double>(samples);
  state.counters["micro_batches"] = static_cast<double>(r.best().groups.size());
  state.counters["padding_eff"] = r.padding.Efficiency();
  state.counters["pred_iter_ms"] = r.best().objective_ms;
}

void PlanMiniBatch(benchmark::State& state, bool t5, double interval, bool bound,
                   bool documents = false) {
  const Setup& s = GetSetup(t5);
  const std::vector<std::vector<SampleLengths>>& batches = documents ? s.documents : s.batches;
  MicroBatchingOptions o = s.options;
  o.tmax_interval_ms = interval;
  int i = 0;
  MicroBatchingResult last;
  size_t samples = 0;
  for (auto _ : state) {
    const std::vector<SampleLengths>& batch = batches[i++ % kMiniBatches];
    if (bound) {
      absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(batch, s.model, o);
      if (!r.ok()) {
        state.SkipWithError(std::string(r.status().message()).c_str());
        return;
      }
      benchmark::DoNotOptimize(r->best().objective_ms);
      last = *std::move(r);
      samples = batch.size();
    } else {
      // The DP alone, every mode and budget, without the candidate bound.
      absl::StatusOr<StageLayout> layout = MakeStageLayout(s.dims, o.pipeline, 1);
      const double available = *AvailableActivationBytes(s.model, *layout, ZeroStage::k0, 1,
                                                         o.device_memory_limit_bytes);
      const LengthPolicy policy{.encoder_decoder = t5, .multiple = 8};
      const std::vector<uint32_t> order = OrderSamples(batch, policy, SampleOrder::kLengthSort);
      for (Recompute mode : o.recompute_modes) {
        MicroBatchCostModel cost = *MicroBatchCostModel::Create(s.model, *layout, mode, 1);
        for (double limit : {available / o.pipeline, available}) {
          DpProblem p{.samples = batch,
                      .order = order,
                      .policy = policy,
                      .cost = &cost,
                      .pipeline_stages = o.pipeline,
                      .data_parallel = 1,
                      .stored_limit_bytes = limit,
                      .peak_limit_bytes = available,
                      .tmax_interval_ms = interval,
                      .bound_search = false};
          absl::StatusOr<DpSolution> sol = SolveMicroBatchDp(p);
          benchmark::DoNotOptimize(sol.ok());
        }
      }
    }
  }
  if (bound) Report(state, last, samples);
}

void BM_Gpt(benchmark::State& state) { PlanMiniBatch(state, false, 0.5, true); }
void BM_GptNoBound(benchmark::State& state) { PlanMiniBatch(state, false, 0.5, false); }
void BM_GptExact(benchmark::State& state) { PlanMiniBatch(state, false, 0, true); }
void BM_T5(benchmark::State& state) { PlanMiniBatch(state, true, 0.5, true); }
void BM_T5NoBound(benchmark::State& state) { PlanMiniBatch(state, true, 0.5, false); }
void BM_T5Exact(benchmark::State& state) { PlanMiniBatch(state, true, 0, true); }

void BM_GptDocuments(benchmark::State& state) { PlanMiniBatch(state, false, 0.5, true, true); }
void BM_GptDocumentsNoBound(benchmark::State& state) {
  PlanMiniBatch(state, false, 0.5, false, true);
}
void BM_T5Documents(benchmark::State& state) { PlanMiniBatch(state, true, 0.5, true, true); }

BENCHMARK(BM_Gpt)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GptDocuments)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GptDocumentsNoBound)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_T5Documents)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GptNoBound)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GptExact)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_T5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_T5NoBound)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_T5Exact)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace varipipe::planner

BENCHMARK_MAIN();
