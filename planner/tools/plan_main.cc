// varipipe-plan: plans mini-batches of a job offline and prints what the
// planner would do with them.
//
// It draws mini-batches from the synthetic FLAN-like stream and splits each
// into micro-batches with every partition method (the dynamic program and
// the baselines), choosing the recompute mode and memory budget per method,
// and prints micro-batch counts, padding efficiency and the predicted
// iteration time (DynaPipe Eq. 1 under the job's cost model). Schedules and
// execution plans join it with the planner core's next part
// (docs/architecture.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "common/shutdown_signal.h"
#include "planner/cost/cost_model_io.h"
#include "planner/microbatch/micro_batching.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(int, iterations, 3, "Number of mini-batches (iterations) to plan.");
ABSL_FLAG(int64_t, first_iteration, 0, "Iteration of the first mini-batch to plan.");

namespace varipipe {
namespace {

constexpr char kUsage[] =
    "Plans mini-batches of a training job offline and prints a summary.\n"
    "\n"
    "Usage: varipipe-plan --config job.json [--iterations N] [--first_iteration I]\n"
    "\n"
    "Mini-batches are drawn from the job's synthetic FLAN-like dataset\n"
    "(data.format SYNTHETIC): consecutive samples, truncated to the maximum\n"
    "lengths, until data.tokens_per_global_batch is reached. Each is split into\n"
    "micro-batches by every partition method (planner.partition_methods first,\n"
    "then the others for comparison), with the recompute mode and memory budget\n"
    "chosen per method; the table shows micro-batches, padding efficiency (real /\n"
    "computed tokens) and the predicted iteration time under the job's cost model\n"
    "(planner.cost_model_path, or the analytic model of cluster.hardware).\n"
    "--log_level=debug prints why each recompute mode and budget was chosen.";

// Truncates a sample to the job's maximum lengths. Decoder-only models keep
// the target and cut the input.
SampleLengths Truncate(SampleLengths s, const v1::JobConfig& config) {
  const v1::DataConfig& data = config.data();
  if (config.model().kind() == v1::T5) {
    return {std::min(s.input, data.max_sequence_length()),
            std::min(s.target, data.max_target_length())};
  }
  const uint32_t target = std::min(s.target, data.max_sequence_length());
  return {std::min(s.input, data.max_sequence_length() - target), target};
}

uint64_t Tokens(const SampleLengths& s) { return uint64_t{s.input} + s.target; }

// One mini-batch of consecutive synthetic samples starting at *cursor.
std::vector<SampleLengths> DrawMiniBatch(const SyntheticMixture& mixture,
                                         const v1::JobConfig& config, uint64_t* cursor) {
  std::vector<SampleLengths> batch;
  uint64_t tokens = 0;
  const uint64_t budget = config.data().tokens_per_global_batch();
  const uint64_t dataset_size = config.data().synthetic_num_samples();
  while (true) {
    const SampleLengths s = Truncate(mixture.Sample(*cursor % dataset_size), config);
    if (tokens + Tokens(s) > budget) break;
    tokens += Tokens(s);
    batch.push_back(s);
    ++*cursor;
  }
  return batch;
}

std::string BudgetShort(planner::MemoryBudget budget) {
  return budget == planner::MemoryBudget::kWholeDevice ? "whole-device" : "pipeline-depth";
}

struct MethodTotals {
  double predicted_ms = 0;
  double efficiency = 0;
  double plan_ms = 0;
  int planned = 0;
};

int Run() {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) {
    std::fprintf(stderr, "varipipe-plan: --config is required (try --help)\n");
    return kExitUsage;
  }
  const int iterations = absl::GetFlag(FLAGS_iterations);
  if (iterations < 1) {
    std::fprintf(stderr, "varipipe-plan: --iterations must be at least 1 (got %d)\n", iterations);
    return kExitUsage;
  }
  const int64_t first_iteration = absl::GetFlag(FLAGS_first_iteration);
  if (first_iteration < 0) {
    std::fprintf(stderr, "varipipe-plan: --first_iteration must not be negative\n");
    return kExitUsage;
  }
  absl::StatusOr<v1::JobConfig> loaded = LoadJobConfigFile(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "varipipe-plan: %s\n", std::string(loaded.status().message()).c_str());
    return kExitUsage;
  }
  const v1::JobConfig& config = *loaded;
  if (config.data().format() != v1::SYNTHETIC) {
    std::fprintf(stderr,
                 "varipipe-plan: %s: data.format %s is not supported by this version "
                 "(only SYNTHETIC)\n",
                 config_path.c_str(), v1::DatasetFormat_Name(config.data().format()).c_str());
    return kExitUsage;
  }
  const auto model_start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::CostModel> cost_model = planner::CostModelForJob(config);
  if (!cost_model.ok()) {
    std::fprintf(stderr, "varipipe-plan: %s: %s\n", config_path.c_str(),
                 std::string(cost_model.status().message()).c_str());
    return kExitUsage;
  }
  spdlog::info(
      "cost model: {} ({:.1f} ms to build)", cost_model->description(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - model_start)
          .count());

