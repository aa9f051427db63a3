// The GPU transport: NCCL point-to-point on one communicator and CUDA stream
// per pair of ranks that exchange tensors (transport.h's ordered channel:
// NCCL runs a communicator's operations in issue order), CUDA events to
// wait, one communicator for the rank's data-parallel group (all-reduce,
// and the reduce-scatter and all-gather of ZeRO stage 1) and one for its
// tensor group (the tensor-parallel layers' collectives), each on its own
// stream. NCCL
// unique ids are exchanged through the job's Redis. Compiled when CUDA and
// NCCL are found (VARIPIPE_WITH_CUDA).
//
// Communicators are created at start-up for the given peer pairs, in one
// global order (sorted pairs), so no two ranks wait for each other in
// opposite orders. Every communicator is non-blocking and every wait polls
// (the transfer's event, the communicator's asynchronous error, the
// deadline, Abort()): on an error, a deadline or an abort the communicator
// is aborted, never destroyed (nccl_communicator.h has the rules).
#ifndef VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_TRANSPORT_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "executor/comm/nccl/nccl_communicator.h"
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
    // Global ranks of this rank's data-parallel group and tensor group
    // (ascending; empty or one rank: none).
    std::vector<int> data_parallel_group;
    std::vector<int> tensor_group;
    // Bounds the rendezvous and each communicator's creation.
    absl::Duration connect_timeout = absl::Seconds(300);
    // Bounds each all-reduce.
    absl::Duration collective_timeout = absl::Seconds(300);
    // Polled while ranks meet: true ends the rendezvous with CANCELLED.
    std::function<bool()> cancelled;
  };

  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(const Options& options);
  ~NcclTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  // `data` is device memory on this rank's device.
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override;
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) override;
  // Enqueued on the group's stream after the compute stream's queued work;
  // the transfer's Wait polls its event.
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllReduceMean(
      std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllReduceSum(std::span<float> data, const std::vector<int>& group) override;
  // `data` is device memory on this rank's device (as for AllReduceMean).
  absl::Status ReduceScatterSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllGather(std::span<float> data, const std::vector<int>& group) override;
  // Enqueued on the group's stream after the compute stream's queued work,
  // as StartAllReduceMean.
  absl::StatusOr<std::unique_ptr<Transfer>> StartReduceScatterSum(
      std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllGather(std::span<float> data,
                                                           const std::vector<int>& group) override;
  // Enqueued on the tensor group's stream after the compute stream's queued
  // work; the compute stream then waits on its event (no host wait).
  absl::StatusOr<std::unique_ptr<Transfer>> StartDeviceOrdered(
      DeviceCollective kind, std::span<float> data, const std::vector<int>& group) override;
  std::string Describe() const override;
  // Sets a flag the polling waits check on the driving thread, which then
  // aborts the communicator it waits on (NCCL calls stay on that thread).
  void Abort(const std::string& reason) override;

  // Whether Abort() was called, and why; shared with the transfers.
  struct AbortState {
    std::atomic<bool> aborted{false};
    std::mutex mu;
    std::string reason;  // guarded by mu
  };

 private:
  struct Channel {
    std::shared_ptr<NcclCommunicator> comm;
    cudaStream_t stream = nullptr;
    int peer_index = 0;  // the peer's rank inside the two-rank communicator
  };
  explicit NcclTransport(const Options& options) : options_(options) {}
  absl::StatusOr<ncclUniqueId> ExchangeId(RedisClient& redis, const std::string& key, bool create);
  absl::StatusOr<std::unique_ptr<Transfer>> Start(int peer, void* data, size_t bytes, bool send);
  // Aborts every communicator (Create failing half-way).
  void AbortCommunicators();
  // Makes the communicator and stream of `group` (a `kind` group), unless
  // it has at most one rank.
  absl::Status CreateGroup(RedisClient& redis, const std::vector<int>& group,
                           const std::string& kind, absl::Time deadline);
  // Enqueues one collective on the communicator of `group` (one the
  // transport was built for) and waits for it, bounded and abortable.
  using Enqueue = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;
  // An in-place all-reduce of `data` over `group` with `op`.
  absl::Status AllReduce(std::span<float> data, const std::vector<int>& group, ncclRedOp_t op);
  absl::Status Collective(const std::string& what, const std::vector<int>& group,
                          const Enqueue& enqueue);
  // Enqueues one collective as Collective does and returns at once: the
  // transfer's Wait polls the event recorded after it on the group's stream.
  // With `order_compute` the compute stream's later work also waits for it.
  absl::StatusOr<std::unique_ptr<Transfer>> StartCollective(const std::string& what,
                                                            const std::vector<int>& group,
                                                            const Enqueue& enqueue,
                                                            bool order_compute = false);
  absl::StatusOr<std::unique_ptr<Transfer>> StartShardedCollective(std::span<float> data,
                                                                   const std::vector<int>& group,
                                                                   bool reduce_scatter);

  struct GroupComm {
    std::shared_ptr<NcclCommunicator> comm;
    cudaStream_t stream = nullptr;
  };

  Options options_;
  std::map<int, Channel> channels_;               // by peer
  std::map<std::vector<int>, GroupComm> groups_;  // by global ranks
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_TRANSPORT_H_
