// varipipe-plan: plans iterations of a job offline and prints what the
// planner decided: partition method, schedule, recompute mode, micro-batches,
// predicted iteration time, bubble fraction, peak memory and planning time.
// It can compare every partition method and schedule, print JSON reports,
// write every rank's ExecutionPlan and a Chrome trace of the predicted
// timeline. docs/planner-cli.md describes the output.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/binary_main.h"
#include "common/checkpoint/hf_model_config.h"
#include "common/config/job_config.h"
#include "common/config/layer_layout.h"
#include "common/dataset/lengths_csv.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/dataset/synthetic_mixture.h"
#include "common/logging.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "planner/layout/stage_layout_search.h"
#include "planner/method_summary.h"
#include "planner/planner.h"
#include "planner/tools/parallelism_search.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(std::string, lengths, "",
          "CSV of sample lengths, one 'input_len,target_len' line per sample (a header line "
          "and '#' comments are allowed). Default: the job's synthetic dataset.");
ABSL_FLAG(int, iterations, 3, "Number of mini-batches (iterations) to plan.");
ABSL_FLAG(int64_t, first_iteration, 0, "Iteration of the first mini-batch to plan.");
ABSL_FLAG(std::string, trace, "",
          "Write a Chrome trace (Perfetto, chrome://tracing) of the first planned iteration's "
          "predicted timeline (data-parallel replica 0) to this file.");
ABSL_FLAG(bool, compare, false,
          "Also plan with every partition method (baseline settings tuned per mini-batch "
          "unless the config fixes them) and every schedule, simulate every candidate, and "
          "print each (method, schedule) cell's predicted throughput under the plan's own, "
          "fastest first. Packing also appears with each attention kernel alone: "
          "packing-varlen (per sample) and packing-full-row (over the whole row under a "
          "block-diagonal mask). A job with parallelism.context > 1 is also planned under "
          "each context_split policy (ALWAYS: static context parallelism, NEVER, "
          "PER_MICRO_BATCH), printed side by side.");
ABSL_FLAG(bool, json, false, "Print one JSON report per iteration instead of the table.");
ABSL_FLAG(bool, ideal_context_split, false,
          "What-if, with parallelism.context > 1: price each split micro-batch's lanes at "
          "exactly 1/c of its time on one device, with no transfers (docs/cost-model.md, "
          "\"Context parallelism\"). Shows the most that the split costs leave for the "
          "split-or-whole choice to win; the plans are not for training.");
ABSL_FLAG(bool, auto_layout, false,
          "Choose the stage layout as parallelism.stage_layout AUTO does (over the job's first "
          "8 mini-batches), whatever the config says, print the candidates, and plan with it.");
ABSL_FLAG(std::string, emit_plans, "",
          "Write every rank's ExecutionPlan (protobuf JSON) to "
          "DIR/iteration_NNNNNN/rank_NNNNN.json.");
ABSL_FLAG(std::string, model_from_hf, "",
          "Print the job's \"model\" section for a Hugging Face checkpoint (its config.json, or "
          "the directory holding it) and exit; --config is not needed. Llama-family models.");
ABSL_FLAG(bool, search_parallelism, false,
          "Rank every (tensor, context, pipeline, data) layout of --gpus GPUs for this job by "
          "predicted real tokens/s on --iterations mini-batches (context degrees 1, 2, 4, 8 "
          "with the per-micro-batch split, static context parallelism beside it), and say why "
          "each refused layout does not work (tensor or context groups across nodes, degrees "
          "the model does not divide, memory).");
ABSL_FLAG(int, gpus, 0,
          "--search_parallelism: GPUs to lay out. Default: the config's pipeline x data x "
          "tensor x context.");
ABSL_FLAG(int, gpus_per_node, 0,
          "--search_parallelism: GPUs per node (tensor and context groups stay within one). "
          "Default: "
          "cluster.devices_per_node.");
ABSL_FLAG(std::string, context_degrees, "1,2,4,8",
          "--search_parallelism: context-parallel degrees to try (comma-separated; T5: 1 "
          "only).");
ABSL_FLAG(std::string, cost_model, "",
          "Cost model to use instead of planner.cost_model_path: the project's JSON format or a "
          "DynaPipe profile directory.");

