// varipipe-evaluate: the evaluation in simulation (deploy/evaluate.sh,
// docs/evaluation.md). Plans mini-batches of a synthetic mixture with the
// project's planner and simulator and prints CSV on standard output, one
// experiment per run:
//   throughput  the planner's default search ("varipipe") and every
//               partition method alone at every maximum length (and memory
//               limit); baselines tuned as a user would (planner/tools/
//               baseline_tuning.h), one row per setting tried;
//   planning    the config's search: planning time and predicted time per
//               mini-batch;
//   schedules   adaptive schedule vs 1F1B as micro-batch times spread;
//   trace       one iteration's simulated timeline (Chrome trace file).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/status.h"
#include "planner/planner.h"
#include "planner/schedule/static_schedules.h"
#include "planner/sim/order_search.h"
#include "planner/sim/simulator.h"
#include "planner/tools/baseline_tuning.h"

ABSL_FLAG(std::string, experiment, "throughput",
          "throughput, planning, schedules or trace (see --help).");
ABSL_FLAG(std::string, config, "",
          "Job config (JSON): model, parallelism, cluster and global batch tokens. Its data "
          "section is replaced by the synthetic --mixture.");
ABSL_FLAG(std::string, mixture, "flan",
          "Synthetic length mixture: flan, documents or long_tail (docs/datasets.md).");
ABSL_FLAG(std::string, max_lengths, "512,1024,2048,4096,8192",
          "Maximum sequence lengths (comma-separated). T5 targets: a quarter of each.");
ABSL_FLAG(std::string, memory_mib, "",
          "Device memory limits in MiB (comma-separated); default: the config's.");
ABSL_FLAG(int, mini_batches, 8, "Mini-batches (iterations 0..N-1) per setting.");
ABSL_FLAG(std::string, cost_model, "",
          "Cost model file (JSON or DynaPipe profile directory); default: the analytic model of "
          "cluster.hardware.");
ABSL_FLAG(std::string, trace, "", "trace: write the Chrome trace of iteration 0 here.");
ABSL_FLAG(int, trials, 20, "schedules: random draws per spread.");

namespace varipipe {
namespace {

constexpr char kUsage[] =
    "Evaluates the planner in simulation and prints CSV (deploy/evaluate.sh drives it).\n"
    "\n"
    "Usage: varipipe-evaluate --experiment throughput|planning|trace --config job.json\n"
    "                         [--mixture flan|documents|long_tail] [--max_lengths 512,...]\n"
    "                         [--memory_mib 40960,...] [--mini_batches N] [--cost_model F]\n"
    "       varipipe-evaluate --experiment schedules [--trials N]\n"
    "\n"
    "throughput: for each maximum length (and memory limit) plans N mini-batches of the\n"
    "mixture with the planner's default search (method `varipipe`: every method, each\n"
    "baseline's setting tuned per mini-batch, every schedule), with the DP alone and\n"
    "with each baseline alone, every baseline tuned once per run as a user would\n"
    "(packing, fixed-size and padding: rows per micro-batch x recompute mode;\n"
    "token-based: token budget x recompute mode), each for the best predicted real\n"
    "tokens/s over the N mini-batches among the settings that fit memory on all of\n"
    "them. One row per setting tried; `chosen` marks each method's tuned setting.\n"
    "planning: the config's search (by default everything): planning time (one thread)\n"
    "and predicted iteration per mini-batch.\n"
    "schedules: synthetic pipelines (pp=4, 16 micro-batches) whose micro-batch times have\n"
    "a growing coefficient of variation: adaptive schedule vs 1F1B, same memory.\n"
    "trace: the DP's plan of iteration 0 at the first maximum length, its simulated\n"
    "timeline written as a Chrome trace (--trace).";

absl::StatusOr<std::vector<uint64_t>> ParseList(const std::string& text, const char* flag) {
  std::vector<uint64_t> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a positive integer"));
    }
    values.push_back(v);
  }
  return values;
}

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "varipipe-evaluate: %s\n", std::string(status.message()).c_str());
  return code;
}

std::string Quoted(std::string text) {
  for (char& c : text) {
    if (c == '"' || c == '\n') c = '\'';
  }
  return absl::StrCat("\"", text, "\"");
}

// --- throughput and planning -------------------------------------------------

