#include "planner/tools/baseline_tuning.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/job_config.h"
#include "common/config/layer_layout.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/dataset/synthetic_mixture.h"
#include "planner/cost/cost_model_io.h"
#include "planner/layout/stage_layout_search.h"
#include "planner/microbatch/baseline_settings.h"

namespace varipipe::tools {
namespace {

constexpr uint64_t kSyntheticSamples = 200000;

absl::Status BuildCostModel(EvaluationJob& job) {
  absl::StatusOr<planner::CostModel> model = planner::CostModelForJob(job.config);
  if (!model.ok()) return model.status();
  job.cost_model = *std::move(model);
  job.cost_model_name = job.cost_model.description();
  return absl::OkStatus();
}

// The job restricted to one setting.
v1::JobConfig ConfigFor(const v1::JobConfig& base, const Setting& s) {
  v1::JobConfig config = base;
  v1::PlannerConfig& p = *config.mutable_planner();
  p.clear_partition_methods();
  if (s.method == v1::PARTITION_METHOD_UNSPECIFIED) {
    ApplyJobConfigDefaults(config);  // every method, settings tuned per mini-batch
  } else {
    p.add_partition_methods(s.method);
  }
  if (s.rows > 0) p.set_fixed_micro_batch_size(s.rows);
  if (s.token_budget > 0) p.set_micro_batch_token_budget(s.token_budget);
  if (s.recompute != v1::RECOMPUTE_MODE_UNSPECIFIED) {
    p.clear_recompute_modes();
    p.add_recompute_modes(s.recompute);
  }
  if (s.packed_attention != v1::PACKED_ATTENTION_UNSPECIFIED) {
    config.mutable_model()->set_packed_attention(s.packed_attention);
  }
  return config;
}

// The first line of a planner error, which names the mini-batch and the
// first candidate's reason.
std::string ShortReason(const absl::Status& status, uint64_t iteration) {
  std::string text(status.message());
  // "...: no candidate plan fits memory:\n  candidate: reason\n...": the
  // headline and the last candidate (the most lenient recompute mode).
  if (size_t end = text.find('\n'); end != std::string::npos) {
    if (end > 0 && text[end - 1] == ':') {
      std::string last;
      for (absl::string_view line : absl::StrSplit(text.substr(end + 1), '\n')) {
        line = absl::StripAsciiWhitespace(line);
        if (!line.empty()) last = std::string(line);
      }
      text = absl::StrCat(text.substr(0, end), " ", last);
    } else {
      text.resize(end);
    }
  }
  if (text.size() > 300) text = text.substr(0, 297) + "...";
  const std::string prefix = absl::StrCat("iteration ", iteration, ":");
  return text.rfind(prefix, 0) == 0 ? text : absl::StrCat(prefix, " ", text);
}

}  // namespace

std::string MethodName(v1::PartitionMethod method, v1::PackedAttention packed_attention) {
  switch (method) {
    case v1::DYNAMIC_PROGRAMMING:
      return "dp";
    case v1::PACKING:
      return packed_attention == v1::PER_SAMPLE                ? "packing-varlen"
             : packed_attention == v1::FASTEST_PER_MICRO_BATCH ? "packing-fastest"
                                                               : "packing";
    case v1::TOKEN_BASED:
      return "token-based";
    case v1::FIXED_SIZE:
      return "fixed-size";
    case v1::PADDING:
      return "padding";
    case v1::PARTITION_METHOD_UNSPECIFIED:
      return "varipipe";
    default:
      return "unknown";
  }
}

std::string Setting::Describe() const {
  if (rows > 0) return absl::StrCat("rows=", rows);
  if (token_budget > 0) return absl::StrCat("tokens=", token_budget);
  return "-";
}

std::string Setting::RecomputeName() const {
  switch (recompute) {
    case v1::RECOMPUTE_NONE:
      return "none";
    case v1::RECOMPUTE_SELECTIVE:
      return "selective";
    case v1::RECOMPUTE_FULL:
      return "full";
    default:
      return "per-iteration";
  }
}

absl::StatusOr<EvaluationJob> LoadEvaluationJob(const std::string& config_path,
                                                const std::string& mixture,
                                                const std::string& cost_model) {
  if (mixture != "flan" && mixture != "documents" && mixture != "long_tail") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mixture: '", mixture, "' is none of 'flan', 'documents' and 'long_tail'"));
  }
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfigFile(config_path);
  if (!loaded.ok()) return loaded.status();
  EvaluationJob job;
  job.config = *std::move(loaded);
  v1::DataConfig& data = *job.config.mutable_data();
  data.set_format(v1::SYNTHETIC);
  data.clear_path();
  data.clear_target_path();
  data.set_synthetic_num_samples(kSyntheticSamples);
  data.set_synthetic_mixture(mixture == "documents"   ? v1::DOCUMENTS
                             : mixture == "long_tail" ? v1::LONG_TAIL
                                                      : v1::FLAN_LIKE);
  job.config.mutable_planner()->set_threads(1);
  job.config.mutable_planner()->set_cost_model_path(cost_model);
  job.cost_model_path = cost_model;
  job.mixture_name = mixture;
  const v1::ModelConfig& m = job.config.model();
  job.model_name =
      absl::StrCat(m.kind() == v1::T5              ? "T5"
                   : m.architecture() == v1::LLAMA ? "LLAMA"
                                                   : "GPT",
                   " ", m.num_layers() + m.num_decoder_layers(), "L h", m.hidden_size(), " pp",
                   job.config.parallelism().pipeline(), " dp", job.config.parallelism().data());
  if (absl::Status s = ValidateJobConfig(job.config, config_path); !s.ok()) return s;
  if (absl::Status s = BuildCostModel(job); !s.ok()) return s;
  return job;
}

