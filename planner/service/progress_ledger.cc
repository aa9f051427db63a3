#include "planner/service/progress_ledger.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "hiredis/hiredis.h"
#include "planner/service/store_script.h"

namespace varipipe::service {
namespace {

// Retires iteration i once every rank acknowledged it, and with it every
// open plan of an earlier iteration: every rank has run i, and ranks run
// iterations in order, so no rank needs them. Such plans are left behind
// when Redis restarts without its data mid-run (the daemons plan the job
// again from iteration 0 while the executors are far ahead) or when a rank
// skips iterations; each counts as acknowledged, so the acknowledged count
// reaches the published one. Expects `i` (a string) in scope.
constexpr char kRetireLua[] = R"lua(
  redis.call('DEL', K.plan(i), K.acks(i), K.fetched(i))
  redis.call('ZREM', K.open, i)
  redis.call('INCR', K.acknowledged)
  local stale = redis.call('ZRANGEBYSCORE', K.open, '-inf', '(' .. i)
  for _, j in ipairs(stale) do
    redis.call('DEL', K.plan(j), K.acks(j), K.fetched(j))
    redis.call('INCR', K.acknowledged)
  end
  if #stale > 0 then redis.call('ZREMRANGEBYSCORE', K.open, '-inf', '(' .. i) end
)lua";

// `script` with its "--RETIRE--" line replaced by kRetireLua.
std::string WithRetire(absl::string_view script) {
  return absl::StrReplaceAll(script, {{"--RETIRE--\n", kRetireLua}});
}

// ARGV[2..]: iteration, rank, world_size. 1: retired.
constexpr char kAckScript[] = R"lua(
local i = ARGV[2]
local acks = K.acks(i)
redis.call('SADD', acks, ARGV[3])
redis.call('PEXPIRE', acks, 86400000)
if redis.call('SCARD', acks) >= tonumber(ARGV[4]) then
--RETIRE--
  return 1
end
return 0
)lua";

// A checked progress report (CheckedReport). ARGV[2..]: iteration, rank,
// world_size, report_json, ttl_ms. -1: the rank never fetched the plan; -2:
// beyond the rank's next iteration; 0: applied.
constexpr char kReportScript[] = R"lua(
local i = ARGV[2]
local r = ARGV[3]
if redis.call('SISMEMBER', K.fetched(i), r) == 0 then return -1 end
local last = redis.call('HGET', K.progress, r)
if last and tonumber(i) > tonumber(last) + 1 then return -2 end
local acks = K.acks(i)
redis.call('SADD', acks, r)
redis.call('PEXPIRE', acks, tonumber(ARGV[6]))
if redis.call('SCARD', acks) >= tonumber(ARGV[4]) then
--RETIRE--
end
redis.call('HSET', K.progress, r, i)
redis.call('HSET', K.reports, r, ARGV[5])
redis.call('XADD', K.reported(r), 'MAXLEN', '~', '16', '*', 'iteration', i)
return 0
)lua";

}  // namespace

absl::Status ProgressLedger::RecordFetch(uint64_t iteration, int rank) {
  const std::string key = keys_.Fetched(iteration);
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_.Pipeline(
          {{"SADD", key, std::to_string(rank)},
           {"PEXPIRE", key, std::to_string(absl::ToInt64Milliseconds(options_.plan_ttl))}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SADD fetched"));
  return absl::OkStatus();
}

absl::Status ProgressLedger::Acknowledge(uint64_t iteration, int rank) {
  static const std::string* const script = new std::string(WithRetire(kAckScript));
  return EvalStoreScript(
             redis_, keys_, *script,
             {std::to_string(iteration), std::to_string(rank), std::to_string(options_.world_size)},
             "acknowledge")
      .status();
}

absl::Status ProgressLedger::CheckedReport(uint64_t iteration, int rank,
                                           const std::string& report_json) {
  static const std::string* const script = new std::string(WithRetire(kReportScript));
  VP_ASSIGN_OR_RETURN(
      int64_t result,
      EvalStoreScript(
          redis_, keys_, *script,
          {std::to_string(iteration), std::to_string(rank), std::to_string(options_.world_size),
           report_json, std::to_string(absl::ToInt64Milliseconds(options_.plan_ttl))},
          "report progress"));
  if (result == -1) {
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", rank, " reported iteration ", iteration,
                     " without having fetched its plan; the report is ignored"));
  }
  if (result == -2) {
    VP_ASSIGN_OR_RETURN(RedisReply last,
                        redis_.Command({"HGET", keys_.Progress(), std::to_string(rank)}));
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " reported iteration ", iteration, " but completed only ", last.str(),
        " so far: it is due to run iteration ", last.str(), " + 1; the report is ignored"));
  }
  return absl::OkStatus();
}

