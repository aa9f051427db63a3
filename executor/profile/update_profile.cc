#include "executor/profile/update_profile.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/median.h"
#include "common/status.h"
#include "executor/profile/component_profile.h"
#include "executor/runtime/training_optimizer.h"

namespace varipipe::executor {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A transfer's deadline: generous, the peer is measuring too.
absl::Time Deadline() { return absl::Now() + absl::Seconds(120); }

void Synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Median time of the optimizer's local work (gradient norm and step) on
// `parameters` parameters, in tensors of a layer's shape family.
absl::StatusOr<double> OptimizerMs(int64_t parameters, const v1::JobConfig& config,
                                   torch::Device device, int repeats) {
  // Four tensors, as a layer's weight matrices; fp32 master parameters.
  std::vector<torch::Tensor> tensors;
  const int64_t each = std::max<int64_t>(1, parameters / 4);
  for (int k = 0; k < 4; ++k) {
    torch::Tensor p = torch::randn({each}, torch::TensorOptions().device(device));
    p.set_requires_grad(true);
    p.mutable_grad() = torch::randn({each}, torch::TensorOptions().device(device)) * 1e-3;
    tensors.push_back(p);
  }
  TrainingOptimizer optimizer(tensors, config.training());
  std::vector<double> times;
  for (int pass = 0; pass < repeats + 1; ++pass) {
    Synchronize(device);
    const Clock::time_point start = Clock::now();
    const double norm = std::sqrt(optimizer.LocalSquaredGradNorm());
    optimizer.Step(static_cast<uint64_t>(pass), norm);
    Synchronize(device);
    if (pass > 0) times.push_back(MsSince(start));  // the first pass allocates state
  }
  return Median(times);
}

}  // namespace

absl::StatusOr<v1::OptimizerCosts> MeasureOptimizer(const ModelSpec& spec,
                                                    const v1::JobConfig& config,
                                                    torch::Device device, int repeats) {
  try {
    const double layer = std::max(1024.0, ComponentParameters(spec, v1::ENCODER_LAYER));
    const int64_t small = static_cast<int64_t>(layer);
    const int64_t large = 8 * small;
    VP_ASSIGN_OR_RETURN(const double t_small, OptimizerMs(small, config, device, repeats));
    VP_ASSIGN_OR_RETURN(const double t_large, OptimizerMs(large, config, device, repeats));
    v1::OptimizerCosts out;
    out.set_optimizer(v1::Optimizer_Name(config.training().optimizer()));
    const double per_parameter = std::max(0.0, (t_large - t_small) / (large - small));
    out.set_ms_per_million_parameters(per_parameter * 1e6);
    out.set_fixed_ms(std::max(0.0, t_small - per_parameter * small));
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("measuring the optimizer step: ", e.what()));
  }
}

std::pair<double, double> FitLink(const std::vector<TransferSample>& samples) {
  if (samples.empty()) return {0, 0};
  // The latency is the fastest transfer's time (a noisy small message, on a
  // loaded machine, must not exceed every large one's and leave no slope).
  const double latency_ms =
      std::min_element(samples.begin(), samples.end(),
                       [](const TransferSample& a, const TransferSample& b) { return a.ms < b.ms; })
          ->ms;
  const auto largest = std::max_element(
      samples.begin(), samples.end(),
      [](const TransferSample& a, const TransferSample& b) { return a.bytes < b.bytes; });
  constexpr double kLarge = 64 * 1024;
  const bool any_large = std::any_of(samples.begin(), samples.end(),
                                     [](const TransferSample& s) { return s.bytes >= kLarge; });
  // Slope through (n, t - latency): bytes per ms = sum n^2 / sum n (t - a).
  double nn = 0, nt = 0;
  for (const TransferSample& s : samples) {
    if (any_large && s.bytes < kLarge) continue;
    nn += s.bytes * s.bytes;
    nt += s.bytes * std::max(0.0, s.ms - latency_ms);
  }
  // Every transfer as fast as the fastest: the link is faster than the sizes
  // measured show; the largest transfer's own rate bounds it from below.
  const double bytes_per_ms =
      nt > 0 ? nn / nt : static_cast<double>(largest->bytes) / std::max(largest->ms, 1e-6);
  return {latency_ms * 1e3, bytes_per_ms / 1e6};
}

std::vector<size_t> TransferSizes(size_t max_bytes) {
  std::vector<size_t> sizes;
  for (size_t n = 4; n < max_bytes; n *= 4) sizes.push_back(n);
  sizes.push_back(std::max<size_t>(4, max_bytes));
  return sizes;
}

