// The CPU transport: Gloo over TCP, rendezvous through the job's Redis.
//
// Point-to-point transfers are Gloo unbound-buffer sends and receives. Each
// pair of ranks numbers its transfers (both directions share the count):
// the k-th transfer a rank starts towards a peer uses slot k, which matches
// the peer's k-th (transport.h's channel order). Data-parallel all-reduce
// is a ring all-reduce (reduce-scatter, then all-gather; every chunk is
// summed in one fixed order, so every rank gets the same bits) over
// unbound buffers on a Gloo context per group, connected on first use;
// ReduceScatterSum and AllGather are its two halves.
//
// StartAllReduceMean, StartReduceScatterSum and StartAllGather run on the
// transport's collective thread, one collective after another in the order
// they were started (the data-parallel gradient buckets, ZeRO stage 1's
// reduce-scatters and gathers), while the driving thread goes on; its
// groups' contexts are not used by the driving thread meanwhile (the
// interpreter waits for every bucket before its next collective over the
// same group).
//
// Every wait is on an unbound buffer of ours, so Abort() can end the ones in
// progress (Gloo's abortWaitSend/abortWaitRecv) from another thread; the
// rendezvous polls Options::cancelled.
#ifndef VARIPIPE_EXECUTOR_COMM_GLOO_GLOO_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_GLOO_GLOO_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "executor/comm/transport.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace varipipe::executor {

class GlooTransport final : public Transport {
 public:
  struct Options {
    RedisClient::Options redis;
    // Namespace of the rendezvous keys: unique per job run (job id and a
    // run id), so a restarted job does not meet stale keys.
    std::string prefix;
    int rank = 0;
    int size = 1;
    // Address this rank listens on.
    std::string hostname = "127.0.0.1";
    absl::Duration connect_timeout = absl::Seconds(300);
    // Bounds each step of an all-reduce.
    absl::Duration collective_timeout = absl::Seconds(300);
    // Polled while ranks meet: true ends the rendezvous with CANCELLED.
    std::function<bool()> cancelled;
  };
  // Whether the transport was aborted, and the wait in progress that an
  // Abort() ends; shared with the transfers.
  struct AbortState {
    std::atomic<bool> aborted{false};
    std::mutex mu;
    std::string reason;  // guarded by mu
    // The waits in progress (the driving thread's and the collective
    // thread's), and whether each is a send; guarded by mu.
    std::vector<std::pair<gloo::transport::UnboundBuffer*, bool>> waiting;
  };

  // Connects to every other rank; returns only once every rank has
  // connected (a barrier), so closing the transport right away never fails
  // a peer's rendezvous.
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Create(const Options& options);
  ~GlooTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override;
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllReduceMean(
      std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllReduceSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status ReduceScatterSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllGather(std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartReduceScatterSum(
      std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllGather(std::span<float> data,
                                                           const std::vector<int>& group) override;
  std::string Describe() const override;
  void Abort(const std::string& reason) override;

 private:
  struct Group {
    std::shared_ptr<gloo::Context> context;
    uint64_t next_slot = 0;  // the slots of the next all-reduce
  };
  explicit GlooTransport(const Options& options) : options_(options) {}
  absl::StatusOr<Group*> GroupContext(const std::vector<int>& group);
  // A ring reduce-scatter and/or all-gather over `group` (gloo_transport.cc).
  absl::Status Ring(std::span<float> data, const std::vector<int>& group, bool reduce_scatter,
                    bool all_gather, int shift, const std::string& what);
  // Queues `collective` (named `what`) on the collective thread, starting
  // the thread at first use.
  absl::StatusOr<std::unique_ptr<Transfer>> StartOnCollectiveThread(
      const std::string& what, std::function<absl::Status()> collective);

  Options options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::map<int, uint64_t> next_slot_;  // per peer
  std::mutex groups_mu_;               // guards the map (not the groups' contexts)
  std::map<std::vector<int>, Group> groups_;
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
  // The collective thread (started by the first Start of a collective) and
  // its queue of collectives, run in order.
  std::mutex queue_mu_;
  std::condition_variable queue_changed_;
  std::deque<std::function<void()>> queue_;  // guarded by queue_mu_
  bool stopping_ = false;                    // guarded by queue_mu_
  std::thread collective_thread_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_GLOO_GLOO_TRANSPORT_H_