absl::StatusOr<EvaluationJob> WithLimits(const EvaluationJob& job, uint32_t max_length,
                                         uint64_t memory_mib) {
  EvaluationJob out = job;
  v1::DataConfig& data = *out.config.mutable_data();
  data.set_max_sequence_length(max_length);
  if (out.config.model().kind() == v1::T5) {
    data.set_max_target_length(std::max<uint32_t>(8, max_length / 4));
  }
  out.config.mutable_cluster()->set_device_memory_limit_mib(memory_mib);
  if (absl::Status s = ValidateJobConfig(out.config, "evaluation job"); !s.ok()) return s;
  if (absl::Status s = BuildCostModel(out); !s.ok()) return s;
  // parallelism.stage_layout AUTO: the layout the daemons would choose for
  // this cell (its first mini-batches), the same for every method.
  if (EffectiveLayoutMode(out.config.parallelism().stage_layout()) == v1::AUTO) {
    const planner::Planner planner(out.config, out.cost_model, {.threads = 1});
    absl::StatusOr<planner::LayoutChoice> choice = planner::ChooseStageLayout(
        planner, MiniBatches(out, static_cast<int>(planner::kLayoutSampleMiniBatches)));
    if (!choice.ok()) return choice.status();
    *out.config.mutable_parallelism()->mutable_stage_layout() = LayerLayoutToConfig(choice->chosen);
  }
  return out;
}

std::vector<planner::MiniBatch> MiniBatches(const EvaluationJob& job, int n) {
  const v1::DataConfig& data = job.config.data();
  const SyntheticMixture mixture = SyntheticMixture::Named(
      data.synthetic_mixture() == v1::LONG_TAIL ? "long_tail"
                                                : SyntheticMixtureName(data.synthetic_mixture()),
      data.seed());
  std::vector<SampleLengths> lengths;
  lengths.reserve(data.synthetic_num_samples());
  for (uint64_t i = 0; i < data.synthetic_num_samples(); ++i) lengths.push_back(mixture.Sample(i));
  absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler =
      MiniBatchSampler::Create(std::move(lengths), SamplerOptionsFromConfig(job.config));
  std::vector<planner::MiniBatch> batches;
  if (!sampler.ok()) return batches;
  for (int k = 0; k < n; ++k) {
    const SampledMiniBatch s = (*sampler)->Get(static_cast<uint64_t>(k));
    batches.push_back({.iteration = s.iteration, .sample_ids = s.sample_ids, .lengths = s.lengths});
  }
  return batches;
}

