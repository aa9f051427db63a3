// varipipe-plan: plans mini-batches of a job offline and prints what the
// planner would do with them.
//
// This first version draws mini-batches from the synthetic FLAN-like stream
// and compares the baseline partition methods (padding, fixed size over
// sorted lengths, token budget over sorted lengths) by padding efficiency.
// The dynamic program, schedules and execution plans join it as the planner
// core grows (docs/architecture.md).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "common/shutdown_signal.h"
#include "planner/microbatch/baselines.h"
#include "planner/microbatch/padding_stats.h"
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
    "lengths, until data.tokens_per_global_batch is reached. For each one the\n"
    "baseline partition methods are compared by padding efficiency (real tokens\n"
    "/ computed tokens).";

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

struct MethodResult {
  const char* name;
  std::vector<planner::MicroBatchGroup> groups;
  planner::PaddingStats stats;
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

  ShutdownSignal shutdown;
  const SyntheticMixture mixture = SyntheticMixture::Flan(config.data().seed());
  const planner::LengthPolicy policy{.encoder_decoder = config.model().kind() == v1::T5,
                                     .multiple = config.planner().length_multiple()};
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
  std::printf("%-5s %7s %11s | %-22s | %-22s | %-22s\n", "iter", "samples", "real_tokens",
              "padding: mbs  eff", "fixed_size: mbs  eff", "token_based: mbs  eff");

  // Walk the stream to the first requested iteration.
  uint64_t cursor = 0;
  for (int64_t i = 0; i < first_iteration; ++i) DrawMiniBatch(mixture, config, &cursor);

  std::vector<double> efficiency_sum(3, 0.0);
  double planning_ms = 0;
  int planned = 0;
  for (int i = 0; i < iterations && !shutdown.Requested(); ++i) {
    const std::vector<SampleLengths> batch = DrawMiniBatch(mixture, config, &cursor);
    const auto start = std::chrono::steady_clock::now();
    std::vector<MethodResult> results;
    results.push_back(
        {"padding",
         planner::PartitionPadding(batch, policy, config.planner().fixed_micro_batch_size()),
         {}});
    results.push_back(
        {"fixed_size",
         planner::PartitionFixedSize(batch, policy, config.planner().fixed_micro_batch_size()),
         {}});
    results.push_back(
        {"token_based",
         planner::PartitionTokenBased(batch, policy, config.planner().micro_batch_token_budget()),
         {}});
    for (MethodResult& r : results) r.stats = planner::ComputePaddingStats(batch, r.groups, policy);
    planning_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    uint64_t real = 0;
    for (const SampleLengths& s : batch) real += Tokens(s);
    std::string row = absl::StrFormat("%-5d %7d %11d", first_iteration + i, batch.size(), real);
    for (size_t m = 0; m < results.size(); ++m) {
      efficiency_sum[m] += results[m].stats.Efficiency();
      row += absl::StrFormat(" | %14d %6.1f%%", results[m].groups.size(),
                             100 * results[m].stats.Efficiency());
    }
    std::printf("%s\n", row.c_str());
    ++planned;
  }
  if (planned == 0) return kExitFailure;
  std::printf(
      "summary: %d mini-batches; mean padding efficiency: padding %.1f%%, fixed_size %.1f%%, "
      "token_based %.1f%%; grouping time %.3f ms per mini-batch\n",
      planned, 100 * efficiency_sum[0] / planned, 100 * efficiency_sum[1] / planned,
      100 * efficiency_sum[2] / planned, planning_ms / planned);
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
