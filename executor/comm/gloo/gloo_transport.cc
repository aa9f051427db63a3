#include "executor/comm/gloo/gloo_transport.h"

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "executor/comm/gloo/redis_store.h"
#include "executor/runtime/fault_injection.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace varipipe::executor {
namespace {

using AbortState = GlooTransport::AbortState;

// CANCELLED naming `what` and the abort's reason once aborted, else OK.
absl::Status Aborted(AbortState& state, absl::string_view what) {
  if (!state.aborted.load()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(state.mu);
  return absl::CancelledError(absl::StrCat(what, ": ", state.reason));
}

// Waits until `buffer`'s send (or receive) completed or `deadline` passed
// (DEADLINE_EXCEEDED), the peer failed (UNAVAILABLE), or the transport was
// aborted (CANCELLED: Abort() ends the wait in progress).
absl::Status WaitBuffer(AbortState& state, gloo::transport::UnboundBuffer& buffer, bool send,
                        absl::Time deadline, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.aborted.load()) return absl::CancelledError(absl::StrCat(what, ": ", state.reason));
    state.waiting.emplace_back(&buffer, send);
  }
  const absl::Cleanup done = [&state, &buffer] {
    std::lock_guard<std::mutex> lock(state.mu);
    std::erase_if(state.waiting, [&buffer](const auto& w) { return w.first == &buffer; });
  };
  const auto left = std::max(absl::Milliseconds(1), deadline - absl::Now());
  try {
    // Rounded up, so Gloo never gives up before the deadline.
    const std::chrono::milliseconds timeout(absl::ToInt64Milliseconds(left) + 1);
    const bool ok = send ? buffer.waitSend(timeout) : buffer.waitRecv(timeout);
    if (!ok) {
      VP_RETURN_IF_ERROR(Aborted(state, what));
      return absl::AbortedError(absl::StrCat(what, " aborted"));
    }
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    VP_RETURN_IF_ERROR(Aborted(state, what));
    if (absl::Now() >= deadline || absl::StrContains(e.what(), "Timed out")) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete"));
    }
    return absl::UnavailableError(absl::StrCat(what, " failed: ", e.what()));
  } catch (const gloo::Exception& e) {
    VP_RETURN_IF_ERROR(Aborted(state, what));
    return absl::UnavailableError(absl::StrCat(what, " failed: ", e.what()));
  }
}

// Meets the other ranks of a context in two phases: first every rank
// announces itself in the store and waits until all have, up to `timeout`
// (polling, so a cancellation ends it); then the ranks exchange addresses
// and connect. Gloo waits up to five times a context's timeout for a pair's
// initial connection, and nothing can cancel that wait: since every rank
// has arrived by then, connecting takes moments, a context timeout of at
// most 2 s bounds what a rank that dies in between costs its peers to 10 s,
// and a rank cancelled in between still connects (its store waits honour
// the cancellation only after 5 s) rather than leave its peers connecting
// to nobody.
void ConnectFullMesh(gloo::rendezvous::Context& context, GlooRedisStore& store,
                     std::shared_ptr<gloo::transport::Device>& device, absl::Duration timeout) {
  const auto chrono = [](absl::Duration d) {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  };
  store.set(absl::StrCat("arrived/", context.rank), {'1'});
  std::vector<std::string> arrivals;
  for (int r = 0; r < context.size; ++r) arrivals.push_back(absl::StrCat("arrived/", r));
  store.wait(arrivals, chrono(timeout));
  store.SetCancelGrace(absl::Seconds(5));
  context.setTimeout(chrono(std::clamp(timeout / 5, absl::Seconds(1), absl::Seconds(2))));
  context.connectFullMesh(store, device);
}

