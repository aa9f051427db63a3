// Measures what an iteration does besides its forward and backward passes,
// for the cost model's OptimizerCosts and CommunicationCosts
// (docs/cost-model.md, "Profiling"):
//   - the optimizer step (the executor's TrainingOptimizer: local gradient
//     norm and step) over parameter sets of one and eight layers, fitted
//     as fixed + per-parameter time;
//   - point-to-point messages between ranks 0 and 1 (ping-pong, one way =
//     half the round trip), the all-reduce over every rank of the launch,
//     and the all-gather and reduce-scatter over every rank (a context
//     group's collectives, per ring step: the collective's time / (ranks -
//     1) for shards of n bytes), over the executor's transport (Gloo on
//     CPUs, NCCL on GPUs), each fitted as t(n) = latency + n / bandwidth.
// Times are medians of `repeats` after a warm-up.
#ifndef VARIPIPE_EXECUTOR_PROFILE_UPDATE_PROFILE_H_
#define VARIPIPE_EXECUTOR_PROFILE_UPDATE_PROFILE_H_

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/comm/transport.h"
#include "executor/model/model_spec.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe::executor {

absl::StatusOr<v1::OptimizerCosts> MeasureOptimizer(const ModelSpec& spec,
                                                    const v1::JobConfig& config,
                                                    torch::Device device, int repeats);

// One measured transfer size: bytes and the median time in milliseconds.
struct TransferSample {
  double bytes = 0;
  double ms = 0;
};

// Least-squares fit of t = latency + n / bandwidth: the latency is the
// fastest sample's time (normally the smallest message's median), the
// bandwidth the slope through the points of at least 64 KiB (all points when
// there are none), or the largest message's own rate when no point takes
// longer than the latency (a loaded machine). Returns (latency us,
// bandwidth GB/s), the bandwidth positive whenever a sample is.
std::pair<double, double> FitLink(const std::vector<TransferSample>& samples);

// Message sizes 4 bytes, 4 * 4^k ... up to `max_bytes` (included).
std::vector<size_t> TransferSizes(size_t max_bytes);

// Runs on every rank of `transport` (collective): rank 0 and 1 ping-pong,
// then everyone all-reduces, all-gathers and reduce-scatters. Every rank
// gets the same point-to-point fit (rank 0's); the collectives' fits are
// each rank's own.
// `device`: where the transport's buffers live (NCCL: the rank's GPU).
absl::StatusOr<v1::CommunicationCosts> MeasureCommunication(Transport& transport,
                                                            torch::Device device,
                                                            size_t max_bytes, int repeats);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_PROFILE_UPDATE_PROFILE_H_
