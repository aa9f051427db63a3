// Full planning speed (micro-batching, schedule search with simulation,
// communication planning, plan building and validation) on DynaPipe's
// setting: 65,536-token FLAN-like mini-batches, maximum length 2048, A100-40GB
// analytic cost model, one thread.
//   GPT-6.7B-like, pp = 4;  T5-11B-like, pp = 8; schedules adaptive and 1F1B,
//   all three recompute modes, the dynamic program.
// Baseline in the same process: the same with only 1F1B (no adaptive
// ordering search).
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "planner/planner.h"

namespace varipipe::planner {
namespace {

constexpr int kMiniBatches = 8;

v1::JobConfig Config(bool t5, bool adaptive) {
  v1::JobConfig c;
  c.set_job_id(t5 ? "t5-11b" : "gpt-6.7b");
  v1::ModelConfig& m = *c.mutable_model();
  if (t5) {
    m.set_kind(v1::T5);
    m.set_num_layers(24);
    m.set_num_decoder_layers(24);
    m.set_hidden_size(1024);
    m.set_num_attention_heads(128);
    m.set_kv_channels(128);
    m.set_ffn_hidden_size(65536);
    m.set_vocab_size(32128);
  } else {
    m.set_kind(v1::GPT);
    m.set_num_layers(32);
    m.set_hidden_size(4096);
    m.set_num_attention_heads(32);
    m.set_ffn_hidden_size(16384);
    m.set_vocab_size(50432);
  }
  c.mutable_parallelism()->set_pipeline(t5 ? 8 : 4);
  c.mutable_cluster()->set_device_memory_limit_mib(40960);
  c.mutable_cluster()->set_hardware("a100-40gb");
  c.mutable_data()->set_format(v1::SYNTHETIC);
  c.mutable_data()->set_tokens_per_global_batch(65536);
  c.mutable_data()->set_max_sequence_length(2048);
  if (t5) c.mutable_data()->set_max_target_length(512);
  if (adaptive) c.mutable_planner()->add_schedules(v1::ADAPTIVE);
  c.mutable_planner()->add_schedules(v1::ONE_F_ONE_B);
  c.mutable_training()->set_iterations(1);
  ApplyJobConfigDefaults(c);
  return c;
}

std::vector<MiniBatch> Batches(const v1::JobConfig& c) {
  const bool t5 = c.model().kind() == v1::T5;
  const SyntheticMixture mixture = SyntheticMixture::Flan(2024);
  std::vector<MiniBatch> batches;
  uint64_t index = 0;
  for (int b = 0; b < kMiniBatches; ++b) {
    MiniBatch mb;
    mb.iteration = b;
    uint64_t tokens = 0;
    while (true) {
      SampleLengths s = mixture.Sample(index);
      if (t5) {
        s = {std::min(s.input, 2048u), std::min(s.target, 512u)};
      } else {
        s.target = std::min(s.target, 2048u);
        s.input = std::min(s.input, 2048u - s.target);
      }
      if (tokens + s.input + s.target > 65536) break;
      tokens += s.input + s.target;
      mb.sample_ids.push_back(index++);
      mb.lengths.push_back(s);
    }
    batches.push_back(std::move(mb));
  }
  return batches;
}

void Run(benchmark::State& state, bool t5, bool adaptive) {
  const v1::JobConfig config = Config(t5, adaptive);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  if (!planner.ok()) {
    state.SkipWithError(std::string(planner.status().message()).c_str());
    return;
  }
  const std::vector<MiniBatch> batches = Batches(config);
  int i = 0;
  PlanReport last;
  for (auto _ : state) {
    absl::StatusOr<PlanningResult> r = planner->Plan(batches[i++ % kMiniBatches]);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(r->plans.size());
    last = std::move(r->report);
  }
  state.counters["pred_iter_ms"] = last.predicted_iteration_ms;
  state.counters["micro_batches"] = last.micro_batches;
  state.counters["micro_batching_ms"] = last.micro_batching_ms;
  state.counters["scheduling_ms"] = last.scheduling_ms;
  state.counters["validation_ms"] = last.validation_ms;
}

void BM_PlanGpt(benchmark::State& s) { Run(s, false, true); }
void BM_PlanGptOneFOneBOnly(benchmark::State& s) { Run(s, false, false); }
void BM_PlanT5(benchmark::State& s) { Run(s, true, true); }
void BM_PlanT5OneFOneBOnly(benchmark::State& s) { Run(s, true, false); }
BENCHMARK(BM_PlanGpt)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanGptOneFOneBOnly)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanT5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanT5OneFOneBOnly)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace varipipe::planner

BENCHMARK_MAIN();
