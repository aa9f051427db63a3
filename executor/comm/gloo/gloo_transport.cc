#include "executor/comm/gloo/gloo_transport.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "executor/comm/gloo/redis_store.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace varipipe::executor {
namespace {

class GlooTransfer final : public Transfer {
 public:
  GlooTransfer(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, bool send, int peer)
      : buffer_(std::move(buffer)), send_(send), peer_(peer) {}
  absl::Status Wait(absl::Time deadline) override {
    const auto left = std::max(absl::Milliseconds(1), deadline - absl::Now());
    try {
      // Rounded up, so Gloo never gives up before the deadline.
      const std::chrono::milliseconds timeout(absl::ToInt64Milliseconds(left) + 1);
      const bool ok = send_ ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
      if (!ok) return absl::AbortedError(absl::StrCat("transfer with rank ", peer_, " aborted"));
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      if (absl::Now() >= deadline || absl::StrContains(e.what(), "Timed out")) {
        return absl::DeadlineExceededError(
            absl::StrCat(send_ ? "send to" : "receive from", " rank ", peer_, " did not complete"));
      }
      return absl::UnavailableError(
          absl::StrCat(send_ ? "send to" : "receive from", " rank ", peer_, " failed: ", e.what()));
    } catch (const gloo::Exception& e) {
      return absl::UnavailableError(
          absl::StrCat(send_ ? "send to" : "receive from", " rank ", peer_, " failed: ", e.what()));
    }
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  bool send_;
  int peer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GlooTransport>> GlooTransport::Create(const Options& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo transport: rank ", options.rank, " of ", options.size));
  }
  std::unique_ptr<GlooTransport> t(new GlooTransport(options));
  VP_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> redis, RedisClient::Connect(options.redis));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    t->device_ = gloo::transport::tcp::CreateDevice(attr);
    GlooRedisStore store(std::move(redis), options.prefix);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout)));
    context->connectFullMesh(store, t->device_);
    t->context_ = context;
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ",
                                               options.size, " failed: ", e.what()));
  }
  return t;
}

GlooTransport::~GlooTransport() = default;

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartSend(int peer, void* data,
                                                                   size_t bytes) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    return absl::InvalidArgumentError(absl::StrCat("send to rank ", peer, " from rank ", rank()));
  }
  try {
    auto buffer = context_->createUnboundBuffer(data, bytes);
    buffer->send(peer, next_slot_[peer]++);
    return std::unique_ptr<Transfer>(new GlooTransfer(std::move(buffer), true, peer));
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(absl::StrCat("send to rank ", peer, ": ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartRecv(int peer, void* data,
                                                                   size_t bytes) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive from rank ", peer, " on rank ", rank()));
  }
  try {
    auto buffer = context_->createUnboundBuffer(data, bytes);
    buffer->recv(peer, next_slot_[peer]++);
    return std::unique_ptr<Transfer>(new GlooTransfer(std::move(buffer), false, peer));
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(absl::StrCat("receive from rank ", peer, ": ", e.what()));
  }
}

absl::StatusOr<std::shared_ptr<gloo::Context>> GlooTransport::GroupContext(
    const std::vector<int>& group) {
  if (const auto it = groups_.find(group); it != groups_.end()) return it->second;
  const auto me = std::find(group.begin(), group.end(), rank());
  if (me == group.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank(), " is not in group ", absl::StrJoin(group, ",")));
  }
  try {
    VP_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> redis, RedisClient::Connect(options_.redis));
    GlooRedisStore store(std::move(redis),
                         absl::StrCat(options_.prefix, "/group-", absl::StrJoin(group, "-")));
    auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(me - group.begin()),
                                                               static_cast<int>(group.size()));
    context->setTimeout(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.connect_timeout)));
    context->connectFullMesh(store, device_);
    groups_[group] = context;
    return std::shared_ptr<gloo::Context>(context);
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo group ", absl::StrJoin(group, ","), ": ", e.what()));
  }
}

absl::Status GlooTransport::AllReduceMean(std::span<float> data, const std::vector<int>& group) {
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  VP_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context, GroupContext(group));
  try {
    gloo::AllreduceOptions opts(context);
    opts.setOutput(data.data(), data.size());
    void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
    opts.setReduceFunction(gloo::AllreduceOptions::Func(sum));
    gloo::allreduce(opts);
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(
        absl::StrCat("all-reduce over ranks ", absl::StrJoin(group, ","), " failed: ", e.what()));
  }
  const float scale = 1.0f / static_cast<float>(group.size());
  for (float& x : data) x *= scale;
  return absl::OkStatus();
}

std::string GlooTransport::Describe() const {
  return absl::StrCat("gloo tcp ", options_.hostname, " (rank ", rank(), " of ", size(), ")");
}

}  // namespace varipipe::executor