absl::Status ProgressLedger::ReportProgress(int rank, uint64_t iteration,
                                            const std::string& report_json) {
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_.Pipeline({{"HSET", keys_.Progress(), std::to_string(rank), std::to_string(iteration)},
                       {"HSET", keys_.Reports(), std::to_string(rank), report_json}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "HSET progress"));
  return absl::OkStatus();
}

absl::StatusOr<bool> ProgressLedger::WaitForReport(int rank, uint64_t iteration,
                                                   absl::Duration timeout) {
  const std::string stream = keys_.Reported(rank);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // The newest report event first, then the progress: a report after the
    // event is seen by the blocking read below.
    VP_ASSIGN_OR_RETURN(RedisReply last,
                        redis_.Command({"XREVRANGE", stream, "+", "-", "COUNT", "1"}));
    VP_RETURN_IF_ERROR(RedisReplyError(last, "XREVRANGE"));
    std::string last_id = "0-0";
    if (last.size() > 0) last_id = ElementString(last.element(0)->element[0]);
    VP_ASSIGN_OR_RETURN(RedisReply progress,
                        redis_.Command({"HGET", keys_.Progress(), std::to_string(rank)}));
    VP_RETURN_IF_ERROR(RedisReplyError(progress, "HGET progress"));
    uint64_t reported = 0;
    if (!progress.is_nil() && absl::SimpleAtoi(progress.str(), &reported) &&
        reported >= iteration) {
      return true;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int64_t block_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(left));
    VP_ASSIGN_OR_RETURN(RedisReply read,
                        redis_.Command({"XREAD", "COUNT", "16", "BLOCK", std::to_string(block_ms),
                                        "STREAMS", stream, last_id},
                                       absl::Milliseconds(block_ms)));
    VP_RETURN_IF_ERROR(RedisReplyError(read, "XREAD"));
    if (read.is_nil() || read.size() == 0) return false;
  }
}

absl::StatusOr<std::vector<std::pair<int, uint64_t>>> ProgressLedger::Progress() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"HGETALL", keys_.Progress()}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "HGETALL progress"));
  std::vector<std::pair<int, uint64_t>> progress;
  for (size_t i = 0; i + 1 < reply.size(); i += 2) {
    int rank = 0;
    uint64_t iteration = 0;
    if (absl::SimpleAtoi(ElementString(reply.element(i)), &rank) &&
        absl::SimpleAtoi(ElementString(reply.element(i + 1)), &iteration)) {
      progress.emplace_back(rank, iteration);
    }
  }
  std::sort(progress.begin(), progress.end());
  return progress;
}

absl::StatusOr<std::vector<std::pair<int, std::string>>> ProgressLedger::Reports() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"HGETALL", keys_.Reports()}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "HGETALL reports"));
  std::vector<std::pair<int, std::string>> reports;
  for (size_t i = 0; i + 1 < reply.size(); i += 2) {
    int rank = 0;
    if (absl::SimpleAtoi(ElementString(reply.element(i)), &rank)) {
      reports.emplace_back(rank, ElementString(reply.element(i + 1)));
    }
  }
  std::sort(reports.begin(), reports.end());
  return reports;
}

}  // namespace varipipe::service