absl::StatusOr<v1::CommunicationCosts> MeasureCommunication(Transport& transport,
                                                            torch::Device device,
                                                            size_t max_bytes, int repeats) {
  const int rank = transport.rank();
  const int size = transport.size();
  if (size < 2) return absl::FailedPreconditionError("measuring transfers needs two ranks");
  std::vector<int> everyone;
  for (int r = 0; r < size; ++r) everyone.push_back(r);
  // On the device the transport moves data from (NCCL: the GPU).
  // Room for the largest message, and for one float per rank's shard.
  torch::Tensor tensor = torch::zeros({static_cast<int64_t>(std::max<size_t>(size, max_bytes / 4))},
                                      torch::TensorOptions().dtype(torch::kFloat32).device(device));
  float* buffer = tensor.data_ptr<float>();
  std::vector<TransferSample> p2p, all_reduce;
  for (size_t bytes : TransferSizes(max_bytes)) {
    const size_t floats = std::max<size_t>(1, bytes / sizeof(float));
    // Ping-pong between ranks 0 and 1; the others wait at the all-reduce.
    if (rank <= 1) {
      const int peer = 1 - rank;
      std::vector<double> times;
      for (int pass = 0; pass < repeats + 1; ++pass) {
        const Clock::time_point start = Clock::now();
        for (int leg = 0; leg < 2; ++leg) {
          const bool send = (leg == 0) == (rank == 0);
          absl::StatusOr<std::unique_ptr<Transfer>> t =
              send ? transport.StartSend(peer, buffer, floats * sizeof(float))
                   : transport.StartRecv(peer, buffer, floats * sizeof(float));
          if (!t.ok()) return t.status();
          VP_RETURN_IF_ERROR((*t)->Wait(Deadline()));
        }
        if (pass > 0) times.push_back(MsSince(start) / 2);
      }
      p2p.push_back({static_cast<double>(floats * sizeof(float)), Median(times)});
    }
    std::vector<double> times;
    for (int pass = 0; pass < repeats + 1; ++pass) {
      const Clock::time_point start = Clock::now();
      VP_RETURN_IF_ERROR(transport.AllReduceMean(std::span<float>(buffer, floats), everyone));
      Synchronize(device);
      if (pass > 0) times.push_back(MsSince(start));
    }
    all_reduce.push_back({static_cast<double>(floats * sizeof(float)), Median(times)});
  }
  // The context group's ring collectives, in place on `size` shards of n
  // bytes each: one step passes one shard on, (size - 1) steps in all.
  std::vector<TransferSample> gather_steps, scatter_steps;
  const double steps = size - 1;
  for (size_t shard_bytes : TransferSizes(std::max<size_t>(4, max_bytes / size))) {
    const size_t shard = std::max<size_t>(1, shard_bytes / sizeof(float));
    const std::span<float> data(buffer, shard * size);
    for (const bool gather : {true, false}) {
      std::vector<double> times;
      for (int pass = 0; pass < repeats + 1; ++pass) {
        const Clock::time_point start = Clock::now();
        VP_RETURN_IF_ERROR(gather ? transport.AllGather(data, everyone)
                                  : transport.ReduceScatterSum(data, everyone));
        Synchronize(device);
        if (pass > 0) times.push_back(MsSince(start) / steps);
      }
      (gather ? gather_steps : scatter_steps)
          .push_back({static_cast<double>(shard * sizeof(float)), Median(times)});
    }
  }
  // Every rank takes rank 0's point-to-point fit (the others measured none).
  auto [p2p_latency_us, p2p_gbps] = FitLink(p2p);
  torch::Tensor shared_tensor =
      torch::tensor({static_cast<float>(rank == 0 ? p2p_latency_us : 0),
                     static_cast<float>(rank == 0 ? p2p_gbps : 0)})
          .to(device);
  VP_RETURN_IF_ERROR(
      transport.AllReduceMean(std::span<float>(shared_tensor.data_ptr<float>(), 2), everyone));
  Synchronize(device);
  const torch::Tensor host = shared_tensor.cpu();
  const float shared[2] = {host[0].item<float>(), host[1].item<float>()};
  const auto [reduce_latency_us, reduce_gbps] = FitLink(all_reduce);
  v1::CommunicationCosts out;
  out.set_transport(absl::StrCat(transport.Describe(), ", ", size, " ranks"));
  out.set_p2p_latency_us(shared[0] * size);
  out.set_p2p_bandwidth_gbps(shared[1] * size);
  out.set_all_reduce_latency_us(reduce_latency_us);
  out.set_all_reduce_bandwidth_gbps(reduce_gbps);
  out.set_all_reduce_ranks(static_cast<uint32_t>(size));
  const auto [gather_latency_us, gather_gbps] = FitLink(gather_steps);
  const auto [scatter_latency_us, scatter_gbps] = FitLink(scatter_steps);
  out.set_all_gather_step_latency_us(gather_latency_us);
  out.set_all_gather_step_bandwidth_gbps(gather_gbps);
  out.set_reduce_scatter_step_latency_us(scatter_latency_us);
  out.set_reduce_scatter_step_bandwidth_gbps(scatter_gbps);
  out.set_collective_ranks(static_cast<uint32_t>(size));
  return out;
}

}  // namespace varipipe::executor
