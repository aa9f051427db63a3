// The plan interpreter's own overhead per instruction: one rank (pp=1,
// dp=1, no transfers) runs a planner-made plan of hundreds of instructions
// (fixed-size micro-batches of one sample) on a one-layer model whose compute
// is small. Counters split each iteration into compute (forward, backward,
// optimizer), data (samples and lengths from the dataset) and the rest, the
// interpreter's overhead; `overhead_us_per_instruction` is the figure
// docs/benchmarks.md reports, `overhead_vs_compute` its ratio to the compute
// measured in the same run. Each iteration runs the plan twice, with inputs
// built ahead on a thread (the default) and built when taken: the
// `*_ahead_vs_inline` counters are their ratios (the host's time per
// instruction outside compute: overhead plus waiting for data), and
// `host_reads_per_iteration` the device reads the default path makes.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>

#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/plan_interpreter.h"
#include "executor/runtime/training_optimizer.h"
#include "planner/planner.h"

namespace varipipe::executor {
namespace {

void BM_InterpreterOverhead(benchmark::State& state) {
  torch::set_num_threads(1);
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(R"({
    "job_id": "bench",
    "model": {"kind": "GPT", "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
              "ffn_hidden_size": 32, "vocab_size": 32, "dtype": "FLOAT32"},
    "cluster": {"device_memory_limit_mib": 1024, "devices_per_node": 1},
    "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 16384, "max_sequence_length": 64,
             "seed": 1, "synthetic_num_samples": 20000},
    "planner": {"partition_methods": ["FIXED_SIZE"], "fixed_micro_batch_size": 1,
                "schedules": ["ONE_F_ONE_B"], "recompute_modes": ["RECOMPUTE_NONE"]},
    "training": {"iterations": 1000000}})",
                                                            "bench");
  if (!config.ok()) {
    state.SkipWithError(std::string(config.status().message()).c_str());
    return;
  }
  ApplyJobConfigDefaults(*config);
  std::unique_ptr<SampleDataset> dataset = *OpenSampleDataset(*config);
  const SamplerOptions sampler = SamplerOptionsFromConfig(*config);
  auto mini_batches = *MiniBatchSampler::Create(dataset->AllLengths(), sampler);
  const SampledMiniBatch sampled = mini_batches->Get(0);
  planner::Planner planner = *planner::Planner::Create(*config);
  const v1::ExecutionPlan plan =
      planner.Plan({.iteration = 0, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths})
          ->plans[0];
  const ModelSpec spec = *ModelSpecFromConfig(*config);
  ModelStage stage(spec, (*PipelineStageRoles(spec, 1))[0]);
  TrainingOptimizer optimizer(stage.parameters(), config->training());
  MicroBatchLoader loader(dataset.get(), sampler);
  const absl::StatusOr<CheckedPlan> checked =
      CheckedPlan::Check(std::make_shared<const v1::ExecutionPlan>(plan), *config,
                         {.iteration = plan.iteration(), .rank = 0, .dp_rank = 0, .pp_rank = 0});
  if (!checked.ok()) {
    state.SkipWithError(std::string(checked.status().message()).c_str());
    return;
  }
  // Two interpreters in turn: inputs built ahead on a thread (the default)
  // and built when taken (prefetch_inputs 0, the executor before inputs were
  // built ahead), so their ratio comes from one run.
  struct Variant {
    std::unique_ptr<PlanInterpreter> interpreter;
    double overhead = 0, compute = 0, data = 0, total = 0;
    int instructions = 0, host_reads = 0;
  };
  Variant variants[2];
  for (int v = 0; v < 2; ++v) {
    InterpreterOptions options;
    options.prefetch_inputs = v == 0 ? InterpreterOptions().prefetch_inputs : 0;
    variants[v].interpreter =
        std::make_unique<PlanInterpreter>(std::map<uint32_t, ModelStage*>{{0, &stage}},
                                          /*transport=*/nullptr, &loader, &optimizer, options);
  }
  for (auto _ : state) {
    for (Variant& v : variants) {
      absl::StatusOr<IterationStats> stats = v.interpreter->Run(*checked);
      if (!stats.ok()) {
        state.SkipWithError(std::string(stats.status().message()).c_str());
        return;
      }
      v.overhead += stats->overhead_seconds;
      v.compute += stats->compute_seconds;
      v.data += stats->data_seconds;
      v.total += stats->total_seconds;
      v.instructions += stats->instructions;
      v.host_reads += stats->host_reads;
    }
  }
  const Variant& ahead = variants[0];
  const Variant& inline_inputs = variants[1];
  state.counters["instructions_per_plan"] = plan.instructions_size();
  state.counters["overhead_us_per_instruction"] = 1e6 * ahead.overhead / ahead.instructions;
  state.counters["data_us_per_instruction"] = 1e6 * ahead.data / ahead.instructions;
  state.counters["compute_us_per_instruction"] = 1e6 * ahead.compute / ahead.instructions;
  state.counters["overhead_vs_compute"] = ahead.overhead / ahead.compute;
  state.counters["overhead_share"] = ahead.overhead / ahead.total;
  state.counters["host_reads_per_iteration"] =
      static_cast<double>(ahead.host_reads) / static_cast<double>(state.iterations());
  // Inputs built when taken: the data wait is the loading itself.
  state.counters["inline_data_us_per_instruction"] =
      1e6 * inline_inputs.data / inline_inputs.instructions;
  state.counters["host_us_per_instruction_ahead_vs_inline"] =
      (ahead.overhead + ahead.data) / (inline_inputs.overhead + inline_inputs.data);
  state.counters["iteration_ahead_vs_inline"] = ahead.total / inline_inputs.total;
}
BENCHMARK(BM_InterpreterOverhead)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace varipipe::executor

BENCHMARK_MAIN();