class GlooTransfer final : public Transfer {
 public:
  GlooTransfer(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, bool send, int peer,
               std::shared_ptr<AbortState> abort)
      : buffer_(std::move(buffer)), send_(send), peer_(peer), abort_(std::move(abort)) {}
  absl::Status Wait(absl::Time deadline) override {
    return WaitBuffer(*abort_, *buffer_, send_, deadline,
                      absl::StrCat(send_ ? "send to" : "receive from", " rank ", peer_));
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  bool send_;
  int peer_;
  std::shared_ptr<AbortState> abort_;
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
    GlooRedisStore store(std::move(redis), options.prefix, options.cancelled);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    ConnectFullMesh(*context, store, t->device_, options.connect_timeout);
    // A rank's connectFullMesh can return while a peer still completes its
    // side of their connection; a rank that then closes at once (refusing
    // its plan, say) would fail that peer's rendezvous with "connection
    // closed". Past this barrier every rank has connected, so leaving is
    // safe.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout)));
    gloo::barrier(barrier);
    t->context_ = context;
  } catch (const gloo::Exception& e) {
    if (options.cancelled && options.cancelled()) {
      return absl::CancelledError(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ",
                                               options.size, " cancelled: ", e.what()));
    }
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ",
                                               options.size, " failed: ", e.what()));
  }
  return t;
}

GlooTransport::~GlooTransport() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_changed_.notify_all();
  if (collective_thread_.joinable()) collective_thread_.join();
}

void GlooTransport::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_->mu);
  if (abort_->aborted.load()) return;
  abort_->reason = reason;
  abort_->aborted.store(true);
  // Each thread waits on at most one buffer at a time; later waits see
  // `aborted`.
  for (const auto& [buffer, send] : abort_->waiting) {
    if (send) {
      buffer->abortWaitSend();
    } else {
      buffer->abortWaitRecv();
    }
  }
}

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartSend(int peer, void* data,
                                                                   size_t bytes) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    return absl::InvalidArgumentError(absl::StrCat("send to rank ", peer, " from rank ", rank()));
  }
  VP_RETURN_IF_ERROR(Aborted(*abort_, absl::StrCat("send to rank ", peer)));
  try {
    auto buffer = context_->createUnboundBuffer(data, bytes);
    buffer->send(peer, next_slot_[peer]++);
    return std::unique_ptr<Transfer>(new GlooTransfer(std::move(buffer), true, peer, abort_));
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
  VP_RETURN_IF_ERROR(Aborted(*abort_, absl::StrCat("receive from rank ", peer)));
  try {
    auto buffer = context_->createUnboundBuffer(data, bytes);
    buffer->recv(peer, next_slot_[peer]++);
    return std::unique_ptr<Transfer>(new GlooTransfer(std::move(buffer), false, peer, abort_));
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(absl::StrCat("receive from rank ", peer, ": ", e.what()));
  }
}

absl::StatusOr<GlooTransport::Group*> GlooTransport::GroupContext(const std::vector<int>& group) {
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    if (const auto it = groups_.find(group); it != groups_.end()) return &it->second;
  }
  const auto me = std::find(group.begin(), group.end(), rank());
  if (me == group.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank(), " is not in group ", absl::StrJoin(group, ",")));
  }
  try {
    VP_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> redis, RedisClient::Connect(options_.redis));
    GlooRedisStore store(std::move(redis),
                         absl::StrCat(options_.prefix, "/group-", absl::StrJoin(group, "-")),
                         [abort = abort_] { return abort->aborted.load(); });
    auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(me - group.begin()),
                                                               static_cast<int>(group.size()));
    // The group meets at its first collective: bounded as a collective (the
    // watchdog), not as the launch's rendezvous, since every rank of the
    // group is past that.
    ConnectFullMesh(*context, store, device_,
                    std::min(options_.connect_timeout, options_.collective_timeout));
    std::lock_guard<std::mutex> lock(groups_mu_);
    return &(groups_[group] = Group{.context = context});
  } catch (const gloo::Exception& e) {
    VP_RETURN_IF_ERROR(Aborted(*abort_, absl::StrCat("gloo group ", absl::StrJoin(group, ","))));
    return absl::UnavailableError(
        absl::StrCat("gloo group ", absl::StrJoin(group, ","), ": ", e.what()));
  }
}