  ShutdownSignal shutdown;
  const SyntheticMixture mixture = SyntheticMixture::Flan(config.data().seed());
  const v1::ModelConfig& model = config.model();
  std::printf(
      "job %s: %s, %u layers, hidden %u; pp=%u dp=%u; synthetic FLAN-like data "
      "(seed %llu); %llu tokens per global batch, max length %u\n",
      config.job_id().c_str(), v1::ModelKind_Name(model.kind()).c_str(),
      model.num_layers() + model.num_decoder_layers(), model.hidden_size(),
      config.parallelism().pipeline(), config.parallelism().data(),
      static_cast<unsigned long long>(config.data().seed()),
      static_cast<unsigned long long>(config.data().tokens_per_global_batch()),
      config.data().max_sequence_length());

  // The configured methods first, then the remaining ones for comparison.
  std::vector<planner::PartitionMethod> methods;
  for (int m : config.planner().partition_methods()) {
    methods.push_back(planner::PartitionMethodFromProto(static_cast<v1::PartitionMethod>(m)));
  }
  for (planner::PartitionMethod m :
       {planner::PartitionMethod::kDynamicProgramming, planner::PartitionMethod::kTokenBased,
        planner::PartitionMethod::kFixedSize, planner::PartitionMethod::kPacking,
        planner::PartitionMethod::kPadding}) {
    if (std::find(methods.begin(), methods.end(), m) == methods.end()) methods.push_back(m);
  }
  std::printf("%-5s %-20s %7s %11s %5s %8s %12s %-26s %8s\n", "iter", "method", "samples",
              "real_tokens", "mbs", "padding", "pred_iter_ms", "recompute/budget", "plan_ms");

  // Walk the stream to the first requested iteration.
  uint64_t cursor = 0;
  for (int64_t i = 0; i < first_iteration; ++i) DrawMiniBatch(mixture, config, &cursor);

  std::vector<MethodTotals> totals(methods.size());
  int planned = 0;
  for (int i = 0; i < iterations && !shutdown.Requested(); ++i) {
    const std::vector<SampleLengths> batch = DrawMiniBatch(mixture, config, &cursor);
    uint64_t real = 0;
    for (const SampleLengths& s : batch) real += Tokens(s);
    for (size_t m = 0; m < methods.size(); ++m) {
      const planner::MicroBatchingOptions options =
          planner::MicroBatchingOptionsFromConfig(config, methods[m]);
      absl::StatusOr<planner::MicroBatchingResult> r =
          planner::PlanMicroBatches(batch, *cost_model, options);
      const std::string prefix =
          absl::StrFormat("%-5s %-20s %7d %11d", m == 0 ? absl::StrCat(first_iteration + i) : "",
                          planner::PartitionMethodName(methods[m]), batch.size(), real);
      if (!r.ok()) {
        std::printf("%s infeasible: %s\n", prefix.c_str(),
                    std::string(r.status().message()).c_str());
        continue;
      }
      const planner::MicroBatchingCandidate& best = r->best();
      std::printf(
          "%s %5zu %7.1f%% %12.1f %-26s %8.3f\n", prefix.c_str(), best.groups.size(),
          100 * r->padding.Efficiency(), best.objective_ms,
          absl::StrCat(planner::RecomputeName(best.recompute), "/", BudgetShort(best.budget))
              .c_str(),
          r->total_ms);
      spdlog::debug("iteration {} {}: {}", first_iteration + i,
                    planner::PartitionMethodName(methods[m]), r->reason);
      totals[m].predicted_ms += best.objective_ms;
      totals[m].efficiency += r->padding.Efficiency();
      totals[m].plan_ms += r->total_ms;
      ++totals[m].planned;
    }
    ++planned;
  }
  if (planned == 0) return kExitFailure;
  std::printf("summary: %d mini-batches\n", planned);
  const double reference = totals[0].planned > 0 ? totals[0].predicted_ms / totals[0].planned : 0;
  for (size_t m = 0; m < methods.size(); ++m) {
    const MethodTotals& t = totals[m];
    if (t.planned == 0) {
      std::printf("  %-20s infeasible for every mini-batch\n",
                  planner::PartitionMethodName(methods[m]));
      continue;
    }
    const double predicted = t.predicted_ms / t.planned;
    std::printf(
        "  %-20s mean predicted iteration %9.1f ms (%5.2fx of %s), padding efficiency "
        "%5.1f%%, planning %.3f ms\n",
        planner::PartitionMethodName(methods[m]), predicted,
        reference > 0 ? predicted / reference : 0, planner::PartitionMethodName(methods[0]),
        100 * t.efficiency / t.planned, t.plan_ms / t.planned);
  }
  if (shutdown.Requested()) {
    spdlog::info("stopped after {} of {} mini-batches", planned, iterations);
  }
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