int Throughput(const tools::EvaluationJob& base, bool per_iteration) {
  absl::StatusOr<std::vector<uint64_t>> lengths =
      ParseList(absl::GetFlag(FLAGS_max_lengths), "max_lengths");
  if (!lengths.ok()) return Fail(lengths.status(), kExitUsage);
  std::vector<uint64_t> memories;
  if (!absl::GetFlag(FLAGS_memory_mib).empty()) {
    absl::StatusOr<std::vector<uint64_t>> parsed =
        ParseList(absl::GetFlag(FLAGS_memory_mib), "memory_mib");
    if (!parsed.ok()) return Fail(parsed.status(), kExitUsage);
    memories = *parsed;
  } else {
    memories.push_back(base.config.cluster().device_memory_limit_mib());
  }
  const int n = absl::GetFlag(FLAGS_mini_batches);
  if (per_iteration) {
    std::printf(
        "model,mixture,cost_model,max_len,memory_mib,iteration,samples,planning_ms,"
        "predicted_iteration_ms,micro_batches,schedule,recompute\n");
  } else {
    std::printf(
        "model,mixture,cost_model,max_len,memory_mib,method,setting,recompute,feasible,chosen,"
        "tokens_per_s,padding_efficiency,micro_batches,predicted_iteration_ms,reason\n");
  }
  for (uint64_t memory : memories) {
    for (uint64_t length : *lengths) {
      absl::StatusOr<tools::EvaluationJob> job =
          tools::WithLimits(base, static_cast<uint32_t>(length), memory);
      if (!job.ok()) return Fail(job.status(), kExitUsage);
      const std::vector<planner::MiniBatch> batches = tools::MiniBatches(*job, n);
      const std::string prefix =
          absl::StrCat(job->model_name, ",", job->mixture_name, ",", Quoted(job->cost_model_name),
                       ",", length, ",", memory, ",");
      if (per_iteration) {
        for (const tools::IterationOutcome& it : tools::PlanEach(*job, batches)) {
          std::printf("%s%llu,%d,%.3f,%.3f,%d,%s,%s\n", prefix.c_str(),
                      static_cast<unsigned long long>(it.iteration), it.samples, it.planning_ms,
                      it.predicted_ms, it.micro_batches, it.schedule.c_str(), it.recompute.c_str());
        }
        std::fflush(stdout);
        continue;
      }
      for (const tools::MethodResult& method : tools::TuneAllMethods(*job, batches)) {
        for (size_t k = 0; k < method.trials.size(); ++k) {
          const tools::TrialOutcome& t = method.trials[k];
          std::printf(
              "%s%s,%s,%s,%d,%d,%.1f,%.4f,%.2f,%.2f,%s\n", prefix.c_str(), method.method.c_str(),
              t.setting.Describe().c_str(), t.setting.RecomputeName().c_str(), t.feasible ? 1 : 0,
              static_cast<int>(k) == method.chosen ? 1 : 0, t.tokens_per_s, t.padding_efficiency,
              t.micro_batches, t.predicted_ms, Quoted(t.reason).c_str());
        }
      }
      std::fflush(stdout);
    }
  }
  return kExitOk;
}

int Trace(const tools::EvaluationJob& base) {
  absl::StatusOr<std::vector<uint64_t>> lengths =
      ParseList(absl::GetFlag(FLAGS_max_lengths), "max_lengths");
  if (!lengths.ok() || lengths->empty()) {
    return Fail(
        lengths.ok() ? absl::InvalidArgumentError("--max_lengths is empty") : lengths.status(),
        kExitUsage);
  }
  const std::string path = absl::GetFlag(FLAGS_trace);
  if (path.empty()) return Fail(absl::InvalidArgumentError("--trace is required"), kExitUsage);
  absl::StatusOr<tools::EvaluationJob> job =
      tools::WithLimits(base, static_cast<uint32_t>(lengths->front()),
                        base.config.cluster().device_memory_limit_mib());
  if (!job.ok()) return Fail(job.status(), kExitUsage);
  const std::vector<planner::MiniBatch> batches = tools::MiniBatches(*job, 1);
  planner::Planner planner(job->config, job->cost_model, {.threads = 1});
  absl::StatusOr<planner::PlanningResult> result = planner.Plan(batches.front(), true);
  if (!result.ok()) return Fail(result.status(), kExitFailure);
  std::ofstream out(path);
  out << result->report.chrome_trace;
  if (!out) return Fail(ErrnoToStatus(errno, absl::StrCat("write ", path)), kExitFailure);
  const planner::PlanReport& r = result->report;
  std::printf(
      "model,mixture,cost_model,max_len,memory_mib,schedule,recompute,micro_batches,"
      "predicted_iteration_ms,bubble_fraction\n");
  std::printf("%s,%s,%s,%llu,%llu,%s,%s,%d,%.2f,%.4f\n", job->model_name.c_str(),
              job->mixture_name.c_str(), Quoted(job->cost_model_name).c_str(),
              static_cast<unsigned long long>(lengths->front()),
              static_cast<unsigned long long>(job->config.cluster().device_memory_limit_mib()),
              r.schedule.c_str(), r.recompute.c_str(), r.micro_batches, r.predicted_iteration_ms,
              r.bubble_fraction);
  return kExitOk;
}

// --- schedules -------------------------------------------------------------

