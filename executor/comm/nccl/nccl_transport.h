// The GPU transport: NCCL point-to-point on one communicator and CUDA stream
// per pair of ranks that exchange tensors (transport.h's ordered channel:
// NCCL runs a communicator's operations in issue order), CUDA events to
// wait, and one communicator for the rank's data-parallel group. NCCL
// unique ids are exchanged through the job's Redis. Compiled when CUDA and
// NCCL are found (VARIPIPE_WITH_CUDA).
//
// Communicators are created at start-up for the given peer pairs, in one
// global order (sorted pairs), so no two ranks wait for each other in
// opposite orders.
#ifndef VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_TRANSPORT_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "executor/comm/transport.h"

namespace varipipe::executor {

class NcclTransport final : public Transport {
 public:
  struct Options {
    RedisClient::Options redis;
    std::string prefix;  // unique per job run
    int rank = 0;
    int size = 1;
    int device = 0;  // CUDA device of this rank
    // Peers this rank exchanges tensors with (pipeline neighbours).
    std::vector<int> peers;
    // Global ranks of this rank's data-parallel group (ascending).
    std::vector<int> data_parallel_group;
    absl::Duration connect_timeout = absl::Seconds(300);
  };

  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(const Options& options);
  ~NcclTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  // `data` is device memory on this rank's device.
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override;
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) override;
  std::string Describe() const override;

 private:
  struct Channel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peer_index = 0;  // the peer's rank inside the two-rank communicator
  };
  explicit NcclTransport(const Options& options) : options_(options) {}
  absl::StatusOr<ncclUniqueId> ExchangeId(RedisClient& redis, const std::string& key, bool create);
  absl::StatusOr<std::unique_ptr<Transfer>> Start(int peer, void* data, size_t bytes, bool send);

  Options options_;
  std::map<int, Channel> channels_;  // by peer
  ncclComm_t group_comm_ = nullptr;
  cudaStream_t group_stream_ = nullptr;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_TRANSPORT_H_
