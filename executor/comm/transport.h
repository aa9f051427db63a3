// The executor's communication interface: ordered point-to-point transfers
// between pairs of ranks and collectives over groups of ranks (the
// data-parallel all-reduce, the reduce-scatter and all-gather of sharded
// optimizer states, and the tensor-parallel layers' collectives). Implementations:
// executor/comm/gloo/ (CPU, TCP) and executor/comm/nccl/ (GPU).
//
// Semantics (the ones the planner's validator proves deadlock-free): each
// pair of ranks has one ordered channel. The k-th transfer a rank starts on
// the channel to a peer pairs with the peer's k-th transfer on it; Start
// never blocks; a transfer completes once both sides started it (and, on
// NCCL, every earlier transfer on the channel completed). A buffer passed to
// a Start must stay valid and untouched until its Wait returns.
//
//   std::unique_ptr<Transfer> t = transport->StartSend(peer, data, bytes);
//   ...
//   VP_RETURN_IF_ERROR(t->Wait(absl::Now() + absl::Seconds(300)));
//
// Device memory: a transport that reads or writes device buffers orders each
// transfer and collective after the work queued on the device's compute
// stream when it was started, so callers never synchronise the device before
// one (NCCL: its stream waits on an event of the compute stream).
//
// Thread safety: a transport is driven by one thread (the interpreter);
// Abort() may be called from any thread.
#ifndef VARIPIPE_EXECUTOR_COMM_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_TRANSPORT_H_

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varipipe::executor {

class Transfer {
 public:
  virtual ~Transfer() = default;
  // Blocks until the transfer completed or `deadline` passed
  // (DEADLINE_EXCEEDED naming the peer), or fails (UNAVAILABLE when the peer
  // is gone, ABORTED when the transport was aborted).
  virtual absl::Status Wait(absl::Time deadline) = 0;
};

// A transfer that completed when it was made, with `status`.
class FinishedTransfer final : public Transfer {
 public:
  explicit FinishedTransfer(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait(absl::Time) override { return status_; }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data,
                                                              size_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data,
                                                              size_t bytes) = 0;
  // Sums `data` elementwise across `group` (global ranks, ascending, this
  // rank included) and divides by the group size: the data-parallel gradient
  // average. Blocking.
  virtual absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) = 0;
  // Starts AllReduceMean of `data` over `group` and returns at once; `data`
  // must stay valid and untouched until the returned transfer's Wait
  // returns (its status is the collective's). Collectives started over one
  // group complete in the order they were started, and every rank of the
  // group must start the same ones in the same order (the data-parallel
  // gradient buckets, gradient_buckets.h). NCCL enqueues it on the group's
  // stream, Gloo runs it on the transport's collective thread; this default
  // runs it at once, blocking, and returns it finished.
  virtual absl::StatusOr<std::unique_ptr<Transfer>> StartAllReduceMean(
      std::span<float> data, const std::vector<int>& group);
  // Sums `data` elementwise across `group`, undivided: the tensor-parallel
  // layers' all-reduce (tensor_group.h). Blocking; bounded and abortable as
  // AllReduceMean.
  virtual absl::Status AllReduceSum(std::span<float> data, const std::vector<int>& group) = 0;

  // The collectives of ZeRO stage 1 (optimizer_sharding.h), in place on a
  // buffer of group.size() equal shards: the group's i-th rank owns shard
  // data[i * s, (i + 1) * s), s = data.size() / group.size(). InvalidArgument
  // unless group.size() divides data.size(). Blocking; bounded and abortable
  // as AllReduceMean.
  // ReduceScatterSum: afterwards this rank's shard holds the elementwise sum
  // of that shard over the group; the other shards hold unspecified values.
  virtual absl::Status ReduceScatterSum(std::span<float> data, const std::vector<int>& group) = 0;
  // AllGather: afterwards every shard holds what its owner had in it, bit
  // for bit (the words are copied, never computed on: they may hold another
  // dtype's bytes, as TensorGroup::AllGather sends bf16 pairs).
  virtual absl::Status AllGather(std::span<float> data, const std::vector<int>& group) = 0;
  // Start ReduceScatterSum / AllGather and return at once, with the rules of
  // StartAllReduceMean (one queue of collectives per group, started in the
  // same order on every rank of it; `data` untouched until the transfer's
  // Wait returned): ZeRO stage 1's gradient buckets and parameter gathers
  // (optimizer_sharding.h). These defaults run them at once, blocking.
  virtual absl::StatusOr<std::unique_ptr<Transfer>> StartReduceScatterSum(
      std::span<float> data, const std::vector<int>& group);
  virtual absl::StatusOr<std::unique_ptr<Transfer>> StartAllGather(std::span<float> data,
                                                                   const std::vector<int>& group);

  // The tensor-parallel layers' collectives (tensor_group.h) without the
  // host waiting, where the transport can: starts `kind` of `data` over
  // `group` (as AllReduceSum, ReduceScatterSum or AllGather) ordered after
  // the compute stream's queued work, and orders the compute stream's later
  // work after it, so the device never waits for the host. `data` must stay
  // valid until the returned transfer's Wait returned, which reports the
  // collective's failure (bounded, abortable). NCCL: on the group's stream,
  // the compute stream waiting on its event. This default runs the blocking
  // collective and returns a FinishedTransfer (Gloo, CPUs).
  enum class DeviceCollective { kAllReduceSum, kReduceScatterSum, kAllGather };
  virtual absl::StatusOr<std::unique_ptr<Transfer>> StartDeviceOrdered(
      DeviceCollective kind, std::span<float> data, const std::vector<int>& group);

  // Short description ("gloo tcp 127.0.0.1", "nccl 2.28.9").
  virtual std::string Describe() const = 0;

  // Ends every pending and later Wait and collective promptly with
  // CANCELLED carrying `reason` (e.g. "stopped by SIGTERM"), however long
  // they would have waited for a peer; the transport is unusable afterwards.
  // For shutdown: called from another thread while the driving thread is
  // blocked. Idempotent.
  virtual void Abort(const std::string& reason) = 0;
};

inline absl::StatusOr<std::unique_ptr<Transfer>> Transport::StartAllReduceMean(
    std::span<float> data, const std::vector<int>& group) {
  return std::unique_ptr<Transfer>(new FinishedTransfer(AllReduceMean(data, group)));
}

inline absl::StatusOr<std::unique_ptr<Transfer>> Transport::StartDeviceOrdered(
    DeviceCollective kind, std::span<float> data, const std::vector<int>& group) {
  absl::Status status;
  switch (kind) {
    case DeviceCollective::kAllReduceSum:
      status = AllReduceSum(data, group);
      break;
    case DeviceCollective::kReduceScatterSum:
      status = ReduceScatterSum(data, group);
      break;
    case DeviceCollective::kAllGather:
      status = AllGather(data, group);
      break;
  }
  return std::unique_ptr<Transfer>(new FinishedTransfer(std::move(status)));
}

inline absl::StatusOr<std::unique_ptr<Transfer>> Transport::StartReduceScatterSum(
    std::span<float> data, const std::vector<int>& group) {
  return std::unique_ptr<Transfer>(new FinishedTransfer(ReduceScatterSum(data, group)));
}

inline absl::StatusOr<std::unique_ptr<Transfer>> Transport::StartAllGather(
    std::span<float> data, const std::vector<int>& group) {
  return std::unique_ptr<Transfer>(new FinishedTransfer(AllGather(data, group)));
}

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_TRANSPORT_H_
