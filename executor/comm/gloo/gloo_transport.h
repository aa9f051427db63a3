// The CPU transport: Gloo over TCP, rendezvous through the job's Redis.
//
// Point-to-point transfers are Gloo unbound-buffer sends and receives. Each
// pair of ranks numbers its transfers (both directions share the count):
// the k-th transfer a rank starts towards a peer uses slot k, which matches
// the peer's k-th (transport.h's channel order). Data-parallel all-reduce
// runs on a Gloo context per group, connected on first use.
#ifndef VARIPIPE_EXECUTOR_COMM_GLOO_GLOO_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_GLOO_GLOO_TRANSPORT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "executor/comm/transport.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
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
  };

  // Connects to every other rank (blocking until all have started).
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Create(const Options& options);
  ~GlooTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override;
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) override;
  std::string Describe() const override;

 private:
  explicit GlooTransport(const Options& options) : options_(options) {}
  absl::StatusOr<std::shared_ptr<gloo::Context>> GroupContext(const std::vector<int>& group);

  Options options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::map<int, uint64_t> next_slot_;  // per peer
  std::map<std::vector<int>, std::shared_ptr<gloo::Context>> groups_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_GLOO_GLOO_TRANSPORT_H_
