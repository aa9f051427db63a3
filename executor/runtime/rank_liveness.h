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
//   PREFIX/first_failure   the launch's first failure ("rank 0 failed: ..."
//                          or "rank 3 stopped without reporting an error
//                          ..."), set once (SET NX) by the rank that failed
//                          of its own accord or by the first watch that
//                          found a rank silent
// A rank whose `alive` key lapsed without `failed` or `done` stopped without
// a word: killed, crashed, hung (SIGSTOP, a stuck kernel) or unreachable. A
// rank with no `started` key never joined: it failed before it knew the
// job's Redis (its own log says why), or has not started yet. Diagnoses
// blame only these two kinds; a rank that reported is named with its error.
//
// WatchPeers() turns this into an end for every rank: each rank polls the
// others and, the first time one failed or went silent, learns the launch's
// first failure, so that no rank waits for a peer that will never come
// (a replica that has not reached the data-parallel all-reduce yet, say).
// Keys belong to one launch: a relaunch must use a fresh run id (torchrun
// and mpirun give one), or it would meet the last launch's reports.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_RANK_LIVENESS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_RANK_LIVENESS_H_

#include <functional>
#include <map>
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
  // How often WatchPeers() polls the other ranks.
  absl::Duration watch_interval = absl::Milliseconds(500);
};

class RankLiveness {
 public:
  // Publishes this rank's first heartbeat and starts refreshing it.
  static absl::StatusOr<std::unique_ptr<RankLiveness>> Start(const LivenessOptions& options);
  ~RankLiveness();  // stops refreshing (the key then lapses unless Done/Failed)
  RankLiveness(const RankLiveness&) = delete;
  RankLiveness& operator=(const RankLiveness&) = delete;

  // Records how this rank ends, and stops the watch. Best effort: Redis may
  // be gone too. A failure of this rank's own (`first_candidate`; not one
  // that only followed a peer's) also claims PREFIX/first_failure unless a
  // failure is already there.
  void ReportDone();
  void ReportFailure(const std::string& reason, bool first_candidate = true);

  // Watches the other ranks from now on (its own thread and connection),
  // every `watch_interval`: the first time the launch has a first failure
  // that is not this rank's, a peer reported a failure, or a peer's
  // heartbeat stays lapsed (no `done`, no report) on polls at least two
  // `interval`s apart, calls `on_peer_failure` once, on the watch's thread,
  // with a description naming that rank ("rank 0 failed: ...", "rank 3
  // stopped without reporting an error ..."). Redis errors only log.
  void WatchPeers(std::function<void(const std::string&)> on_peer_failure);

  // After this rank failed: waits up to `patience` for another rank to be
  // found silent (its heartbeat lapsed) and describes the other ranks that
  // are silent, never joined or failed, e.g. "rank 3 stopped without
  // reporting an error (killed, crashed, hung or unreachable); rank 1
  // failed: ...". Ranks that have not joined get the whole `patience` to
  // report. Empty when every other rank looks healthy until the end of
  // `patience`. `until_first_finding`: returns as soon as one rank failed or
  // is silent (to name the cause before reporting this rank's own failure).
  std::string DiagnosePeers(absl::Duration patience, bool until_first_finding = false);

 private:
  RankLiveness(LivenessOptions options, std::unique_ptr<RedisClient> redis)
      : options_(std::move(options)), redis_(std::move(redis)) {}
  std::string Key(const char* kind, int rank) const;
  void Refresh(RedisClient& redis);
  void StopWatch();
  // One poll of the watch: the description of a peer's failure, or "".
  // `silent_since`: when each peer was first seen silent, on earlier polls.
  std::string PollPeers(RedisClient& redis, std::map<int, absl::Time>& silent_since);

  LivenessOptions options_;
  std::unique_ptr<RedisClient> redis_;  // Report*/Diagnose (the caller's thread)
  absl::Notification stop_;
  std::thread refresher_;  // own connection
  absl::Notification stop_watch_;
  std::thread watcher_;  // own connection
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_RANK_LIVENESS_H_
