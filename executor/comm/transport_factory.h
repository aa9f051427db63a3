// Chooses the executor's transport: NCCL when the build has it and the rank
// runs on a GPU (or Gloo staging device buffers through the host, when asked),
// else Gloo over TCP. Callers see only transport.h.
#ifndef VARIPIPE_EXECUTOR_COMM_TRANSPORT_FACTORY_H_
#define VARIPIPE_EXECUTOR_COMM_TRANSPORT_FACTORY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "executor/comm/transport.h"

namespace varipipe::executor {

struct TransportOptions {
  RedisClient::Options redis;
  std::string prefix;  // unique per job run
  int rank = 0;
  int size = 1;
  // CUDA device, or -1 for the CPU (Gloo).
  int cuda_device = -1;
  // On a CUDA device: Gloo over TCP with every buffer staged through host
  // memory (device_staging_transport.h) instead of NCCL. For ranks that share
  // a GPU, which NCCL refuses, and for checks; slow.
  bool gloo_on_gpu = false;
  // Pipeline neighbours, the data-parallel group and the tensor group (global
  // ranks; NCCL creates its communicators for exactly these).
  std::vector<int> peers;
  std::vector<int> data_parallel_group;
  std::vector<int> tensor_group;
  std::string hostname = "127.0.0.1";
  absl::Duration connect_timeout = absl::Seconds(300);
  // Bounds each NCCL all-reduce (the communicator is aborted beyond it).
  absl::Duration collective_timeout = absl::Seconds(300);
  // Polled while ranks meet (rendezvous, connections): true ends the wait
  // with CANCELLED (shutdown). Empty: never.
  std::function<bool()> cancelled;
};

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_TRANSPORT_FACTORY_H_