namespace varipipe {
namespace {

constexpr char kUsage[] =
    "Plans iterations of a training job offline and prints the planner's decisions.\n"
    "\n"
    "Usage: varipipe-plan --config job.json [--lengths lengths.csv] [--iterations N]\n"
    "                     [--first-iteration I] [--trace out.json] [--compare] [--json]\n"
    "                     [--emit-plans DIR] [--cost-model FILE] [--auto_layout]\n"
    "       varipipe-plan --config job.json --search_parallelism [--gpus N]\n"
    "                     [--gpus_per_node G] [--context_degrees 1,2,4,8] [--iterations N]\n"
    "       varipipe-plan --model_from_hf CHECKPOINT_DIR\n"
    "\n"
    "Mini-batches: the training sampler's (shuffled per epoch, as daemons and\n"
    "executors draw them) over the samples of --lengths or the job's synthetic\n"
    "dataset (data.synthetic_mixture), truncated to the maximum lengths, up to\n"
    "data.tokens_per_global_batch tokens. Each is planned\n"
    "as the planner daemon would: the partition methods, schedules and recompute\n"
    "modes the config allows are searched, the fastest candidate that fits memory\n"
    "is lowered to one execution plan per rank and validated.\n"
    "\n"
    "Context parallelism (parallelism.context > 1): --compare also plans the job\n"
    "under each context_split policy (always: static context parallelism, never,\n"
    "per-micro-batch) and prints them side by side.\n"
    "\n"
    "Stage layout: the config's (parallelism.stage_layout). With mode AUTO, or\n"
    "--auto_layout, it is chosen first as the planner daemons choose it, and the\n"
    "candidates are printed with their mean predicted iteration.";

// The synthetic mixture of a config (docs/datasets.md).
std::string MixtureName(v1::SyntheticMixtureKind kind) {
  return kind == v1::LONG_TAIL ? "long_tail" : SyntheticMixtureName(kind);
}

// The mini-batch of each iteration, drawn by the training sampler
// (common/dataset/minibatch_sampler.h) over the samples' lengths, so the plans
// written here are the ones a planner daemon serves for the same job.
class MiniBatchSource {
 public:
  // `samples` from --lengths; empty: the job's synthetic dataset.
  static absl::StatusOr<MiniBatchSource> Create(const v1::JobConfig& config,
                                                const std::vector<SampleLengths>& samples) {
    std::vector<SampleLengths> lengths;
    if (samples.empty()) {
      const SyntheticMixture mixture = SyntheticMixture::Named(
          MixtureName(config.data().synthetic_mixture()), config.data().seed());
      for (uint64_t i = 0; i < config.data().synthetic_num_samples(); ++i) {
        lengths.push_back(mixture.Sample(i));
      }
    } else {
      lengths = samples;
    }
    absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler =
        MiniBatchSampler::Create(std::move(lengths), SamplerOptionsFromConfig(config));
    if (!sampler.ok()) return sampler.status();
    return MiniBatchSource(*std::move(sampler));
  }

  planner::MiniBatch Next(uint64_t iteration) const {
    const SampledMiniBatch sampled = sampler_->Get(iteration);
    planner::MiniBatch mb;
    mb.iteration = iteration;
    mb.sample_ids = sampled.sample_ids;
    mb.lengths = sampled.lengths;
    return mb;
  }