// The ring of every collective. Chunk c of `data` is [begin(c),
// begin(c + 1)) with begin(c) = size * c / n (chunks may be empty). Rank
// `me` owns chunk `owned` = me + shift (mod n): a reduce-scatter leaves the
// sum of that chunk with it, an all-gather starts from it. Each pass takes
// n - 1 steps of one slot each (both neighbours number them alike); every
// chunk is summed in one fixed order, so every rank gets the same bits.
absl::Status GlooTransport::Ring(std::span<float> data, const std::vector<int>& group,
                                 bool reduce_scatter, bool all_gather, int shift,
                                 const std::string& what) {
  VP_RETURN_IF_ERROR(Aborted(*abort_, what));
  VP_ASSIGN_OR_RETURN(Group * g, GroupContext(group));
  gloo::Context& context = *g->context;
  const int n = context.size;
  const int me = context.rank;
  const int right = (me + 1) % n;
  const int left = (me + n - 1) % n;
  const int owned = me + shift;
  const auto begin = [&](int c) { return data.size() * static_cast<size_t>(c) / n; };
  const auto bytes = [&](int c) { return (begin(c + 1) - begin(c)) * sizeof(float); };
  const auto chunk = [n](int c) { return ((c % n) + n) % n; };
  std::vector<float> incoming(reduce_scatter ? data.size() / n + 1 : 0);
  const uint64_t first_slot = g->next_slot;
  g->next_slot += static_cast<uint64_t>(n - 1) * ((reduce_scatter ? 1 : 0) + (all_gather ? 1 : 0));
  try {
    std::unique_ptr<gloo::transport::UnboundBuffer> mine =
        context.createUnboundBuffer(data.data(), data.size() * sizeof(float));
    std::unique_ptr<gloo::transport::UnboundBuffer> in =
        reduce_scatter
            ? context.createUnboundBuffer(incoming.data(), incoming.size() * sizeof(float))
            : nullptr;
    // One step: send chunk `out` to the right, receive chunk `into` from the
    // left (into `incoming`, or in place), each bounded and abortable.
    uint64_t slot = first_slot;
    const auto step = [&](int out, int into, bool in_place) -> absl::Status {
      const uint64_t this_slot = slot++;
      const absl::Time deadline = absl::Now() + options_.collective_timeout;
      if (bytes(into) > 0) {
        if (in_place) {
          mine->recv(left, this_slot, begin(into) * sizeof(float), bytes(into));
        } else {
          in->recv(left, this_slot, 0, bytes(into));
        }
      }
      if (bytes(out) > 0) mine->send(right, this_slot, begin(out) * sizeof(float), bytes(out));
      if (bytes(into) > 0) {
        VP_RETURN_IF_ERROR(WaitBuffer(*abort_, in_place ? *mine : *in, false, deadline,
                                      absl::StrCat(what, ": receive from rank ", group[left])));
      }
      if (bytes(out) > 0) {
        VP_RETURN_IF_ERROR(WaitBuffer(*abort_, *mine, true, deadline,
                                      absl::StrCat(what, ": send to rank ", group[right])));
      }
      return absl::OkStatus();
    };
    // Test-only fault points (executor/runtime/fault_injection.h): inside a
    // collective, once the group met.
    const bool all_reduce = reduce_scatter && all_gather;
    if (!all_reduce) VP_RETURN_IF_ERROR(MaybeInjectFault(FaultPoint::kInShardedCollective));
    // Reduce-scatter: at step s, pass on the partial sum of chunk
    // owned - 1 - s and add the left's partial sum of chunk owned - 2 - s;
    // after n - 1 steps this rank holds the whole sum of chunk `owned`.
    for (int s = 0; reduce_scatter && s < n - 1; ++s) {
      const int into = chunk(owned - 2 - s);
      VP_RETURN_IF_ERROR(step(chunk(owned - 1 - s), into, /*in_place=*/false));
      float* target = data.data() + begin(into);
      for (size_t k = 0; k < begin(into + 1) - begin(into); ++k) target[k] += incoming[k];
    }
    if (all_reduce) VP_RETURN_IF_ERROR(MaybeInjectFault(FaultPoint::kInAllReduce));
    // All-gather: the owned chunks travel around the ring.
    for (int s = 0; all_gather && s < n - 1; ++s) {
      VP_RETURN_IF_ERROR(step(chunk(owned - s), chunk(owned - 1 - s), /*in_place=*/true));
    }
  } catch (const gloo::Exception& e) {
    VP_RETURN_IF_ERROR(Aborted(*abort_, what));
    return absl::UnavailableError(absl::StrCat(what, " failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status GlooTransport::AllReduceSum(std::span<float> data, const std::vector<int>& group) {
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  return Ring(data, group, /*reduce_scatter=*/true, /*all_gather=*/true, /*shift=*/1,
              absl::StrCat("all-reduce over ranks ", absl::StrJoin(group, ",")));
}

absl::Status GlooTransport::AllReduceMean(std::span<float> data, const std::vector<int>& group) {
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  VP_RETURN_IF_ERROR(AllReduceSum(data, group));
  const float scale = 1.0f / static_cast<float>(group.size());
  for (float& x : data) x *= scale;
  return absl::OkStatus();
}

namespace {

// The state a started collective shares with the collective thread.
struct PendingCollective {
  std::mutex mu;
  std::condition_variable done_changed;
  bool done = false;    // guarded by mu
  absl::Status status;  // guarded by mu
};

class GlooCollectiveTransfer final : public Transfer {
 public:
  GlooCollectiveTransfer(std::shared_ptr<PendingCollective> pending, std::string what)
      : pending_(std::move(pending)), what_(std::move(what)) {}
  // The collective's own steps are bounded by the collective timeout; this
  // bounds the wait for it (queued behind others) by the caller's deadline.
  absl::Status Wait(absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(pending_->mu);
    while (!pending_->done) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(what_, " did not complete"));
      }
      pending_->done_changed.wait_for(
          lock, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
    }
    return pending_->status;
  }

 private:
  std::shared_ptr<PendingCollective> pending_;
  std::string what_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartOnCollectiveThread(
    const std::string& what, std::function<absl::Status()> collective) {
  auto pending = std::make_shared<PendingCollective>();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) return absl::FailedPreconditionError(absl::StrCat(what, ": transport closed"));
    queue_.push_back([collective = std::move(collective), pending] {
      const absl::Status status = collective();
      {
        std::lock_guard<std::mutex> done_lock(pending->mu);
        pending->done = true;
        pending->status = status;
      }
      pending->done_changed.notify_all();
    });
    if (!collective_thread_.joinable()) {
      collective_thread_ = std::thread([this] {
        while (true) {
          std::function<void()> next;
          {
            std::unique_lock<std::mutex> queue_lock(queue_mu_);
            queue_changed_.wait(queue_lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, nothing left
            next = std::move(queue_.front());
            queue_.pop_front();
          }
          next();
        }
      });
    }
  }
  queue_changed_.notify_all();
  return std::unique_ptr<Transfer>(new GlooCollectiveTransfer(pending, what));
}

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartAllReduceMean(
    std::span<float> data, const std::vector<int>& group) {
  return StartOnCollectiveThread(
      absl::StrCat("all-reduce over ranks ", absl::StrJoin(group, ",")),
      [this, data, group] { return AllReduceMean(data, group); });
}

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartReduceScatterSum(
    std::span<float> data, const std::vector<int>& group) {
  return StartOnCollectiveThread(
      absl::StrCat("reduce-scatter over ranks ", absl::StrJoin(group, ",")),
      [this, data, group] { return ReduceScatterSum(data, group); });
}

absl::StatusOr<std::unique_ptr<Transfer>> GlooTransport::StartAllGather(
    std::span<float> data, const std::vector<int>& group) {
  return StartOnCollectiveThread(
      absl::StrCat("all-gather over ranks ", absl::StrJoin(group, ",")),
      [this, data, group] { return AllGather(data, group); });
}

absl::Status GlooTransport::ReduceScatterSum(std::span<float> data, const std::vector<int>& group) {
  if (data.size() % std::max<size_t>(1, group.size()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter of ", data.size(), " values over ", group.size(), " ranks"));
  }
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  return Ring(data, group, /*reduce_scatter=*/true, /*all_gather=*/false, /*shift=*/0,
              absl::StrCat("reduce-scatter over ranks ", absl::StrJoin(group, ",")));
}

absl::Status GlooTransport::AllGather(std::span<float> data, const std::vector<int>& group) {
  if (data.size() % std::max<size_t>(1, group.size()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-gather of ", data.size(), " values over ", group.size(), " ranks"));
  }
  if (group.size() <= 1 || data.empty()) return absl::OkStatus();
  return Ring(data, group, /*reduce_scatter=*/false, /*all_gather=*/true, /*shift=*/0,
              absl::StrCat("all-gather over ranks ", absl::StrJoin(group, ",")));
}

std::string GlooTransport::Describe() const {
  return absl::StrCat("gloo tcp ", options_.hostname, " (rank ", rank(), " of ", size(), ")");
}

}  // namespace varipipe::executor
