// Which ranks of a launch are alive, through the job's Redis, so that a rank
// whose transfer failed (or whose watchdog fired) can name the rank that
// died instead of only the peer it talked to.
//
// Keys under PREFIX (the launch's rendezvous prefix, so a relaunch starts
// clean):
//   PREFIX/started/<rank>  set when a rank's heartbeats start (before the
//                          rendezvous)
//   PREFIX/alive/<rank>    refreshed every `interval`, expires after `ttl`
//   PREFIX/failed/<rank>   the error a rank exited with (start-up failures
//                          and stops on a signal included)
//   PREFIX/done/<rank>     set when a rank finished its iterations
// A rank whose `alive` key lapsed without `failed` or `done` stopped without
// a word: killed, crashed, hung (SIGSTOP, a stuck kernel) or unreachable. A
// rank with no `started` key never joined: it failed before it knew the
// job's Redis (its own log says why), or has not started yet. Diagnoses
// blame only these two kinds; a rank that reported is named with its error.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_RANK_LIVENESS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_RANK_LIVENESS_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"

namespace varipipe::executor {

struct LivenessOptions {
  RedisClient::Options redis;
  std::string prefix;
  int rank = 0;
  int world_size = 1;
  absl::Duration interval = absl::Seconds(1);
  absl::Duration ttl = absl::Seconds(3);
};

class RankLiveness {
 public:
  // Publishes this rank's first heartbeat and starts refreshing it.
  static absl::StatusOr<std::unique_ptr<RankLiveness>> Start(const LivenessOptions& options);
  ~RankLiveness();  // stops refreshing (the key then lapses unless Done/Failed)
  RankLiveness(const RankLiveness&) = delete;
  RankLiveness& operator=(const RankLiveness&) = delete;

  // Records how this rank ends. Best effort: Redis may be gone too.
  void ReportDone();
  void ReportFailure(const std::string& reason);

  // After this rank failed: waits up to `patience` for another rank to be
  // found silent (its heartbeat lapsed) and describes the other ranks that
  // are silent, never joined or failed, e.g. "rank 3 stopped without
  // reporting an error (killed, crashed, hung or unreachable); rank 1
  // failed: ...". Ranks that have not joined get the whole `patience` to
  // report. Empty when every other rank looks healthy until the end of
  // `patience`.
  std::string DiagnosePeers(absl::Duration patience);

 private:
  RankLiveness(LivenessOptions options, std::unique_ptr<RedisClient> redis)
      : options_(std::move(options)), redis_(std::move(redis)) {}
  std::string Key(const char* kind, int rank) const;
  void Refresh(RedisClient& redis);

  LivenessOptions options_;
  std::unique_ptr<RedisClient> redis_;  // Report*/Diagnose (the caller's thread)
  absl::Notification stop_;
  std::thread refresher_;  // own connection
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_RANK_LIVENESS_H_
