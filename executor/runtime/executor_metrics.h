// The executor's Prometheus metrics (docs/operations.md, "Metrics"): one
// call per iteration from the training loop, served by --metrics_listen.
// Every series is labelled job, rank, dp_rank and pp_rank (this rank's).
#ifndef VARIPIPE_EXECUTOR_RUNTIME_EXECUTOR_METRICS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_EXECUTOR_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_http_server.h"
#include "varipipe/v1/service.pb.h"

namespace varipipe::executor {

// What one iteration measured. Tokens and loss are the job's (all replicas,
// reduced over ranks); times are this rank's.
struct IterationMetrics {
  uint64_t iteration = 0;
  double step_seconds = 0;
  double compute_seconds = 0;
  double wait_seconds = 0;  // inside Waits and all-reduce
  double data_seconds = 0;
  double loss = 0;
  double real_tokens = 0;
  double padded_tokens = 0;
  double predicted_seconds = 0;  // the plan's predicted iteration time
  double peak_memory_bytes = 0;
  // GPUs: the caching allocator's peak reserved bytes (allocated plus what
  // it holds for reuse); CPUs: the same as peak_memory_bytes.
  double peak_reserved_bytes = 0;
  // Times the host waited for the device in the iteration (host_reads.h).
  double host_reads = 0;
  // This rank's model state: its parameters (fp32) and its optimizer's
  // state tensors (under training.zero_stage 1 its shard).
  double parameter_bytes = 0;
  double optimizer_state_bytes = 0;
};

// Labels the series with `identity` (job, rank, dp, pp) and, for a
// non-empty `listen` ("HOST:PORT" or "PORT" on 127.0.0.1; a non-zero port is
// offset by `local_rank` so the ranks of one host do not collide), serves
// them. nullptr when `listen` is empty.
absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> StartExecutorMetrics(
    const std::string& listen, const v1::ExecutorStatus& identity, int local_rank);

// Records one iteration (every rank, after the iteration's reduction).
void RecordIterationMetrics(const IterationMetrics& m);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_EXECUTOR_METRICS_H_
