#include "executor/runtime/executor_metrics.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metric_registry.h"
#include "spdlog/spdlog.h"

namespace varipipe::executor {
namespace {

metrics::Registry& R() { return metrics::Registry::Default(); }

absl::Mutex labels_mu;
metrics::Labels& RankLabels() {
  static auto* labels =
      new metrics::Labels{{"job", ""}, {"rank", "0"}, {"dp_rank", "0"}, {"pp_rank", "0"}};
  return *labels;
}

metrics::Labels Labels() {
  absl::MutexLock lock(&labels_mu);
  return RankLabels();
}

// Steps take milliseconds (tiny CPU jobs) to minutes.
const std::vector<double>& StepBuckets() {
  static const auto* b = new std::vector<double>(metrics::ExponentialBuckets(0.001, 2, 18));
  return *b;
}

// Every series of the executor, so they all exist from the first scrape on.
void Register(const metrics::Labels& l) {
  R().GetCounter("varipipe_executor_iterations_total", "Iterations this rank completed.", l);
  R().GetGauge("varipipe_executor_iteration", "The last iteration this rank completed.", l);
  R().GetHistogram("varipipe_executor_step_duration_seconds",
                   "Wall time of one iteration on this rank (plan run and reduction).",
                   StepBuckets(), l);
  R().GetCounter("varipipe_executor_compute_seconds_total",
                 "Time in forward, backward and optimizer compute.", l);
  R().GetCounter("varipipe_executor_wait_seconds_total",
                 "Time waiting for transfers and all-reduce.", l);
  R().GetCounter("varipipe_executor_data_seconds_total",
                 "Time reading samples and lengths from the dataset.", l);
  R().GetCounter("varipipe_executor_real_tokens_total",
                 "Real (unpadded) input and target tokens of the job's iterations, all replicas.",
                 l);
  R().GetCounter("varipipe_executor_padded_tokens_total",
                 "Tokens computed (padding included) in the job's iterations, all replicas.", l);
  R().GetGauge("varipipe_executor_padding_efficiency_ratio",
               "Real over computed tokens of the last iteration.", l);
  R().GetGauge("varipipe_executor_real_tokens_per_second",
               "Real tokens per second of the last iteration, all replicas.", l);
  R().GetGauge("varipipe_executor_loss", "Training loss of the last iteration (job mean).", l);
  R().GetGauge("varipipe_executor_iteration_seconds",
               "Measured wall time of the last iteration on this rank.", l);
  R().GetGauge("varipipe_executor_predicted_iteration_seconds",
               "The planner's predicted time of the last iteration.", l);
  R().GetGauge("varipipe_executor_peak_memory_bytes",
               "Highest device memory allocated since start (CPU: tensor bytes).", l);
  R().GetGauge("varipipe_executor_peak_reserved_bytes",
               "Highest device memory the caching allocator reserved since start (allocated "
               "plus held for reuse; CPU: as peak_memory_bytes).",
               l);
  R().GetGauge("varipipe_executor_host_reads",
               "Times the host waited for the device in the last iteration.", l);
  R().GetGauge("varipipe_executor_parameter_bytes", "Bytes of this rank's parameters (fp32).", l);
  R().GetGauge("varipipe_executor_optimizer_state_bytes",
               "Bytes of this rank's optimizer state (training.zero_stage 1: its shard).", l);
}

}  // namespace

absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> StartExecutorMetrics(
    const std::string& listen, const v1::ExecutorStatus& identity, int local_rank) {
  {
    absl::MutexLock lock(&labels_mu);
    RankLabels() = {{"job", identity.job_id()},
                    {"rank", absl::StrCat(identity.rank())},
                    {"dp_rank", absl::StrCat(identity.dp_rank())},
                    {"pp_rank", absl::StrCat(identity.pp_rank())}};
  }
  Register(Labels());
  if (listen.empty()) return nullptr;
  // A non-zero port is this host's base: local rank k listens on base + k.
  std::string address = listen;
  const size_t colon = listen.rfind(':');
  const std::string port_text = colon == std::string::npos ? listen : listen.substr(colon + 1);
  int port = 0;
  if (absl::SimpleAtoi(port_text, &port) && port > 0) {
    address = absl::StrCat(colon == std::string::npos ? "127.0.0.1" : listen.substr(0, colon), ":",
                           port + local_rank);
  }
  absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> server =
      metrics::MetricsHttpServer::Start(address, &R());
  if (!server.ok()) return server.status();
  spdlog::info("Prometheus metrics on http://{}:{}/metrics", (*server)->host(), (*server)->port());
  return server;
}

void RecordIterationMetrics(const IterationMetrics& m) {
  const metrics::Labels l = Labels();
  Register(l);  // the help texts, whoever records first
  R().GetCounter("varipipe_executor_iterations_total", "", l).Increment();
  R().GetGauge("varipipe_executor_iteration", "", l).Set(static_cast<double>(m.iteration));
  R().GetHistogram("varipipe_executor_step_duration_seconds", "", StepBuckets(), l)
      .Observe(m.step_seconds);
  R().GetCounter("varipipe_executor_compute_seconds_total", "", l).Increment(m.compute_seconds);
  R().GetCounter("varipipe_executor_wait_seconds_total", "", l).Increment(m.wait_seconds);
  R().GetCounter("varipipe_executor_data_seconds_total", "", l).Increment(m.data_seconds);
  R().GetCounter("varipipe_executor_real_tokens_total", "", l).Increment(m.real_tokens);
  R().GetCounter("varipipe_executor_padded_tokens_total", "", l).Increment(m.padded_tokens);
  R().GetGauge("varipipe_executor_padding_efficiency_ratio", "", l)
      .Set(m.padded_tokens > 0 ? m.real_tokens / m.padded_tokens : 0);
  R().GetGauge("varipipe_executor_real_tokens_per_second", "", l)
      .Set(m.step_seconds > 0 ? m.real_tokens / m.step_seconds : 0);
  R().GetGauge("varipipe_executor_loss", "", l).Set(m.loss);
  R().GetGauge("varipipe_executor_iteration_seconds", "", l).Set(m.step_seconds);
  R().GetGauge("varipipe_executor_predicted_iteration_seconds", "", l).Set(m.predicted_seconds);
  R().GetGauge("varipipe_executor_peak_memory_bytes", "", l).Set(m.peak_memory_bytes);
  R().GetGauge("varipipe_executor_peak_reserved_bytes", "", l).Set(m.peak_reserved_bytes);
  R().GetGauge("varipipe_executor_host_reads", "", l).Set(m.host_reads);
  R().GetGauge("varipipe_executor_parameter_bytes", "", l).Set(m.parameter_bytes);
  R().GetGauge("varipipe_executor_optimizer_state_bytes", "", l).Set(m.optimizer_state_bytes);
}

}  // namespace varipipe::executor
