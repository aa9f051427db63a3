// Every key of a job in the Redis instruction store, named in one place
// for the C++ code and for the store's Lua scripts (the model is LevelDB's
// filename.h). docs/instruction-store.md documents the schema; P is
// key_prefix:job_id:
//
//   P:config, P:config_hash   the job, written once; a daemon with another
//                             config is refused
//   P:token                   the job's secret token for gRPC clients,
//                             written once (docs/security.md; executors read
//                             it too: common/auth/job_token.h)
//   P:stage_layout            an AUTO job's chosen stage layout
//                             (StageLayoutConfig), written once
//   P:claimed                 next iteration never claimed
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
#ifndef VARIPIPE_PLANNER_SERVICE_STORE_KEYS_H_
#define VARIPIPE_PLANNER_SERVICE_STORE_KEYS_H_

#include <cstdint>
#include <string>

namespace varipipe::service {

class StoreKeys {
 public:
  StoreKeys(const std::string& key_prefix, const std::string& job_id);

  // P, which the Lua scripts receive as ARGV[1].
  const std::string& prefix() const { return prefix_; }

  std::string Config() const;
  std::string ConfigHash() const;
  std::string Token() const;
  std::string StageLayout() const;
  std::string Claimed() const;
  std::string Unpublished() const;
  std::string Lease(uint64_t iteration) const;
  std::string Plan(uint64_t iteration) const;
  std::string Open() const;
  std::string Fetched(uint64_t iteration) const;
  std::string Acks(uint64_t iteration) const;
  std::string Events() const;
  std::string Progress() const;
  std::string Reports() const;
  std::string Reported(int rank) const;
  std::string Published() const;
  std::string Acknowledged() const;
  std::string Calibration() const;
  std::string Predictions() const;

  // Fields of a P:plan:<i> hash.
  static std::string PlanRankField(int rank);  // "rank:<r>"
  static constexpr char kPlanSummaryField[] = "summary";

  // Lua that defines `K` from `p` (P, in scope before it): K.config ..
  // K.predictions are the job's keys, K.lease(i), K.plan(i), K.fetched(i),
  // K.acks(i) and K.reported(r) the numbered ones, K.rank_field(r) a plan's
  // rank field and K.summary_field its summary field: the scripts name
  // keys only through it.
  static std::string LuaKeys();

 private:
  std::string Of(const char* name) const;
  std::string Of(const char* name, uint64_t index) const;

  std::string key_prefix_;
  std::string job_id_;
  std::string prefix_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_STORE_KEYS_H_