// One synthetic pipeline: pp devices, m micro-batches whose forward times
// are lognormal with coefficient of variation `cv` (mean 10 ms), backward
// twice the forward, stored activation proportional to the time.
planner::StageCostTable SyntheticCosts(uint32_t pp, uint32_t m, double cv, std::mt19937_64& rng,
                                       std::vector<double>& times) {
  const double sigma = std::sqrt(std::log(1 + cv * cv));
  std::normal_distribution<double> normal(0, 1);
  times.assign(m, 0);
  for (uint32_t j = 0; j < m; ++j) {
    times[j] = 10.0 * std::exp(sigma * normal(rng) - sigma * sigma / 2);
  }
  planner::StageCostTable costs(pp, std::vector<planner::StageOpCost>(m));
  for (uint32_t s = 0; s < pp; ++s) {
    for (uint32_t j = 0; j < m; ++j) {
      planner::StageOpCost& c = costs[s][j];
      c.forward_ms = times[j];
      c.backward_ms = 2 * times[j];
      c.stored_bytes = times[j] * (1 << 20);
      c.peak_bytes = c.stored_bytes * 1.1;
      c.activation_bytes = times[j] * (1 << 16);
      c.gradient_bytes = c.activation_bytes;
    }
  }
  for (double& t : times) t *= 3;  // forward + backward per stage
  return costs;
}

int Schedules() {
  constexpr uint32_t kDevices = 4;
  constexpr uint32_t kMicroBatches = 16;
  const planner::PipelineShape shape{
      .devices = kDevices, .chunks = 1, .micro_batches = kMicroBatches};
  planner::ClusterNetwork network;
  network.intra_node = {.latency_ms = 0.01, .bytes_per_ms = 150e6};
  network.inter_node = network.intra_node;
  absl::StatusOr<planner::DeviceOrder> one_f_one_b = planner::OneFOneBSchedule(shape);
  if (!one_f_one_b.ok()) return Fail(one_f_one_b.status(), kExitFailure);
  std::printf(
      "cv,trial,measured_cv,one_f_one_b_ms,adaptive_ms,lower_bound_ms,"
      "one_f_one_b_peak_mib,adaptive_peak_mib\n");
  std::mt19937_64 rng(20240601);
  for (int step = 0; step <= 10; ++step) {
    const double cv = 0.1 * step;
    for (int trial = 0; trial < absl::GetFlag(FLAGS_trials); ++trial) {
      std::vector<double> times;
      const planner::StageCostTable costs = SyntheticCosts(kDevices, kMicroBatches, cv, rng, times);
      const planner::SimulationResult base = planner::Simulate(shape, *one_f_one_b, costs, network);
      // The adaptive schedule gets the memory 1F1B used on each device.
      absl::StatusOr<planner::AdaptiveSearchResult> adaptive = planner::SearchAdaptiveOrder(
          shape, costs, times, std::span<const double>(base.peak_bytes), network);
      if (!adaptive.ok()) return Fail(adaptive.status(), kExitFailure);
      double mean = 0;
      for (double t : times) mean += t / times.size();
      double var = 0;
      for (double t : times) var += (t - mean) * (t - mean) / times.size();
      // No schedule beats one device's work plus the pipeline's fill and
      // drain by the smallest micro-batch.
      const double smallest = *std::min_element(times.begin(), times.end());
      const double bound = mean * times.size() + (kDevices - 1) * smallest;
      std::printf("%.1f,%d,%.4f,%.3f,%.3f,%.3f,%.2f,%.2f\n", cv, trial, std::sqrt(var) / mean,
                  base.makespan_ms, adaptive->simulation.makespan_ms, bound,
                  base.MaxPeakBytes() / (1 << 20), adaptive->simulation.MaxPeakBytes() / (1 << 20));
    }
  }
  return kExitOk;
}

int Run() {
  const std::string experiment = absl::GetFlag(FLAGS_experiment);
  if (absl::GetFlag(FLAGS_mini_batches) < 1) {
    return Fail(absl::InvalidArgumentError("--mini_batches must be at least 1"), kExitUsage);
  }
  if (experiment == "schedules") return Schedules();
  if (experiment != "throughput" && experiment != "planning" && experiment != "trace") {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--experiment: unknown '", experiment,
                                                "' (throughput, planning, schedules or trace)")),
        kExitUsage);
  }
  if (absl::GetFlag(FLAGS_config).empty()) {
    return Fail(absl::InvalidArgumentError("--config is required (try --help)"), kExitUsage);
  }
  absl::StatusOr<tools::EvaluationJob> job = tools::LoadEvaluationJob(
      absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_mixture), absl::GetFlag(FLAGS_cost_model));
  if (!job.ok()) return Fail(job.status(), kExitUsage);
  if (experiment == "trace") return Trace(*job);
  return Throughput(*job, experiment == "planning");
}

}  // namespace
}  // namespace varipipe

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-evaluate", varipipe::kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-evaluate: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  return varipipe::Run();
}