 private:
  explicit MiniBatchSource(std::unique_ptr<MiniBatchSampler> sampler)
      : sampler_(std::move(sampler)) {}
  std::shared_ptr<MiniBatchSampler> sampler_;
};

double GiB(double bytes) { return bytes / (1ull << 30); }

google::protobuf::Value Num(double v) {
  google::protobuf::Value value;
  value.set_number_value(v);
  return value;
}
google::protobuf::Value Str(const std::string& v) {
  google::protobuf::Value value;
  value.set_string_value(v);
  return value;
}

const char* MethodOutcomeName(planner::MethodSummary::Outcome outcome) {
  switch (outcome) {
    case planner::MethodSummary::Outcome::kChosen:
      return "chosen";
    case planner::MethodSummary::Outcome::kSlower:
      return "slower";
    case planner::MethodSummary::Outcome::kBounded:
      return "cannot_win";
    case planner::MethodSummary::Outcome::kNoFit:
      return "no_fit";
  }
  return "unknown";
}

// Under each iteration's row: every method's best candidate and why the
// plan beat it.
void PrintMethods(const planner::PlanReport& r) {
  for (const planner::MethodSummary& m : planner::SummarizeMethods(r)) {
    const bool chosen = m.outcome == planner::MethodSummary::Outcome::kChosen;
    std::printf("      %s %-26s %s\n", chosen ? "*" : " ",
                planner::MethodAndSetting(m.best).c_str(), m.why.c_str());
  }
}

google::protobuf::Value MicroBatchJson(const planner::PlanReport::MicroBatchShape& m,
                                       uint32_t context) {
  google::protobuf::Value v;
  auto& mf = *v.mutable_struct_value()->mutable_fields();
  mf["dp_rank"] = Num(m.dp_rank);
  mf["rows"] = Num(m.rows);
  mf["input_len"] = Num(m.input_len);
  mf["target_len"] = Num(m.target_len);
  mf["predicted_ms"] = Num(m.predicted_ms);
  if (context > 1) {
    mf["split"].set_bool_value(m.split);
    if (!m.split) mf["lane"] = Num(m.lane);
  }
  mf["recompute"] = Str(m.recompute);
  auto* ids = mf["sample_ids"].mutable_list_value();
  for (uint64_t id : m.sample_ids) *ids->add_values() = Num(static_cast<double>(id));
  return v;
}

google::protobuf::Value CandidateJson(const planner::CandidateReport& c) {
  google::protobuf::Value v;
  auto& cf = *v.mutable_struct_value()->mutable_fields();
  cf["partition_method"] = Str(c.partition_method);
  if (!c.setting.empty()) cf["setting"] = Str(c.setting);
  cf["schedule"] = Str(c.schedule);
  cf["recompute"] = Str(c.recompute);
  cf["budget"] = Str(c.budget);
  cf["feasible"].set_bool_value(c.feasible);
  if (!c.rejected_at.empty()) cf["rejected_at"] = Str(c.rejected_at);
  if (!c.reason.empty()) cf["reason"] = Str(c.reason);
  if (c.dp_objective_ms > 0) cf["micro_batching_objective_ms"] = Num(c.dp_objective_ms);
  if (c.feasible) {
    cf["makespan_ms"] = Num(c.makespan_ms);
    cf["bubble_fraction"] = Num(c.bubble_fraction);
    cf["busiest_device_ms"] = Num(c.busiest_device_ms);
    cf["peak_bytes"] = Num(c.peak_bytes);
  }
  if (c.makespan_bound_ms > 0) cf["makespan_bound_ms"] = Num(c.makespan_bound_ms);
  return v;
}

google::protobuf::Value MethodJson(const planner::MethodSummary& m) {
  google::protobuf::Value v;
  auto& mf = *v.mutable_struct_value()->mutable_fields();
  mf["partition_method"] = Str(m.partition_method);
  if (!m.best.setting.empty()) mf["setting"] = Str(m.best.setting);
  mf["outcome"] = Str(MethodOutcomeName(m.outcome));
  mf["schedule"] = Str(m.best.schedule);
  mf["recompute"] = Str(m.best.recompute);
  if (m.best.feasible) mf["makespan_ms"] = Num(m.best.makespan_ms);
  if (m.outcome != planner::MethodSummary::Outcome::kNoFit) mf["slower_by"] = Num(m.slower_by);
  mf["why"] = Str(m.why);
  return v;
}

google::protobuf::Value PlanningTimesJson(const planner::PlanReport& r) {
  google::protobuf::Value v;
  auto& timing = *v.mutable_struct_value()->mutable_fields();
  timing["micro_batching"] = Num(r.micro_batching_ms);
  timing["scheduling"] = Num(r.scheduling_ms);
  timing["plan_building"] = Num(r.plan_building_ms);
  timing["validation"] = Num(r.validation_ms);
  timing["total"] = Num(r.total_ms);
  timing["threads"] = Num(r.threads);
  return v;
}

std::string ReportJson(const planner::MiniBatch& mb, const planner::PlanReport& r,
                       const absl::Status& status = absl::OkStatus()) {
  google::protobuf::Struct root;
  auto& f = *root.mutable_fields();
  f["iteration"] = Num(static_cast<double>(mb.iteration));
  f["ok"].set_bool_value(status.ok());
  if (!status.ok()) f["error"] = Str(std::string(status.message()));
  f["samples"] = Num(static_cast<double>(mb.sample_ids.size()));
  f["real_tokens"] = Num(static_cast<double>(r.real_tokens));
  f["partition_method"] = Str(r.partition_method);
  if (!r.setting.empty()) f["setting"] = Str(r.setting);
  f["schedule"] = Str(r.schedule);
  f["recompute"] = Str(r.recompute);
  f["micro_batches"] = Num(r.micro_batches);
  if (r.context_parallel > 1) {
    f["context_parallel"] = Num(r.context_parallel);
    f["split_micro_batches"] = Num(r.split_micro_batches);
  }
  if (r.raised_recompute_micro_batches > 0) {
    f["raised_recompute_micro_batches"] = Num(r.raised_recompute_micro_batches);
  }
  f["predicted_iteration_ms"] = Num(r.predicted_iteration_ms);
  f["predicted_makespan_ms"] = Num(r.predicted_makespan_ms);
  f["predicted_update_ms"] = Num(r.predicted_update_ms);
  f["predicted_overhead_ms"] = Num(r.predicted_overhead_ms);
  f["bubble_fraction"] = Num(r.bubble_fraction);
  f["busiest_device_ms"] = Num(r.busiest_device_ms);
  f["padding_efficiency"] = Num(r.padding_efficiency);
  f["input_padding_efficiency"] = Num(r.input_padding_efficiency);
  f["target_padding_efficiency"] = Num(r.target_padding_efficiency);
  f["activation_memory_limit_bytes"] = Num(r.memory_limit_bytes);
  auto* limits = f["activation_memory_limit_bytes_per_rank"].mutable_list_value();
  for (double l : r.memory_limit_per_rank) *limits->add_values() = Num(l);
  auto* peaks = f["peak_activation_bytes_per_rank"].mutable_list_value();
  for (double p : r.peak_bytes) *peaks->add_values() = Num(p);
  f["planning_ms"] = PlanningTimesJson(r);
  auto* mbs = f["micro_batch_list"].mutable_list_value();
  for (const auto& m : r.micro_batch_shapes) {
    *mbs->add_values() = MicroBatchJson(m, r.context_parallel);
  }
  auto* cands = f["candidates"].mutable_list_value();
  for (const auto& c : r.candidates) *cands->add_values() = CandidateJson(c);
  auto* methods = f["methods"].mutable_list_value();
  for (const planner::MethodSummary& m : planner::SummarizeMethods(r)) {
    *methods->add_values() = MethodJson(m);
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  (void)google::protobuf::util::MessageToJsonString(root, &json, options);
  return json;
}

absl::Status EmitPlans(const std::string& dir, uint64_t iteration,
                       const std::vector<v1::ExecutionPlan>& plans) {
  const std::filesystem::path folder =
      std::filesystem::path(dir) / absl::StrFormat("iteration_%06d", iteration);
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("create ", folder.string(), ": ", error.message()));
  }
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  for (const v1::ExecutionPlan& plan : plans) {
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(plan, &json, options).ok()) {
      return absl::InternalError("cannot render a plan as JSON");
    }
    const std::filesystem::path file = folder / absl::StrFormat("rank_%05d.json", plan.rank());
    std::ofstream out(file);
    out << json;
    if (!out) return ErrnoToStatus(errno, absl::StrCat("write ", file.string()));
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "varipipe-plan: %s\n", std::string(status.message()).c_str());
  return code;
}