TrialOutcome Evaluate(const EvaluationJob& job, const Setting& setting,
                      const std::vector<planner::MiniBatch>& batches) {
  TrialOutcome out;
  out.setting = setting;
  const planner::Planner planner(ConfigFor(job.config, setting), job.cost_model, {.threads = 1});
  double tokens = 0;
  double ms = 0;
  for (const planner::MiniBatch& mb : batches) {
    absl::StatusOr<planner::PlanningResult> r = planner.Plan(mb);
    if (!r.ok()) {
      const Setting kept = out.setting;
      out = TrialOutcome{.setting = kept, .reason = ShortReason(r.status(), mb.iteration)};
      return out;
    }
    tokens += static_cast<double>(r->report.real_tokens);
    ms += r->report.predicted_iteration_ms;
    out.padding_efficiency += r->report.padding_efficiency / batches.size();
    out.micro_batches += static_cast<double>(r->report.micro_batches) / batches.size();
  }
  out.feasible = !batches.empty();
  out.tokens_per_s = ms > 0 ? tokens / (ms / 1e3) : 0;
  out.predicted_ms = ms / std::max<size_t>(1, batches.size());
  return out;
}

MethodResult TuneMethod(const EvaluationJob& job, v1::PartitionMethod method,
                        const std::vector<planner::MiniBatch>& batches,
                        v1::PackedAttention packed_attention) {
  MethodResult result;
  result.method = MethodName(method, packed_attention == v1::PACKED_ATTENTION_UNSPECIFIED
                                         ? job.config.model().packed_attention()
                                         : packed_attention);
  std::vector<Setting> settings;
  const uint32_t length = job.config.data().max_sequence_length();
  for (v1::RecomputeMode mode : {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL}) {
    switch (method) {
      case v1::DYNAMIC_PROGRAMMING:
        break;
      case v1::TOKEN_BASED:
        for (uint32_t k : planner::kTokenLadder) {
          settings.push_back(
              {.method = method, .token_budget = uint64_t{k} * length, .recompute = mode});
        }
        break;
      default:
        for (uint32_t rows : planner::kRowLadder) {
          settings.push_back({.method = method,
                              .rows = rows,
                              .recompute = mode,
                              .packed_attention = packed_attention});
        }
    }
  }
  if (method == v1::DYNAMIC_PROGRAMMING || method == v1::PARTITION_METHOD_UNSPECIFIED) {
    settings.push_back({.method = method});
  }
  for (const Setting& s : settings) result.trials.push_back(Evaluate(job, s, batches));
  // The best that fits; when none does, the most lenient setting tried
  // (smallest micro-batches, full recomputation) carries the reason.
  int best = -1;
  for (size_t k = 0; k < result.trials.size(); ++k) {
    const TrialOutcome& t = result.trials[k];
    if (t.feasible && (best < 0 || t.tokens_per_s > result.trials[best].tokens_per_s)) {
      best = static_cast<int>(k);
    }
  }
  if (best < 0) {
    best = static_cast<int>(result.trials.size()) - 1;
    for (size_t k = 0; k < result.trials.size(); ++k) {
      const Setting& s = result.trials[k].setting;
      if (s.recompute == v1::RECOMPUTE_FULL && (s.rows == 1 || s.token_budget == length)) {
        best = static_cast<int>(k);
      }
    }
  }
  result.chosen = best;
  return result;
}

std::vector<MethodResult> TuneAllMethods(const EvaluationJob& job,
                                         const std::vector<planner::MiniBatch>& batches) {
  std::vector<MethodResult> results;
  for (v1::PartitionMethod m : {v1::PARTITION_METHOD_UNSPECIFIED, v1::DYNAMIC_PROGRAMMING,
                                v1::PACKING, v1::TOKEN_BASED, v1::FIXED_SIZE, v1::PADDING}) {
    if (m == v1::PACKING) {
      results.push_back(TuneMethod(job, m, batches, v1::BLOCK_DIAGONAL_MASK));
      results.push_back(TuneMethod(job, m, batches, v1::PER_SAMPLE));
      continue;
    }
    results.push_back(TuneMethod(job, m, batches));
  }
  return results;
}

std::vector<IterationOutcome> PlanEach(const EvaluationJob& job,
                                       const std::vector<planner::MiniBatch>& batches) {
  const planner::Planner planner(job.config, job.cost_model, {.threads = 1});
  std::vector<IterationOutcome> out;
  for (const planner::MiniBatch& mb : batches) {
    absl::StatusOr<planner::PlanningResult> r = planner.Plan(mb);
    if (!r.ok()) continue;
    out.push_back({.iteration = mb.iteration,
                   .samples = static_cast<int>(mb.sample_ids.size()),
                   .planning_ms = r->report.total_ms,
                   .predicted_ms = r->report.predicted_iteration_ms,
                   .micro_batches = r->report.micro_batches,
                   .schedule = r->report.schedule,
                   .recompute = r->report.recompute});
  }
  return out;
}

}  // namespace varipipe::tools
