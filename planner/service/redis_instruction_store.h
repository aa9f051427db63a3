// The Redis instruction store: where planner daemons publish execution plans
// and executors fetch them. docs/instruction-store.md documents the key
// schema; the rules in short (P = key_prefix:job_id):
//
//   P:config, P:config_hash   the job, written once; a daemon with another
//                             config is refused
//   P:token                   the job's secret token for gRPC clients,
//                             written once (docs/security.md)
//   P:stage_layout            an AUTO job's chosen stage layout
//                             (StageLayoutConfig), written once
//   P:claimed                 next iteration never claimed (INCR-like, in Lua)
//   P:unpublished             claimed but unpublished iterations (sorted set)
//   P:lease:<i>               the daemon planning iteration i (expires, so a
//                             crashed daemon's claims are taken over)
//   P:plan:<i>                hash rank:<r> -> serialized PlanEnvelope, plus
//                             "summary"; deleted once every rank acknowledged
//                             it or a later iteration, with a safety TTL
//   P:open                    published iterations not yet retired (sorted
//                             set): what acknowledgement deletes
//   P:fetched:<i>             ranks that fetched iteration i's plan (only
//                             they may report it); deleted with the plan
//   P:acks:<i>                ranks that acknowledged iteration i
//   P:events                  stream of published iterations (bounded), for
//                             blocking waits without polling
//   P:progress                hash rank -> last completed iteration
//   P:reports                 hash rank -> JSON of its last progress report
//                             (per-pass timings; varipipe-ctl status)
//   P:reported:<r>            stream of rank r's reports (bounded), for
//                             WatchPlans to wait on without polling
//   P:published, P:acknowledged   counters
//   P:calibration             the job's CalibrationState (binary protobuf),
//                             updated optimistically (WATCH/MULTI/EXEC)
//   P:predictions             list of "iteration predicted_ms measured_ms"
//                             of recent iterations, newest first (bounded)
//
// Claims and publication are Lua scripts, so each iteration is published
// exactly once: publication succeeds only while the publisher holds the
// lease and no plan exists.
//
// Thread safety: one instance per thread (it owns one Redis connection).
#ifndef VARIPIPE_PLANNER_SERVICE_REDIS_INSTRUCTION_STORE_H_
#define VARIPIPE_PLANNER_SERVICE_REDIS_INSTRUCTION_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe::service {

struct StoreOptions {
  std::string key_prefix = "varipipe";
  std::string job_id;
  int world_size = 1;
  uint64_t total_iterations = 0;
  absl::Duration lease = absl::Seconds(30);
  absl::Duration plan_ttl = absl::Hours(24);
  int64_t events_max_length = 10000;
};

struct StoreCounters {
  uint64_t claimed = 0;  // iterations ever claimed (the next new one)
  uint64_t published = 0;
  uint64_t acknowledged = 0;  // iterations acknowledged by every rank
  uint64_t unpublished = 0;   // claimed, not yet published
  uint64_t min_progress = 0;  // iterations completed by every rank
};

// One iteration's predicted and measured time (rank 0's report).
struct PredictionRecord {
  uint64_t iteration = 0;
  double predicted_ms = 0;
  double measured_ms = 0;
};

// A stable hex digest of a config (FNV-1a 64 of its deterministic
// serialization); equal configs have equal digests.
std::string ConfigHash(const v1::JobConfig& config);

class RedisInstructionStore {
 public:
  static absl::StatusOr<std::unique_ptr<RedisInstructionStore>> Open(
      const RedisClient::Options& redis, const StoreOptions& options);

  // Writes the job config if none is stored; otherwise checks it matches
  // (FAILED_PRECONDITION naming both digests and the first differing field).
  absl::Status RegisterJob(const v1::JobConfig& config);
  // Stores `candidate` as the job's token unless the job has one, and
  // returns the stored token. With `must_match` (a daemon given
  // --token_file), another stored token is FAILED_PRECONDITION.
  absl::StatusOr<std::string> RegisterToken(const std::string& candidate, bool must_match);
  // The job's stage layout (parallelism.stage_layout AUTO): the stored one,
  // or NOT_FOUND when no daemon chose one yet.
  absl::StatusOr<v1::StageLayoutConfig> LoadStageLayout();
  // Stores `chosen` unless the job has a layout, and returns the stored one
  // (the first daemon's choice holds for the whole job).
  absl::StatusOr<v1::StageLayoutConfig> RegisterStageLayout(const v1::StageLayoutConfig& chosen);
  // The stored job config; NOT_FOUND when none.
  absl::StatusOr<v1::JobConfig> LoadJob();

