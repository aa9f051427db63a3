#include "executor/comm/nccl/nccl_transport.h"

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "executor/comm/nccl/nccl_status.h"
#include "executor/runtime/fault_injection.h"

namespace varipipe::executor {
namespace {

using AbortState = NcclTransport::AbortState;

// Between polls of an event or a communicator.
constexpr absl::Duration kPollInterval = absl::Microseconds(20);

absl::Status CudaToStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// CANCELLED naming `what` and the abort's reason once aborted, else OK.
absl::Status Aborted(AbortState& state, absl::string_view what) {
  if (!state.aborted.load()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(state.mu);
  return absl::CancelledError(absl::StrCat(what, ": ", state.reason));
}

// Waits for `event` (recorded after an operation on `comm`'s stream) until
// `deadline`, polling the communicator's asynchronous error and the
// transport's abort flag. A communicator error, the deadline or an abort
// aborts the communicator: its kernel would otherwise stay blocked on the
// GPU, and nothing queued behind it would ever run.
absl::Status WaitEvent(cudaEvent_t event, NcclCommunicator& comm, AbortState& abort,
                       absl::Time deadline, const std::string& what) {
  while (true) {
    if (absl::Status aborted = Aborted(abort, what); !aborted.ok()) {
      comm.Abort();
      return aborted;
    }
    if (comm.aborted()) return comm.AsyncError(what);
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return absl::OkStatus();
    if (state != cudaErrorNotReady) {
      comm.Abort();
      return CudaToStatus(state, what);
    }
    VP_RETURN_IF_ERROR(comm.AsyncError(what));
    if (absl::Now() >= deadline) {
      comm.Abort();
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete (its NCCL communicator was aborted)"));
    }
    absl::SleepFor(kPollInterval);
  }
}

class NcclTransfer final : public Transfer {
 public:
  // `what` names the operation in errors ("send to rank 3").
  NcclTransfer(cudaEvent_t event, std::shared_ptr<NcclCommunicator> comm,
               std::shared_ptr<AbortState> abort, std::string what)
      : event_(event), comm_(std::move(comm)), abort_(std::move(abort)), what_(std::move(what)) {}
  ~NcclTransfer() override { cudaEventDestroy(event_); }

  absl::Status Wait(absl::Time deadline) override {
    return WaitEvent(event_, *comm_, *abort_, deadline, what_);
  }

 private:
  cudaEvent_t event_;
  std::shared_ptr<NcclCommunicator> comm_;
  std::shared_ptr<AbortState> abort_;
  std::string what_;
};

}  // namespace

absl::StatusOr<ncclUniqueId> NcclTransport::ExchangeId(RedisClient& redis, const std::string& key,
                                                       bool create) {
  ncclUniqueId id;
  if (create) {
    VP_RETURN_IF_ERROR(NcclToStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    VP_ASSIGN_OR_RETURN(
        RedisReply r,
        redis.Command({"SET", key, std::string(id.internal, sizeof(id.internal)), "EX", "86400"}));
    VP_RETURN_IF_ERROR(RedisReplyError(r, "SET nccl id"));
    return id;
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  while (true) {
    VP_ASSIGN_OR_RETURN(RedisReply r, redis.Command({"GET", key}));
    if (r.is_string() && r.str().size() == sizeof(id.internal)) {
      std::memcpy(id.internal, r.str().data(), sizeof(id.internal));
      return id;
    }
    if (options_.cancelled && options_.cancelled()) {
      return absl::CancelledError(absl::StrCat("NCCL rendezvous: cancelled waiting for ", key));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("NCCL rendezvous: no id at ", key, " (is every rank running?)"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(const Options& options) {
  std::unique_ptr<NcclTransport> t(new NcclTransport(options));
  // Failing half-way abandons what was made: abort those communicators (a
  // peer may never make its side; finalizing them could wait for it).
  absl::Cleanup abandon = [&t] { t->AbortCommunicators(); };
  VP_RETURN_IF_ERROR(CudaToStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  VP_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> redis, RedisClient::Connect(options.redis));
  std::vector<int> peers = options.peers;
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  // Pairs in global order: a rank's pairs sorted by (min, max) rank.
  std::vector<std::pair<int, int>> pairs;
  for (int p : peers) {
    if (p == options.rank) continue;
    pairs.emplace_back(std::min(p, options.rank), std::max(p, options.rank));
  }
  std::sort(pairs.begin(), pairs.end());
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (const auto& [low, high] : pairs) {
    const int peer = low == options.rank ? high : low;
    VP_ASSIGN_OR_RETURN(
        ncclUniqueId id,
        t->ExchangeId(*redis, absl::StrCat(options.prefix, "/pair-", low, "-", high),
                      options.rank == low));
    // Stored in the transport as soon as it exists, so no failure below
    // leaks it.
    Channel& c = t->channels_[peer];
    c.peer_index = options.rank == low ? 1 : 0;
    VP_ASSIGN_OR_RETURN(c.comm, NcclCommunicator::Create(
                                    2, id, options.rank == low ? 0 : 1, deadline, options.cancelled,
                                    absl::StrCat("NCCL communicator with rank ", peer)));
    VP_RETURN_IF_ERROR(
        CudaToStatus(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "stream"));
  }
  // Every rank makes its data-parallel communicator before its tensor one:
  // each kind of group partitions the ranks, so no two ranks wait for each
  // other in opposite orders.
  VP_RETURN_IF_ERROR(
      t->CreateGroup(*redis, options.data_parallel_group, "data-parallel", deadline));
  VP_RETURN_IF_ERROR(t->CreateGroup(*redis, options.tensor_group, "tensor", deadline));
  std::move(abandon).Cancel();
  return t;
}

absl::Status NcclTransport::CreateGroup(RedisClient& redis, const std::vector<int>& group,
                                        const std::string& kind, absl::Time deadline) {
  if (group.size() <= 1) return absl::OkStatus();
  const auto me = std::find(group.begin(), group.end(), options_.rank);
  if (me == group.end()) {
    return absl::InvalidArgumentError(absl::StrCat("rank is not in its ", kind, " group"));
  }
  VP_ASSIGN_OR_RETURN(
      ncclUniqueId id,
      ExchangeId(redis, absl::StrCat(options_.prefix, "/group-", absl::StrJoin(group, "-")),
                 me == group.begin()));
  // Stored as soon as it exists, so no failure below leaks it.
  GroupComm& g = groups_[group];
  VP_ASSIGN_OR_RETURN(
      g.comm, NcclCommunicator::Create(
                  static_cast<int>(group.size()), id, static_cast<int>(me - group.begin()),
                  deadline, options_.cancelled, absl::StrCat("NCCL ", kind, " communicator")));
  return CudaToStatus(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "stream");
}

void NcclTransport::AbortCommunicators() {
  for (auto& [peer, c] : channels_) {
    if (c.comm != nullptr) c.comm->Abort();
  }
  for (auto& [group, g] : groups_) {
    if (g.comm != nullptr) g.comm->Abort();
  }
}

NcclTransport::~NcclTransport() {
  // After an abort nothing is finalized: the communicators' peers may be
  // gone (each communicator aborts itself anyway when finalizing fails).
  if (abort_->aborted.load()) AbortCommunicators();
  for (auto& [peer, c] : channels_) {
    c.comm.reset();  // finalize and destroy, or abort (nccl_communicator.h)
    if (c.stream != nullptr) cudaStreamDestroy(c.stream);
  }
  for (auto& [group, g] : groups_) {
    g.comm.reset();
    if (g.stream != nullptr) cudaStreamDestroy(g.stream);
  }
}

void NcclTransport::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_->mu);
  if (abort_->aborted.load()) return;
  abort_->reason = reason;
  abort_->aborted.store(true);
}

namespace {

// Makes `stream` wait for the work queued so far on the compute stream
// (LibTorch's default stream on this device, the legacy default stream),
// without the host waiting: a send reads a buffer the last kernels wrote, a
// receive writes memory the caching allocator may just have taken back from
// a tensor that queued kernels still read.
absl::Status AfterComputeStream(cudaStream_t stream) {
  cudaEvent_t ready;
  VP_RETURN_IF_ERROR(
      CudaToStatus(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event"));
  const absl::Cleanup destroy = [ready] { cudaEventDestroy(ready); };
  VP_RETURN_IF_ERROR(CudaToStatus(cudaEventRecord(ready, cudaStreamLegacy), "event record"));
  return CudaToStatus(cudaStreamWaitEvent(stream, ready, 0), "stream wait");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::Start(int peer, void* data, size_t bytes,
                                                               bool send) {
  const auto it = channels_.find(peer);
  if (it == channels_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank(), " has no NCCL channel to rank ", peer));
  }
  const Channel& c = it->second;
  const std::string what = absl::StrCat(send ? "ncclSend to rank " : "ncclRecv from rank ", peer);
  VP_RETURN_IF_ERROR(Aborted(*abort_, what));
  if (c.comm->aborted()) return c.comm->AsyncError(what);
  VP_RETURN_IF_ERROR(AfterComputeStream(c.stream));
  // Enqueuing may report ncclInProgress on a non-blocking communicator; the
  // operation is then issued once the communicator is ready again.
  VP_RETURN_IF_ERROR(c.comm->Check(
      send ? ncclSend(data, bytes, ncclUint8, c.peer_index, c.comm->get(), c.stream)
           : ncclRecv(data, bytes, ncclUint8, c.peer_index, c.comm->get(), c.stream),
      absl::Now() + options_.collective_timeout, [abort = abort_] { return abort->aborted.load(); },
      what));
  cudaEvent_t event;
  VP_RETURN_IF_ERROR(
      CudaToStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event"));
  if (absl::Status s = CudaToStatus(cudaEventRecord(event, c.stream), "event record"); !s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  return std::unique_ptr<Transfer>(new NcclTransfer(
      event, c.comm, abort_, absl::StrCat(send ? "send to" : "receive from", " rank ", peer)));
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartSend(int peer, void* data,
                                                                   size_t bytes) {
  return Start(peer, data, bytes, true);
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartRecv(int peer, void* data,
                                                                   size_t bytes) {
  return Start(peer, data, bytes, false);
}

absl::Status NcclTransport::Collective(const std::string& what, const std::vector<int>& group,
                                       const Enqueue& enqueue) {
  const auto found = groups_.find(group);
  if (found == groups_.end() || found->second.comm == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a group the transport was not built for"));
  }
  NcclCommunicator* group_comm = found->second.comm.get();
  cudaStream_t group_stream = found->second.stream;
  VP_RETURN_IF_ERROR(Aborted(*abort_, what));
  // Test-only fault points (executor/runtime/fault_injection.h).
  VP_RETURN_IF_ERROR(MaybeInjectFault(absl::StartsWith(what, "all-reduce")
                                          ? FaultPoint::kInAllReduce
                                          : FaultPoint::kInShardedCollective));
  // Bounded like every wait: a rank of the group that never joins must not
  // block this one in cudaStreamSynchronize forever.
  const absl::Time deadline = absl::Now() + options_.collective_timeout;
  if (group_comm->aborted()) return group_comm->AsyncError(what);
  VP_RETURN_IF_ERROR(AfterComputeStream(group_stream));
  VP_RETURN_IF_ERROR(group_comm->Check(
      enqueue(group_comm->get(), group_stream), deadline,
      [abort = abort_] { return abort->aborted.load(); }, what));
  cudaEvent_t event;
  VP_RETURN_IF_ERROR(
      CudaToStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event"));
  const absl::Cleanup destroy = [event] { cudaEventDestroy(event); };
  VP_RETURN_IF_ERROR(CudaToStatus(cudaEventRecord(event, group_stream), "event record"));
  return WaitEvent(event, *group_comm, *abort_, deadline, what);
}

absl::Status NcclTransport::AllReduce(std::span<float> data, const std::vector<int>& group,
                                      ncclRedOp_t op) {
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  return Collective(absl::StrCat("all-reduce over ranks ", absl::StrJoin(group, ",")), group,
                    [&](ncclComm_t comm, cudaStream_t stream) {
                      return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, op,
                                           comm, stream);
                    });
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartCollective(
    const std::string& what, const std::vector<int>& group, const Enqueue& enqueue,
    bool order_compute) {
  const auto found = groups_.find(group);
  if (found == groups_.end() || found->second.comm == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a group the transport was not built for"));
  }
  const std::shared_ptr<NcclCommunicator>& comm = found->second.comm;
  cudaStream_t stream = found->second.stream;
  VP_RETURN_IF_ERROR(Aborted(*abort_, what));
  if (comm->aborted()) return comm->AsyncError(what);
  VP_RETURN_IF_ERROR(AfterComputeStream(stream));
  VP_RETURN_IF_ERROR(comm->Check(
      enqueue(comm->get(), stream), absl::Now() + options_.collective_timeout,
      [abort = abort_] { return abort->aborted.load(); }, what));
  cudaEvent_t event;
  VP_RETURN_IF_ERROR(
      CudaToStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event"));
  if (absl::Status s = CudaToStatus(cudaEventRecord(event, stream), "event record"); !s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  std::unique_ptr<Transfer> transfer(new NcclTransfer(event, comm, abort_, what));
  if (order_compute) {
    // The compute stream's later work runs after the collective; the host
    // goes on.
    VP_RETURN_IF_ERROR(
        CudaToStatus(cudaStreamWaitEvent(cudaStreamLegacy, event, 0), "compute stream wait"));
  }
  return transfer;
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartDeviceOrdered(
    DeviceCollective kind, std::span<float> data, const std::vector<int>& group) {
  const size_t n = std::max<size_t>(1, group.size());
  const char* name = kind == DeviceCollective::kAllReduceSum       ? "all-reduce"
                     : kind == DeviceCollective::kReduceScatterSum ? "reduce-scatter"
                                                                   : "all-gather";
  const std::string what = absl::StrCat(name, " over ranks ", absl::StrJoin(group, ","));
  if (kind != DeviceCollective::kAllReduceSum && data.size() % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of ", data.size(), " values"));
  }
  if (group.size() <= 1 || data.empty()) {
    return std::unique_ptr<Transfer>(new FinishedTransfer(absl::OkStatus()));
  }
  // Test-only fault points (executor/runtime/fault_injection.h), as in
  // Collective.
  VP_RETURN_IF_ERROR(MaybeInjectFault(kind == DeviceCollective::kAllReduceSum
                                          ? FaultPoint::kInAllReduce
                                          : FaultPoint::kInShardedCollective));
  const size_t shard = data.size() / n;
  const size_t me =
      static_cast<size_t>(std::find(group.begin(), group.end(), options_.rank) - group.begin());
  return StartCollective(
      what, group,
      [=](ncclComm_t comm, cudaStream_t stream) {
        switch (kind) {
          case DeviceCollective::kAllReduceSum:
            return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm,
                                 stream);
          case DeviceCollective::kReduceScatterSum:
            return ncclReduceScatter(data.data(), data.data() + me * shard, shard, ncclFloat,
                                     ncclSum, comm, stream);
          case DeviceCollective::kAllGather:
            break;
        }
        return ncclAllGather(data.data() + me * shard, data.data(), shard, ncclFloat, comm,
                             stream);
      },
      /*order_compute=*/true);
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartAllReduceMean(
    std::span<float> data, const std::vector<int>& group) {
  if (group.size() <= 1 || data.empty()) {
    return std::unique_ptr<Transfer>(new FinishedTransfer(absl::OkStatus()));
  }
  return StartCollective(absl::StrCat("all-reduce over ranks ", absl::StrJoin(group, ",")), group,
                         [data](ncclComm_t comm, cudaStream_t stream) {
                           return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat,
                                                ncclAvg, comm, stream);
                         });
}

absl::Status NcclTransport::AllReduceMean(std::span<float> data, const std::vector<int>& group) {
  return AllReduce(data, group, ncclAvg);
}

absl::Status NcclTransport::AllReduceSum(std::span<float> data, const std::vector<int>& group) {
  return AllReduce(data, group, ncclSum);
}

// In place (NCCL's rule for both: the rank's shard of the full buffer is
// its send buffer of an all-gather and its receive buffer of a
// reduce-scatter).
absl::Status NcclTransport::ReduceScatterSum(std::span<float> data, const std::vector<int>& group) {
  const size_t n = std::max<size_t>(1, group.size());
  if (data.size() % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter of ", data.size(), " values over ", n, " ranks"));
  }
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  const size_t shard = data.size() / n;
  const size_t me =
      static_cast<size_t>(std::find(group.begin(), group.end(), options_.rank) - group.begin());
  return Collective(absl::StrCat("reduce-scatter over ranks ", absl::StrJoin(group, ",")), group,
                    [&](ncclComm_t comm, cudaStream_t stream) {
                      return ncclReduceScatter(data.data(), data.data() + me * shard, shard,
                                               ncclFloat, ncclSum, comm, stream);
                    });
}

absl::Status NcclTransport::AllGather(std::span<float> data, const std::vector<int>& group) {
  const size_t n = std::max<size_t>(1, group.size());
  if (data.size() % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-gather of ", data.size(), " values over ", n, " ranks"));
  }
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  const size_t shard = data.size() / n;
  const size_t me =
      static_cast<size_t>(std::find(group.begin(), group.end(), options_.rank) - group.begin());
  return Collective(absl::StrCat("all-gather over ranks ", absl::StrJoin(group, ",")), group,
                    [&](ncclComm_t comm, cudaStream_t stream) {
                      return ncclAllGather(data.data() + me * shard, data.data(), shard, ncclFloat,
                                           comm, stream);
                    });
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartShardedCollective(
    std::span<float> data, const std::vector<int>& group, bool reduce_scatter) {
  const size_t n = std::max<size_t>(1, group.size());
  const std::string what = absl::StrCat(reduce_scatter ? "reduce-scatter" : "all-gather",
                                        " over ranks ", absl::StrJoin(group, ","));
  if (data.size() % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of ", data.size(), " values"));
  }
  if (group.size() <= 1 || data.empty()) {
    return std::unique_ptr<Transfer>(new FinishedTransfer(absl::OkStatus()));
  }
  // Test-only fault point (executor/runtime/fault_injection.h), as in the
  // blocking collectives.
  VP_RETURN_IF_ERROR(MaybeInjectFault(FaultPoint::kInShardedCollective));
  const size_t shard = data.size() / n;
  const size_t me =
      static_cast<size_t>(std::find(group.begin(), group.end(), options_.rank) - group.begin());
  return StartCollective(what, group, [=](ncclComm_t comm, cudaStream_t stream) {
    return reduce_scatter ? ncclReduceScatter(data.data(), data.data() + me * shard, shard,
                                              ncclFloat, ncclSum, comm, stream)
                          : ncclAllGather(data.data() + me * shard, data.data(), shard, ncclFloat,
                                          comm, stream);
  });
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartReduceScatterSum(
    std::span<float> data, const std::vector<int>& group) {
  return StartShardedCollective(data, group, /*reduce_scatter=*/true);
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartAllGather(
    std::span<float> data, const std::vector<int>& group) {
  return StartShardedCollective(data, group, /*reduce_scatter=*/false);
}

std::string NcclTransport::Describe() const {
  return absl::StrCat("nccl ", NcclRuntimeVersion(), " on cuda:", options_.device, " (rank ",
                      rank(), " of ", size(), ", ", channels_.size(), " peer channels)");
}

}  // namespace varipipe::executor
