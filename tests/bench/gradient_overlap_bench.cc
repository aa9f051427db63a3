// Data-parallel gradient reduction overlapped with the backward passes
// (executor/runtime/gradient_buckets.h) against one all-reduce per stage
// after the last backward, in the same process: two data-parallel CPU ranks
// (threads, Gloo over loopback, a real redis-server for the rendezvous) run
// the same plans of a 4-layer GPT (hidden 256) both ways, alternating.
// `after_backward_ms_*` is the time from the end of the last backward pass
// to the optimizer step (the AllReduceGradients instruction: with buckets,
// the wait for the reductions not finished during the backward), and
// `after_backward_buckets_vs_single` their ratio. BM_Zero1GradientOverlap
// does the same under ZeRO stage 1 (training.zero_stage 1): the buckets'
// reduce-scatters during the backward against one reduce-scatter per stage
// at the instruction (optimizer_sharding.h).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "common/dataset/sample_dataset.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/threaded_ranks.h"
#include "tests/testing/tiny_job.h"

namespace varipipe::testing {
namespace {

// Runs the comparison with training.zero_stage `zero_stage`.
void GradientOverlap(benchmark::State& state, uint32_t zero_stage) {
  torch::set_num_threads(1);
  TinyJob job;
  job.data = 2;
  job.iterations = 2;
  job.tokens_per_global_batch = 2400;
  job.memory_mib = 40;  // the model state of hidden 256 (31 MiB) and a few micro-batches
  absl::StatusOr<v1::JobConfig> config = TinyJobConfig(job);
  if (!config.ok()) {
    state.SkipWithError(std::string(config.status().message()).c_str());
    return;
  }
  v1::ModelConfig& model = *config->mutable_model();
  model.set_num_layers(4);
  model.set_hidden_size(256);
  model.set_ffn_hidden_size(1024);
  model.set_num_attention_heads(4);
  config->mutable_training()->set_zero_stage(zero_stage);
  std::unique_ptr<SampleDataset> dataset = *OpenSampleDataset(*config);
  std::vector<std::vector<v1::ExecutionPlan>> plans;
  for (uint64_t it = 0; it < job.iterations; ++it) {
    absl::StatusOr<std::vector<v1::ExecutionPlan>> p = PlanTinyIteration(*config, it, *dataset);
    if (!p.ok()) {
      state.SkipWithError(std::string(p.status().message()).c_str());
      return;
    }
    plans.push_back(*std::move(p));
  }
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  if (!redis.ok()) {
    state.SkipWithError(std::string(redis.status().message()).c_str());
    return;
  }
  // [0]: buckets of 256 KiB (about 4 per layer's weights); [1]: none.
  double after_backward[2] = {0, 0};
  double iteration[2] = {0, 0};
  int started_early = 0;
  int runs = 0;
  for (auto _ : state) {
    for (int v = 0; v < 2; ++v) {
      ThreadedRanksOptions options;
      options.redis_host = (*redis)->host();
      options.redis_port = (*redis)->port();
      options.redis_password = (*redis)->password();
      options.prefix = "overlap-" + std::to_string(zero_stage) + "-" + std::to_string(runs) + "-" +
                       std::to_string(v);
      options.gradient_bucket_bytes = v == 0 ? (256 << 10) : 0;
      const std::vector<RankRun> ranks = RunThreadedRanks(*config, plans, *dataset, options);
      for (const RankRun& r : ranks) {
        if (!r.status.ok()) {
          state.SkipWithError(std::string(r.status.message()).c_str());
          return;
        }
        // The steady-state iteration (the second).
        after_backward[v] += r.stats.back().reduce_gradients_seconds;
        iteration[v] += r.stats.back().total_seconds;
        if (v == 0) started_early += r.stats.back().buckets_started_in_backward;
      }
    }
    ++runs;
  }
  const double n = 2.0 * runs;  // ranks x runs
  state.counters["after_backward_ms_buckets"] = 1e3 * after_backward[0] / n;
  state.counters["after_backward_ms_single"] = 1e3 * after_backward[1] / n;
  state.counters["after_backward_buckets_vs_single"] = after_backward[0] / after_backward[1];
  state.counters["iteration_buckets_vs_single"] = iteration[0] / iteration[1];
  state.counters["buckets_started_in_backward"] = started_early / n;
}
void BM_GradientOverlap(benchmark::State& state) { GradientOverlap(state, 0); }
void BM_Zero1GradientOverlap(benchmark::State& state) { GradientOverlap(state, 1); }
BENCHMARK(BM_GradientOverlap)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_Zero1GradientOverlap)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace
}  // namespace varipipe::testing

BENCHMARK_MAIN();
