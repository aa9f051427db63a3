#include "executor/comm/nccl/nccl_transport.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "executor/comm/nccl/nccl_status.h"

namespace varipipe::executor {
namespace {

absl::Status CudaToStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

class NcclTransfer final : public Transfer {
 public:
  NcclTransfer(cudaEvent_t event, ncclComm_t comm, int peer, bool send)
      : event_(event), comm_(comm), peer_(peer), send_(send) {}
  ~NcclTransfer() override { cudaEventDestroy(event_); }

  absl::Status Wait(absl::Time deadline) override {
    const char* what = send_ ? "send to" : "receive from";
    while (true) {
      const cudaError_t state = cudaEventQuery(event_);
      if (state == cudaSuccess) return absl::OkStatus();
      if (state != cudaErrorNotReady) {
        return CudaToStatus(state, absl::StrCat(what, " rank ", peer_));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess) {
        ncclCommAbort(comm_);
        return NcclToStatus(async, absl::StrCat(what, " rank ", peer_));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, " rank ", peer_, " did not complete"));
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

 private:
  cudaEvent_t event_;
  ncclComm_t comm_;
  int peer_;
  bool send_;
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
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("NCCL rendezvous: no id at ", key, " (is every rank running?)"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(const Options& options) {
  std::unique_ptr<NcclTransport> t(new NcclTransport(options));
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
  for (const auto& [low, high] : pairs) {
    const int peer = low == options.rank ? high : low;
    VP_ASSIGN_OR_RETURN(
        ncclUniqueId id,
        t->ExchangeId(*redis, absl::StrCat(options.prefix, "/pair-", low, "-", high),
                      options.rank == low));
    Channel c;
    c.peer_index = options.rank == low ? 1 : 0;
    VP_RETURN_IF_ERROR(NcclToStatus(ncclCommInitRank(&c.comm, 2, id, options.rank == low ? 0 : 1),
                                    absl::StrCat("NCCL communicator with rank ", peer)));
    VP_RETURN_IF_ERROR(
        CudaToStatus(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "stream"));
    t->channels_[peer] = c;
  }
  const std::vector<int>& group = options.data_parallel_group;
  if (group.size() > 1) {
    const auto me = std::find(group.begin(), group.end(), options.rank);
    if (me == group.end()) {
      return absl::InvalidArgumentError("rank is not in its data-parallel group");
    }
    VP_ASSIGN_OR_RETURN(
        ncclUniqueId id,
        t->ExchangeId(*redis, absl::StrCat(options.prefix, "/group-", absl::StrJoin(group, "-")),
                      me == group.begin()));
    VP_RETURN_IF_ERROR(
        NcclToStatus(ncclCommInitRank(&t->group_comm_, static_cast<int>(group.size()), id,
                                      static_cast<int>(me - group.begin())),
                     "NCCL data-parallel communicator"));
    VP_RETURN_IF_ERROR(CudaToStatus(
        cudaStreamCreateWithFlags(&t->group_stream_, cudaStreamNonBlocking), "stream"));
  }
  return t;
}

NcclTransport::~NcclTransport() {
  for (auto& [peer, c] : channels_) {
    if (c.comm != nullptr) ncclCommDestroy(c.comm);
    if (c.stream != nullptr) cudaStreamDestroy(c.stream);
  }
  if (group_comm_ != nullptr) ncclCommDestroy(group_comm_);
  if (group_stream_ != nullptr) cudaStreamDestroy(group_stream_);
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::Start(int peer, void* data, size_t bytes,
                                                               bool send) {
  const auto it = channels_.find(peer);
  if (it == channels_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank(), " has no NCCL channel to rank ", peer));
  }
  const Channel& c = it->second;
  VP_RETURN_IF_ERROR(
      NcclToStatus(send ? ncclSend(data, bytes, ncclUint8, c.peer_index, c.comm, c.stream)
                        : ncclRecv(data, bytes, ncclUint8, c.peer_index, c.comm, c.stream),
                   absl::StrCat(send ? "ncclSend to rank " : "ncclRecv from rank ", peer)));
  cudaEvent_t event;
  VP_RETURN_IF_ERROR(
      CudaToStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event"));
  VP_RETURN_IF_ERROR(CudaToStatus(cudaEventRecord(event, c.stream), "event record"));
  return std::unique_ptr<Transfer>(new NcclTransfer(event, c.comm, peer, send));
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartSend(int peer, void* data,
                                                                   size_t bytes) {
  return Start(peer, data, bytes, true);
}

absl::StatusOr<std::unique_ptr<Transfer>> NcclTransport::StartRecv(int peer, void* data,
                                                                   size_t bytes) {
  return Start(peer, data, bytes, false);
}

absl::Status NcclTransport::AllReduceMean(std::span<float> data, const std::vector<int>& group) {
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  if (group != options_.data_parallel_group || group_comm_ == nullptr) {
    return absl::InvalidArgumentError("all-reduce over a group the transport was not built for");
  }
  VP_RETURN_IF_ERROR(NcclToStatus(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat,
                                                ncclAvg, group_comm_, group_stream_),
                                  "ncclAllReduce"));
  return CudaToStatus(cudaStreamSynchronize(group_stream_), "all-reduce");
}

std::string NcclTransport::Describe() const {
  return absl::StrCat("nccl ", NcclRuntimeVersion(), " on cuda:", options_.device, " (rank ",
                      rank(), " of ", size(), ", ", channels_.size(), " peer channels)");
}

}  // namespace varipipe::executor