// The command line's job: the config (with --cost_model applied) and the
// samples of --lengths; an exit code when they are unusable.
struct Job {
  v1::JobConfig config;
  std::vector<SampleLengths> samples;
  std::string config_path;
};

std::optional<int> LoadJob(Job& job) {
  job.config_path = absl::GetFlag(FLAGS_config);
  if (job.config_path.empty()) {
    std::fprintf(stderr, "varipipe-plan: --config is required (try --help)\n");
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_iterations) < 1) {
    std::fprintf(stderr, "varipipe-plan: --iterations must be at least 1 (got %d)\n",
                 absl::GetFlag(FLAGS_iterations));
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_first_iteration) < 0) {
    std::fprintf(stderr, "varipipe-plan: --first_iteration must not be negative\n");
    return kExitUsage;
  }
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfigFile(job.config_path);
  if (!loaded.ok()) return Fail(loaded.status(), kExitUsage);
  job.config = *std::move(loaded);
  if (!absl::GetFlag(FLAGS_cost_model).empty()) {
    job.config.mutable_planner()->set_cost_model_path(absl::GetFlag(FLAGS_cost_model));
  }
  if (!absl::GetFlag(FLAGS_lengths).empty()) {
    absl::StatusOr<std::vector<SampleLengths>> read = ReadLengthsCsv(absl::GetFlag(FLAGS_lengths));
    if (!read.ok()) return Fail(read.status(), kExitUsage);
    job.samples = *std::move(read);
  } else if (job.config.data().format() != v1::SYNTHETIC) {
    std::fprintf(stderr,
                 "varipipe-plan: %s: data.format %s needs --lengths (this tool reads lengths "
                 "from a CSV or the synthetic dataset)\n",
                 job.config_path.c_str(),
                 v1::DatasetFormat_Name(job.config.data().format()).c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

// --compare: the default search (every partition method, baseline settings
// tuned unless the config fixes them, every schedule valid for the job,
// the config's recompute modes), with every candidate simulated, so that
// every (method, schedule) cell has its best setting and recompute mode.
// The DP shares its bound across pairs as the planner does: with the
// default search, the plan is the best of these candidates, so no cell
// beats it. Packing is also compared with each kernel alone, in
// packing-only searches: "packing-varlen" (per sample) and
// "packing-full-row" (the whole row under a block-diagonal mask); the
// default search's own packing cells are named after the job's
// model.packed_attention ("packing" when it chooses per micro-batch).
struct Comparer {
  planner::Planner planner;
  std::string packing;  // the name of its packing cells
};

std::string PackingName(v1::PackedAttention attention) {
  switch (attention) {
    case v1::BLOCK_DIAGONAL_MASK:
      return "packing-full-row";
    case v1::PER_SAMPLE:
      return "packing-varlen";
    default:
      return "packing";
  }
}

std::vector<Comparer> MakeComparers(const v1::JobConfig& config, const planner::Planner& planner) {
  planner::PlannerOptions options = planner.options();
  options.prune_by_bound = false;
  v1::JobConfig all = config;
  all.mutable_planner()->clear_partition_methods();
  all.mutable_planner()->clear_schedules();
  ApplyJobConfigDefaults(all);
  std::vector<Comparer> out;
  out.push_back({planner::Planner(all, planner.cost_model(), options),
                 PackingName(all.model().packed_attention())});
  for (v1::PackedAttention kernel : {v1::PER_SAMPLE, v1::BLOCK_DIAGONAL_MASK}) {
    if (kernel == all.model().packed_attention()) continue;
    v1::JobConfig packing = all;
    packing.mutable_model()->set_packed_attention(kernel);
    packing.mutable_planner()->clear_partition_methods();
    packing.mutable_planner()->add_partition_methods(v1::PACKING);
    out.push_back({planner::Planner(packing, planner.cost_model(), options), PackingName(kernel)});
  }
  return out;
}

// The name of a context_split policy as --compare prints it.
std::string ContextPolicyName(v1::ContextSplitPolicy policy) {
  switch (policy) {
    case v1::ALWAYS:
      return "always";
    case v1::NEVER:
      return "never";
    default:
      return "per-micro-batch";
  }
}

// --compare on a job with parallelism.context > 1: the same job planned
// under each context_split policy, side by side. ALWAYS is static context
// parallelism (every micro-batch split, as Megatron-LM, torchtitan and
// DeepSpeed Ulysses run it); NEVER keeps every micro-batch whole on one lane.
struct ContextComparer {
  v1::ContextSplitPolicy policy;
  planner::Planner planner;
  // Sums over the planned mini-batches.
  int planned = 0;
  double iteration_ms = 0;
  double tokens_per_second = 0;
  int split = 0;
  int micro_batches = 0;
  double peak_bytes = 0;  // the largest lane's predicted peak
  std::string failure;    // the first mini-batch that has no plan, and why
};

std::vector<ContextComparer> MakeContextComparers(const v1::JobConfig& config,
                                                  const planner::Planner& planner) {
  std::vector<ContextComparer> out;
  if (config.parallelism().context() <= 1) return out;
  for (v1::ContextSplitPolicy policy : {v1::ALWAYS, v1::NEVER, v1::PER_MICRO_BATCH}) {
    v1::JobConfig with = config;
    with.mutable_parallelism()->set_context_split(policy);
    out.push_back({.policy = policy,
                   .planner = planner::Planner(with, planner.cost_model(), planner.options()),
                   .failure = {}});
  }
  return out;
}

void CompareContext(ContextComparer& comparer, const planner::MiniBatch& mb) {
  if (!comparer.failure.empty()) return;  // infeasible: a user cannot run it
  absl::StatusOr<planner::PlanningResult> result = comparer.planner.Plan(mb);
  if (!result.ok()) {
    std::vector<std::string> lines = absl::StrSplit(result.status().message(), '\n');
    comparer.failure = absl::StrCat("iteration ", mb.iteration, ": ", lines.front());
    return;
  }
  const planner::PlanReport& r = result->report;
  ++comparer.planned;
  comparer.iteration_ms += r.predicted_iteration_ms;
  comparer.tokens_per_second +=
      static_cast<double>(r.real_tokens) / (r.predicted_iteration_ms / 1e3);
  for (double peak : r.peak_bytes) comparer.peak_bytes = std::max(comparer.peak_bytes, peak);
  // Each context group's micro-batches, counted on its lane 0 of pipeline
  // rank 0 (every lane's plan lists them all).
  for (const v1::ExecutionPlan& plan : result->plans) {
    if (plan.pp_rank() != 0 || plan.context_rank() != 0) continue;
    for (const v1::MicroBatch& m : plan.micro_batches()) {
      ++comparer.micro_batches;
      if (m.context().split()) ++comparer.split;
    }
  }
}

void PrintContextComparison(const std::vector<ContextComparer>& comparers, uint32_t context) {
  if (comparers.empty()) return;
  std::printf(
      "\ncontext parallelism (c=%u; each context_split policy, mean over the mini-batches):\n",
      context);
  std::printf("  %-24s %12s %14s %11s %14s\n", "policy", "pred_iter_ms", "real tokens/s",
              "split/mbs", "peak/lane GiB");
  double always = 0;
  double chosen = 0;
  for (const ContextComparer& c : comparers) {
    const std::string name =
        c.policy == v1::ALWAYS ? "always (static)" : ContextPolicyName(c.policy);
    if (!c.failure.empty() || c.planned == 0) {
      std::printf("  %-24s %12s %14s %11s %14s  %s\n", name.c_str(), "-", "infeasible", "-", "-",
                  c.failure.c_str());
      continue;
    }
    const double tokens = c.tokens_per_second / c.planned;
    if (c.policy == v1::ALWAYS) always = tokens;
    if (c.policy == v1::PER_MICRO_BATCH) chosen = tokens;
    const std::string split = absl::StrCat(c.split, "/", c.micro_batches);
    std::printf("  %-24s %12.2f %14.0f %11s %14.2f\n", name.c_str(), c.iteration_ms / c.planned,
                tokens, split.c_str(), GiB(c.peak_bytes));
  }
  if (always > 0 && chosen > 0) {
    std::printf("  per-micro-batch / always: %.3fx real tokens/s\n", chosen / always);
  }
}

void PrintHeader(const Job& job) {
  const v1::JobConfig& config = job.config;
  const v1::ModelConfig& model = config.model();
  const std::string data =
      job.samples.empty()
          ? absl::StrCat("synthetic ",
                         config.data().synthetic_mixture() == v1::DOCUMENTS   ? "documents-like"
                         : config.data().synthetic_mixture() == v1::LONG_TAIL ? "long-tail"
                                                                              : "FLAN-like",
                         " data (seed ", config.data().seed(), ")")
          : absl::StrCat(job.samples.size(), " samples from ", absl::GetFlag(FLAGS_lengths));
  const absl::StatusOr<LayerLayout> layout = ConfiguredLayerLayout(config);
  const uint32_t context = config.parallelism().context();
  const std::string context_text =
      context > 1 ? absl::StrCat(" cp=", context, " (",
                                 ContextPolicyName(config.parallelism().context_split()), ")")
                  : "";
  std::printf(
      "job %s: %s%s, %u layers, hidden %u; pp=%u dp=%u%s, stage layout %s; %s; %llu tokens per "
      "global batch, max length %u\n",
      config.job_id().c_str(), v1::ModelKind_Name(model.kind()).c_str(),
      model.architecture() == v1::LLAMA   ? " (LLAMA)"
      : model.architecture() == v1::T5V11 ? " (T5V11)"
                                          : "",
      model.num_layers() + model.num_decoder_layers(), model.hidden_size(),
      config.parallelism().pipeline(), config.parallelism().data(), context_text.c_str(),
      layout.ok() ? layout->ToString().c_str() : "even", data.c_str(),
      static_cast<unsigned long long>(config.data().tokens_per_global_batch()),
      config.data().max_sequence_length());
  std::printf("%-5s %7s %-26s %-20s %-10s %4s %12s %7s %9s %8s\n", "iter", "samples", "method",
              "schedule", "recompute", "mbs", "pred_iter_ms", "bubble", "peak_GiB", "plan_ms");
}

// Sums over the planned iterations, and per (method, schedule) for
// --compare.
struct Totals {
  int planned = 0;
  double predicted = 0;
  double plan_ms = 0;
  std::map<std::pair<std::string, std::string>, std::pair<double, int>> throughput;
  std::map<std::pair<std::string, std::string>, double> padding;
  // Cells with no candidate that fits: the first mini-batch's reason.
  std::map<std::pair<std::string, std::string>, std::string> infeasible;
  // --compare: the plans' own sums.
  double chosen_throughput = 0;
  double chosen_padding = 0;
};

// Best recompute mode per (method, schedule) of one mini-batch.
void Compare(const Comparer& comparer, const planner::MiniBatch& mb, Totals& totals) {
  planner::PlanReport failed;
  absl::StatusOr<planner::PlanningResult> all = comparer.planner.Plan(mb, false, &failed);
  const std::vector<planner::CandidateReport>& candidates =
      all.ok() ? all->report.candidates : failed.candidates;
  std::map<std::pair<std::string, std::string>, const planner::CandidateReport*> best;
  std::map<std::pair<std::string, std::string>, std::string> reasons;
  for (const planner::CandidateReport& c : candidates) {
    const auto key = std::make_pair(
        c.partition_method == "packing" ? comparer.packing : c.partition_method, c.schedule);
    if (!c.feasible) {
      // The most lenient recompute mode's reason (the last one tried).
      reasons[key] = absl::StrCat(c.recompute, ": ", c.rejected_at, ": ", c.reason);
      continue;
    }
    if (!best.count(key) || c.makespan_ms < best[key]->makespan_ms) best[key] = &c;
  }
  for (const auto& [key, reason] : reasons) {
    if (!best.count(key) && !totals.infeasible.count(key)) {
      totals.infeasible[key] = absl::StrCat("iteration ", mb.iteration, ": ", reason);
    }
  }
  if (!all.ok()) {
    spdlog::warn("comparison of iteration {} (the search with {}) failed: {}", mb.iteration,
                 comparer.packing, all.status().message());
    return;
  }
  for (const auto& [key, c] : best) {
    totals.throughput[key].first +=
        static_cast<double>(all->report.real_tokens) / (c->makespan_ms / 1e3);
    totals.throughput[key].second += 1;
    totals.padding[key] += c->padding_efficiency;
  }
}

// Plans one mini-batch and prints it (and its trace, plans, comparison).
std::optional<int> PlanOne(const planner::Planner& planner, const std::vector<Comparer>& comparers,
                           std::vector<ContextComparer>& context_comparers,
                           const planner::MiniBatch& mb, std::string& trace_path, Totals& totals) {
  const bool json = absl::GetFlag(FLAGS_json);
  planner::PlanReport failed;
  absl::StatusOr<planner::PlanningResult> result = planner.Plan(mb, !trace_path.empty(), &failed);
  if (!result.ok()) {
    // What was tried and why each candidate was rejected.
    if (json) std::printf("%s\n", ReportJson(mb, failed, result.status()).c_str());
    return Fail(result.status(), kExitFailure);
  }
  const planner::PlanReport& r = result->report;
  if (json) {
    std::printf("%s\n", ReportJson(mb, r).c_str());
  } else {
    const std::string method = planner::MethodAndSetting(r.partition_method, r.setting);
    std::printf("%-5lld %7zu %-26s %-20s %-10s %4d %12.2f %6.1f%% %9.2f %8.2f\n",
                static_cast<long long>(mb.iteration), mb.sample_ids.size(), method.c_str(),
                r.schedule.c_str(), r.recompute.c_str(), r.micro_batches, r.predicted_iteration_ms,
                100 * r.bubble_fraction,
                GiB(*std::max_element(r.peak_bytes.begin(), r.peak_bytes.end())), r.total_ms);
    PrintMethods(r);
  }
  if (!trace_path.empty()) {
    std::ofstream out(trace_path);
    out << r.chrome_trace;
    if (!out) return Fail(ErrnoToStatus(errno, absl::StrCat("write ", trace_path)), kExitFailure);
    spdlog::info("wrote the Chrome trace of iteration {} to {}", mb.iteration, trace_path);
    trace_path.clear();
  }
  if (!absl::GetFlag(FLAGS_emit_plans).empty()) {
    if (absl::Status s = EmitPlans(absl::GetFlag(FLAGS_emit_plans), mb.iteration, result->plans);
        !s.ok()) {
      return Fail(s, kExitFailure);
    }
  }
  if (!comparers.empty()) {
    for (const Comparer& comparer : comparers) Compare(comparer, mb, totals);
    totals.chosen_throughput +=
        static_cast<double>(r.real_tokens) / (r.predicted_makespan_ms / 1e3);
    totals.chosen_padding += r.padding_efficiency;
  }
  for (ContextComparer& comparer : context_comparers) CompareContext(comparer, mb);
  totals.predicted += r.predicted_iteration_ms;
  totals.plan_ms += r.total_ms;
  ++totals.planned;
  return std::nullopt;
}

void PrintSummary(const Totals& totals) {
  std::printf(
      "summary: %d mini-batches; mean predicted iteration %.2f ms; mean planning "
      "time %.2f ms\n",
      totals.planned, totals.predicted / totals.planned, totals.plan_ms / totals.planned);
  if (totals.throughput.empty() && totals.infeasible.empty()) return;
  std::printf(
      "\ncomparison (best setting and recompute mode per cell, mean over %d mini-batches; "
      "fastest first):\n",
      totals.planned);
  std::printf("  %-20s %-20s %9s %22s\n", "method", "schedule", "padding",
              "real tokens/s predicted");
  std::printf("  %-41s %8.1f%% %22.0f\n", "the plan (chosen per mini-batch)",
              100 * totals.chosen_padding / totals.planned,
              totals.chosen_throughput / totals.planned);
  std::vector<std::pair<double, std::pair<std::string, std::string>>> feasible;
  for (const auto& [key, t] : totals.throughput) {
    // A cell that did not fit some mini-batch is infeasible: a user cannot
    // run it.
    if (!totals.infeasible.count(key)) feasible.emplace_back(t.first / t.second, key);
  }
  std::sort(feasible.begin(), feasible.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (const auto& [throughput, key] : feasible) {
    std::printf("  %-20s %-20s %8.1f%% %22.0f\n", key.first.c_str(), key.second.c_str(),
                100 * totals.padding.at(key) / totals.throughput.at(key).second, throughput);
  }
  for (const auto& [key, reason] : totals.infeasible) {
    std::printf("  %-20s %-20s %9s %22s  %s\n", key.first.c_str(), key.second.c_str(), "-",
                "infeasible", reason.c_str());
  }
}

// --search_parallelism: the layouts, fastest first, then the refused ones
// with their reasons. Fails when none fits.
int SearchParallelism(const Job& job, MiniBatchSource& source) {
  const v1::ParallelismConfig& p = job.config.parallelism();
  const int gpus = absl::GetFlag(FLAGS_gpus) > 0
                       ? absl::GetFlag(FLAGS_gpus)
                       : static_cast<int>(p.pipeline() * p.data() * std::max(1u, p.tensor()) *
                                          std::max(1u, p.context()));
  if (absl::GetFlag(FLAGS_gpus_per_node) < 0) {
    return Fail(absl::InvalidArgumentError("--gpus_per_node must not be negative"), kExitUsage);
  }
  std::vector<planner::MiniBatch> sample;
  const int64_t first = absl::GetFlag(FLAGS_first_iteration);
  for (int k = 0; k < absl::GetFlag(FLAGS_iterations); ++k) {
    sample.push_back(source.Next(static_cast<uint64_t>(first + k)));
  }
  planner::ParallelismSearchOptions options;
  options.gpus = static_cast<uint32_t>(gpus);
  options.context_degrees.clear();
  for (absl::string_view word :
       absl::StrSplit(absl::GetFlag(FLAGS_context_degrees), ',', absl::SkipWhitespace())) {
    uint32_t degree = 0;
    if (!absl::SimpleAtoi(word, &degree) || degree == 0) {
      return Fail(absl::InvalidArgumentError(
                      absl::StrCat("--context_degrees: '", word, "' is not a positive integer")),
                  kExitUsage);
    }
    options.context_degrees.push_back(degree);
  }
  if (options.context_degrees.empty()) options.context_degrees.push_back(1);
  options.gpus_per_node = static_cast<uint32_t>(absl::GetFlag(FLAGS_gpus_per_node));
  options.progress = [](const planner::ParallelismCandidate& c) {
    spdlog::info("{}: {}", c.layout.ToString(),
                 c.feasible ? absl::StrFormat("%.0f real tokens/s", c.tokens_per_second)
                            : "refused: " + c.reason);
  };
  spdlog::info("searching the layouts of {} GPUs ({} mini-batches each)", gpus, sample.size());
  absl::StatusOr<std::vector<planner::ParallelismCandidate>> found =
      planner::SearchParallelism(job.config, sample, options);
  if (!found.ok()) return Fail(found.status(), kExitUsage);
  std::printf("layouts of %d GPUs for %s (%s), mean over %zu mini-batches; fastest first:\n", gpus,
              job.config.job_id().c_str(), job.config_path.c_str(), sample.size());
  std::printf("  %-6s %-7s %-8s %-6s %16s %14s %8s %15s  %s\n", "tensor", "context", "pipeline",
              "data", "real tokens/s", "iteration ms", "bubble", "act. peak GiB",
              "schedule, recompute");
  int feasible = 0;
  for (const planner::ParallelismCandidate& c : *found) {
    if (!c.feasible) continue;
    ++feasible;
    // Context > 1: the per-micro-batch choice's split count, and static
    // context parallelism on the same layout.
    std::string context;
    if (c.layout.context > 1) {
      context = absl::StrFormat(
          "; %d of %d micro-batches split; static (every one split): %s", c.split_micro_batches,
          c.micro_batches,
          c.static_feasible ? absl::StrFormat("%.0f real tokens/s", c.static_tokens_per_second)
                            : "refused: " + c.static_reason);
    }
    std::printf("  %-6u %-7u %-8u %-6u %16.0f %14.1f %7.1f%% %15.2f  %s, %s%s\n", c.layout.tensor,
                c.layout.context, c.layout.pipeline, c.layout.data, c.tokens_per_second,
                c.iteration_ms, 100 * c.bubble_fraction, c.peak_activation_bytes / (1 << 30),
                c.schedule.c_str(), c.recompute.c_str(), context.c_str());
  }
  std::printf("refused:\n");
  for (const planner::ParallelismCandidate& c : *found) {
    if (c.feasible) continue;
    std::printf("  %-6u %-7u %-8u %-6u  %s\n", c.layout.tensor, c.layout.context, c.layout.pipeline,
                c.layout.data, c.reason.c_str());
  }
  if (feasible == 0) {
    return Fail(absl::ResourceExhaustedError(
                    absl::StrCat("no layout of ", gpus, " GPUs fits this job (reasons above)")),
                kExitFailure);
  }
  return kExitOk;
}

// --model_from_hf: {"model": {...}} with the config's field names.
int PrintModelFromHuggingFace(const std::string& path) {
  absl::StatusOr<v1::ModelConfig> model = ModelConfigFromHuggingFace(path);
  if (!model.ok()) return Fail(model.status(), kExitUsage);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(*model, &json, options).ok()) {
    return Fail(absl::InternalError("cannot print the model section"), kExitFailure);
  }
  // A JSON object holding the section, to paste into a job config.
  std::printf("{\"model\": %s}\n", json.c_str());
  return kExitOk;
}

int Run() {
  if (const std::string hf = absl::GetFlag(FLAGS_model_from_hf); !hf.empty()) {
    return PrintModelFromHuggingFace(hf);
  }
  Job job;
  if (std::optional<int> code = LoadJob(job)) return *code;
  const auto build_start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::Planner> planner = planner::Planner::Create(job.config);
  if (!planner.ok()) return Fail(planner.status(), kExitUsage);
  if (absl::GetFlag(FLAGS_ideal_context_split)) {
    if (job.config.parallelism().context() < 2 || absl::GetFlag(FLAGS_search_parallelism)) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat(
              "--ideal_context_split prices the config's own layout, which needs "
              "parallelism.context of at least 2 (it is ",
              std::max(1u, job.config.parallelism().context()), ") and no --search_parallelism")),
          kExitUsage);
    }
    planner::PlannerOptions options = planner->options();
    options.ideal_context_split = true;
    *planner = planner::Planner(job.config, planner->cost_model(), options);
    spdlog::warn(
        "--ideal_context_split: split micro-batches priced at 1/c of one device's "
        "time with no transfers (a what-if; these plans are not for training)");
  }
  absl::StatusOr<MiniBatchSource> source = MiniBatchSource::Create(job.config, job.samples);
  if (!source.ok()) return Fail(source.status(), kExitUsage);
  if (absl::GetFlag(FLAGS_search_parallelism)) return SearchParallelism(job, *source);
  if (absl::GetFlag(FLAGS_auto_layout) ||
      EffectiveLayoutMode(job.config.parallelism().stage_layout()) == v1::AUTO) {
    // As the daemons choose it: over the job's first mini-batches.
    std::vector<planner::MiniBatch> sample;
    for (uint64_t i = 0; i < planner::kLayoutSampleMiniBatches; ++i)
      sample.push_back(source->Next(i));
    absl::StatusOr<planner::LayoutChoice> choice = planner::ChooseStageLayout(*planner, sample);
    if (!choice.ok()) return Fail(choice.status(), kExitFailure);
    for (absl::string_view line : absl::StrSplit(choice->Describe(), '\n')) {
      spdlog::info("{}", line);
    }
    *planner = planner->WithStageLayout(choice->chosen);
    *job.config.mutable_parallelism()->mutable_stage_layout() = LayerLayoutToConfig(choice->chosen);
  }
  std::vector<Comparer> comparers;
  std::vector<ContextComparer> context_comparers;
  if (absl::GetFlag(FLAGS_compare)) {
    comparers = MakeComparers(job.config, *planner);
    context_comparers = MakeContextComparers(job.config, *planner);
  }
  spdlog::info(
      "cost model: {} ({:.1f} ms to build)", planner->cost_model().description(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start)
          .count());
  ShutdownSignal shutdown;
  if (!absl::GetFlag(FLAGS_json)) PrintHeader(job);
  Totals totals;
  std::string trace_path = absl::GetFlag(FLAGS_trace);
  const int64_t first = absl::GetFlag(FLAGS_first_iteration);
  for (int k = 0; k < absl::GetFlag(FLAGS_iterations) && !shutdown.Requested(); ++k) {
    const planner::MiniBatch mb = source->Next(static_cast<uint64_t>(first + k));
    if (std::optional<int> code =
            PlanOne(*planner, comparers, context_comparers, mb, trace_path, totals)) {
      return *code;
    }
  }
  if (totals.planned == 0) return kExitFailure;
  if (!absl::GetFlag(FLAGS_json)) {
    PrintSummary(totals);
    PrintContextComparison(context_comparers, job.config.parallelism().context());
  }
  if (shutdown.Requested()) spdlog::info("stopped after {} mini-batches", totals.planned);
  return kExitOk;
}

}  // namespace
}  // namespace varipipe

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-plan", varipipe::kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-plan: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  return varipipe::Run();
}
