#include "tests/testing/tiny_job.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/status.h"
#include "planner/planner.h"

namespace varipipe::testing {

// AdamW's epsilon is 1e-6 rather than 1e-8: some gradients are exactly zero
// in exact arithmetic (the key bias: softmax ignores a constant added to
// every key) and only rounding noise (~1e-12) in floating point; Adam divides
// that noise by its own magnitude, so with a tiny epsilon two summation
// orders of zero give visibly different updates. A larger epsilon leaves
// every real gradient's update as it was.
absl::StatusOr<v1::JobConfig> TinyJobConfig(const TinyJob& job) {
  const bool sgd = job.optimizer == v1::SGD;
  // The layers: 4 per stack, or as many as the listed layout holds.
  uint32_t encoder_layers = std::max(4u, job.pipeline * job.chunks);
  uint32_t decoder_layers = 4;
  std::string layout;
  if (!job.stage_layers.empty()) {
    const size_t e = job.t5 ? job.encoder_stages : job.stage_layers.size();
    encoder_layers = std::accumulate(job.stage_layers.begin(), job.stage_layers.begin() + e, 0u);
    decoder_layers = std::accumulate(job.stage_layers.begin() + e, job.stage_layers.end(), 0u);
    layout =
        absl::StrCat(R"(, "stage_layout": {"layers": [)", absl::StrJoin(job.stage_layers, ", "),
                     "]", job.t5 ? absl::StrCat(R"(, "encoder_stages": )", e) : "", "}");
  }
  const std::string json = absl::StrCat(
      R"({"job_id": "tiny", "model": {"kind": ")", job.t5 ? "T5" : "GPT", R"(", "num_layers": )",
      encoder_layers, R"(, )",
      job.t5 ? absl::StrCat(R"("num_decoder_layers": )", decoder_layers, ", ") : "",
      R"("hidden_size": 32,
      "num_attention_heads": 4, "ffn_hidden_size": 64, "vocab_size": 61, "dtype": "FLOAT32")",
      job.llama ? R"(, "architecture": "LLAMA", "num_key_value_heads": 2, "rope_theta": 10000,
      "rope_scaling": {"factor": 8, "original_max_position_embeddings": 64})"
                : "",
      job.tie_word_embeddings ? R"(, "tie_word_embeddings": true)" : "",
      job.t5v11 ? R"(, "architecture": "T5V11", "relative_attention_num_buckets": 32,
      "relative_attention_max_distance": 64)"
                : "",
      R"(},
      "parallelism": {"pipeline": )",
      job.pipeline, R"(, "data": )", job.data, R"(, "virtual_chunks": )", job.chunks,
      R"(, "tensor": )", job.tensor, job.sequence_parallel ? R"(, "sequence_parallel": true)" : "",
      layout,
      R"(},
      "cluster": {"device_memory_limit_mib": )",
      job.memory_mib != 0                             ? job.memory_mib
      : job.t5 && job.recompute == v1::RECOMPUTE_NONE ? 8u
                                                      : 4u,
      R"(, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": )",
      job.tokens_per_global_batch, R"(,
               "max_sequence_length": )",
      job.max_sequence_length, ", ", job.t5 ? R"("max_target_length": 48, )" : "",
      R"("seed": 11, "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01, "truncate_long_samples": )",
      job.truncate_long_samples ? "true" : "false", R"(},
      "training": {"iterations": )",
      job.iterations,
      sgd ? R"(, "optimizer": "SGD", "learning_rate": 0.05, "min_learning_rate": 0.05,
                "gradient_clip_norm": 0})"
          : R"(, "learning_rate": 0.001, "adam_epsilon": 1e-6})",
      "}");
  VP_ASSIGN_OR_RETURN(v1::JobConfig config, ParseJobConfigJson(json, "tiny job"));
  v1::PlannerConfig& planner = *config.mutable_planner();
  planner.clear_schedules();
  planner.add_schedules(job.schedule);
  planner.clear_recompute_modes();
  planner.add_recompute_modes(job.recompute);
  planner.clear_partition_methods();
  planner.add_partition_methods(job.method);
  config.mutable_model()->set_packed_attention(job.packed_attention);
  if (job.context > 1) {
    config.mutable_parallelism()->set_context(job.context);
    config.mutable_parallelism()->set_context_split(job.context_split);
  }
  ApplyJobConfigDefaults(config);
  VP_RETURN_IF_ERROR(ValidateJobConfig(config, "tiny job"));
  return config;
}

absl::StatusOr<std::vector<v1::ExecutionPlan>> PlanTinyIteration(const v1::JobConfig& config,
                                                                 uint64_t iteration,
                                                                 const SampleDataset& dataset,
                                                                 uint64_t* limit_mib) {
  VP_ASSIGN_OR_RETURN(
      std::unique_ptr<MiniBatchSampler> sampler,
      MiniBatchSampler::Create(dataset.AllLengths(), SamplerOptionsFromConfig(config)));
  const SampledMiniBatch sampled = sampler->Get(iteration);
  v1::JobConfig planning = config;
  absl::Status last = absl::UnknownError("not planned");
  for (int attempt = 0; attempt < 12; ++attempt) {
    VP_ASSIGN_OR_RETURN(planner::Planner planner, planner::Planner::Create(planning));
    absl::StatusOr<planner::PlanningResult> result = planner.Plan(
        {.iteration = iteration, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths});
    if (result.ok()) {
      if (limit_mib != nullptr) *limit_mib = planning.cluster().device_memory_limit_mib();
      return std::move(result->plans);
    }
    if (!absl::IsResourceExhausted(result.status())) return result.status();
    last = result.status();
    const uint64_t limit = planning.cluster().device_memory_limit_mib();
    planning.mutable_cluster()->set_device_memory_limit_mib(std::max(limit + 1, limit * 5 / 4));
  }
  return last;
}

}  // namespace varipipe::testing