  // Claims an iteration below `limit` for `planner_id`: first one whose
  // planner died (unpublished, lease expired), else the next new one.
  // nullopt when nothing may be claimed now (limit reached or job done).
  absl::StatusOr<std::optional<uint64_t>> Claim(const std::string& planner_id, uint64_t limit);
  // Claims a specific iteration when it is neither published nor leased
  // (on-demand planning for a waiting executor). True when claimed.
  absl::StatusOr<bool> ClaimIteration(uint64_t iteration, const std::string& planner_id);
  // Publishes every rank's serialized PlanEnvelope if `planner_id` still
  // holds the lease and the iteration is unpublished. True on success.
  absl::StatusOr<bool> Publish(uint64_t iteration, const std::vector<std::string>& envelopes,
                               const std::string& summary_json, const std::string& planner_id);

  // A rank's serialized PlanEnvelope, nullopt when not published (or gone).
  absl::StatusOr<std::optional<std::string>> GetPlan(uint64_t iteration, int rank);
  // The same, waiting up to `timeout` for publication (blocking stream
  // reads, no polling).
  absl::StatusOr<std::optional<std::string>> WaitPlan(uint64_t iteration, int rank,
                                                      absl::Duration timeout);
  // Waits up to `timeout` (blocking stream reads, no polling) until `rank`
  // has reported `iteration` or a later one; true once it has.
  absl::StatusOr<bool> WaitForReport(int rank, uint64_t iteration, absl::Duration timeout);
  // Records that `rank` has its plan; once every rank did, deletes the plan
  // and those of earlier iterations still stored (see CheckedReport).
  absl::Status Acknowledge(uint64_t iteration, int rank);
  // Records that `rank` fetched the plan of `iteration`: it may report it.
  absl::Status RecordFetch(uint64_t iteration, int rank);
  // A rank's report that it completed `iteration`, checked and applied
  // atomically: acknowledges the plan and records the progress and the JSON
  // report. Once every rank acknowledged an iteration, its plan is deleted,
  // and so is every stored plan of an earlier iteration (no rank needs it:
  // ranks run iterations in order), e.g. plans made again after Redis lost
  // its data mid-run; each deleted plan counts as acknowledged. PERMISSION_DENIED when the
  // rank never fetched the iteration's plan; FAILED_PRECONDITION when the
  // iteration is beyond the one the rank is due to run next (its last
  // report + 1). A rejected report changes nothing.
  absl::Status CheckedReport(uint64_t iteration, int rank, const std::string& report_json);
  // Records that `rank` completed `iteration`, with a JSON report.
  absl::Status ReportProgress(int rank, uint64_t iteration, const std::string& report_json);
  // Per-rank last completed iteration (ranks that never reported absent).
  absl::StatusOr<std::vector<std::pair<int, uint64_t>>> Progress();
  absl::StatusOr<StoreCounters> Counters();
  // True when the iteration's plan exists.
  absl::StatusOr<bool> IsPublished(uint64_t iteration);

  // The job's calibration state (planner/cost/calibration.h); the empty
  // state (version 0) when there is none yet.
  absl::StatusOr<v1::CalibrationState> LoadCalibration();
  // Applies `update` to the stored state atomically: optimistic, retried
  // when another daemon wrote the state in between. `update` returns false
  // to leave it as it is.
  absl::Status UpdateCalibration(const std::function<bool(v1::CalibrationState*)>& update);
  // Records an iteration's predicted and measured time; the newest
  // kPredictionWindow are kept.
  static constexpr int kPredictionWindow = 100;
  absl::Status RecordPrediction(const PredictionRecord& record);
  // The recorded predictions, newest first.
  absl::StatusOr<std::vector<PredictionRecord>> Predictions();

  RedisClient& redis() { return *redis_; }
  std::string Key(const std::string& suffix) const;
  std::string Prefix() const;

 private:
  RedisInstructionStore(std::unique_ptr<RedisClient> redis, const StoreOptions& options)
      : redis_(std::move(redis)), options_(options) {}

  std::unique_ptr<RedisClient> redis_;
  StoreOptions options_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_REDIS_INSTRUCTION_STORE_H_
