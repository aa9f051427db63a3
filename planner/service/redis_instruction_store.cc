#include "planner/service/redis_instruction_store.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/auth/job_token.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "hiredis/hiredis.h"

namespace varipipe::service {
namespace {

std::string Deterministic(const google::protobuf::Message& m) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return bytes;
}

// Claim: a lost iteration first (unpublished, no lease), else a new one.
// KEYS: none (standalone Redis); ARGV: prefix, planner_id, lease_ms, limit.
constexpr char kClaimScript[] = R"lua(
local p = ARGV[1]
local id = ARGV[2]
local lease = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local lost = redis.call('ZRANGEBYSCORE', p .. ':unpublished', '-inf', limit - 1)
for _, i in ipairs(lost) do
  if redis.call('EXISTS', p .. ':plan:' .. i) == 0 then
    if redis.call('SET', p .. ':lease:' .. i, id, 'NX', 'PX', lease) then return tonumber(i) end
  else
    redis.call('ZREM', p .. ':unpublished', i)
  end
end
local nxt = tonumber(redis.call('GET', p .. ':claimed') or '0')
if nxt >= limit then return -1 end
redis.call('SET', p .. ':claimed', nxt + 1)
redis.call('ZADD', p .. ':unpublished', nxt, nxt)
redis.call('SET', p .. ':lease:' .. nxt, id, 'PX', lease)
return nxt
)lua";

// ARGV: prefix, iteration, planner_id, lease_ms.
constexpr char kClaimIterationScript[] = R"lua(
local p = ARGV[1]
local i = ARGV[2]
if redis.call('EXISTS', p .. ':plan:' .. i) == 1 then return 0 end
if not redis.call('SET', p .. ':lease:' .. i, ARGV[3], 'NX', 'PX', tonumber(ARGV[4])) then return 0 end
redis.call('ZADD', p .. ':unpublished', i, i)
local nxt = tonumber(redis.call('GET', p .. ':claimed') or '0')
if tonumber(i) >= nxt then redis.call('SET', p .. ':claimed', tonumber(i) + 1) end
return 1
)lua";

// ARGV: prefix, iteration, planner_id, ttl_ms, events_maxlen, summary,
// envelope_0, envelope_1, ...
constexpr char kPublishScript[] = R"lua(
local p = ARGV[1]
local i = ARGV[2]
local plan = p .. ':plan:' .. i
if redis.call('EXISTS', plan) == 1 then return 0 end
if redis.call('GET', p .. ':lease:' .. i) ~= ARGV[3] then return -1 end
local fields = {'summary', ARGV[6]}
for r = 7, #ARGV do
  table.insert(fields, 'rank:' .. (r - 7))
  table.insert(fields, ARGV[r])
end
redis.call('HSET', plan, unpack(fields))
redis.call('PEXPIRE', plan, tonumber(ARGV[4]))
redis.call('DEL', p .. ':lease:' .. i)
redis.call('ZREM', p .. ':unpublished', i)
redis.call('ZADD', p .. ':open', i, i)
redis.call('INCR', p .. ':published')
redis.call('XADD', p .. ':events', 'MAXLEN', '~', ARGV[5], '*', 'iteration', i)
return 1
)lua";

// Retires iteration i once every rank acknowledged it, and with it every
// open plan of an earlier iteration: every rank has run i, and ranks run
// iterations in order, so no rank needs them. Such plans are left behind
// when Redis restarts without its data mid-run (the daemons plan the job
// again from iteration 0 while the executors are far ahead) or when a rank
// skips iterations; each counts as acknowledged, so the acknowledged count
// reaches the published one. Expects `p` and `i` (a string) in scope.
constexpr char kRetireLua[] = R"lua(
  redis.call('DEL', p .. ':plan:' .. i, p .. ':acks:' .. i, p .. ':fetched:' .. i)
  redis.call('ZREM', p .. ':open', i)
  redis.call('INCR', p .. ':acknowledged')
  local stale = redis.call('ZRANGEBYSCORE', p .. ':open', '-inf', '(' .. i)
  for _, j in ipairs(stale) do
    redis.call('DEL', p .. ':plan:' .. j, p .. ':acks:' .. j, p .. ':fetched:' .. j)
    redis.call('INCR', p .. ':acknowledged')
  end
  if #stale > 0 then redis.call('ZREMRANGEBYSCORE', p .. ':open', '-inf', '(' .. i) end
)lua";

// `script` with its "--RETIRE--" line replaced by kRetireLua.
std::string WithRetire(absl::string_view script) {
  return absl::StrReplaceAll(script, {{"--RETIRE--\n", kRetireLua}});
}

// ARGV: prefix, iteration, rank, world_size.
constexpr char kAckScript[] = R"lua(
local p = ARGV[1]
local i = ARGV[2]
local acks = p .. ':acks:' .. i
redis.call('SADD', acks, ARGV[3])
redis.call('PEXPIRE', acks, 86400000)
if redis.call('SCARD', acks) >= tonumber(ARGV[4]) then
--RETIRE--
  return 1
end
return 0
)lua";

// A checked progress report (CheckedReport). ARGV: prefix, iteration, rank,
// world_size, report_json, ttl_ms. -1: the rank never fetched the plan; -2:
// beyond the rank's next iteration; 0: applied.
constexpr char kReportScript[] = R"lua(
local p = ARGV[1]
local i = ARGV[2]
local r = ARGV[3]
if redis.call('SISMEMBER', p .. ':fetched:' .. i, r) == 0 then return -1 end
local last = redis.call('HGET', p .. ':progress', r)
if last and tonumber(i) > tonumber(last) + 1 then return -2 end
local acks = p .. ':acks:' .. i
redis.call('SADD', acks, r)
redis.call('PEXPIRE', acks, tonumber(ARGV[6]))
if redis.call('SCARD', acks) >= tonumber(ARGV[4]) then
--RETIRE--
end
redis.call('HSET', p .. ':progress', r, i)
redis.call('HSET', p .. ':reports', r, ARGV[5])
redis.call('XADD', p .. ':reported:' .. r, 'MAXLEN', '~', '16', '*', 'iteration', i)
return 0
)lua";

absl::StatusOr<int64_t> Eval(RedisClient& redis, const char* script, std::vector<std::string> args,
                             const char* what) {
  std::vector<std::string> command = {"EVAL", script, "0"};
  for (std::string& a : args) command.push_back(std::move(a));
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis.Command(command));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, what));
  return reply.integer();
}

}  // namespace

std::string ConfigHash(const v1::JobConfig& config) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : Deterministic(config)) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return absl::StrFormat("%016x", h);
}

absl::StatusOr<std::unique_ptr<RedisInstructionStore>> RedisInstructionStore::Open(
    const RedisClient::Options& redis, const StoreOptions& options) {
  if (options.job_id.empty() || options.world_size < 1) {
    return absl::InvalidArgumentError("instruction store: job id and world size are required");
  }
  VP_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client, RedisClient::Connect(redis));
  return std::unique_ptr<RedisInstructionStore>(
      new RedisInstructionStore(std::move(client), options));
}

std::string RedisInstructionStore::Prefix() const {
  return absl::StrCat(options_.key_prefix, ":", options_.job_id);
}

std::string RedisInstructionStore::Key(const std::string& suffix) const {
  return absl::StrCat(options_.key_prefix, ":", options_.job_id, ":", suffix);
}

absl::Status RedisInstructionStore::RegisterJob(const v1::JobConfig& config) {
  const std::string hash = ConfigHash(config);
  VP_ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                      redis_->Pipeline({{"SET", Key("config"), Deterministic(config), "NX"},
                                        {"SET", Key("config_hash"), hash, "NX"},
                                        {"GET", Key("config_hash")},
                                        {"GET", Key("config")}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SET config"));
  const std::string stored = replies[2].str();
  if (stored == hash) return absl::OkStatus();
  v1::JobConfig other;
  std::string difference;
  if (other.ParseFromString(replies[3].str())) {
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&difference);
    differ.Compare(other, config);
    if (const size_t eol = difference.find('\n'); eol != std::string::npos) {
      difference.resize(eol);
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("job ", options_.job_id,
                   " is already registered in the instruction store with another "
                   "config (stored digest ",
                   stored, ", this daemon's ", hash,
                   "; first difference: ", difference.empty() ? "unknown" : difference,
                   "); start every daemon of a job with the same config, or use another job_id"));
}

absl::StatusOr<std::string> RedisInstructionStore::RegisterToken(const std::string& candidate,
                                                                 bool must_match) {
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_->Pipeline({{"SET", JobTokenKey(options_.key_prefix, options_.job_id), candidate, "NX"},
                        {"GET", JobTokenKey(options_.key_prefix, options_.job_id)}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SET token"));
  const std::string stored = replies[1].str();
  if (must_match && stored != candidate) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", options_.job_id,
        " already has another token in the instruction store than the one in --token_file; "
        "give every daemon of a job the same token file"));
  }
  return stored;
}

absl::StatusOr<v1::StageLayoutConfig> RedisInstructionStore::LoadStageLayout() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_->Command({"GET", Key("stage_layout")}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET stage_layout"));
  if (reply.is_nil()) {
    return absl::NotFoundError(
        absl::StrCat("job ", options_.job_id, " has no stage layout chosen yet"));
  }
  v1::StageLayoutConfig layout;
  if (!layout.ParseFromString(reply.str())) {
    return absl::DataLossError(absl::StrCat(Key("stage_layout"), " is not a StageLayoutConfig"));
  }
  return layout;
}

absl::StatusOr<v1::StageLayoutConfig> RedisInstructionStore::RegisterStageLayout(
    const v1::StageLayoutConfig& chosen) {
  VP_ASSIGN_OR_RETURN(RedisReply reply,
                      redis_->Command({"SET", Key("stage_layout"), Deterministic(chosen), "NX"}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "SET stage_layout"));
  return LoadStageLayout();
}

absl::StatusOr<v1::JobConfig> RedisInstructionStore::LoadJob() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_->Command({"GET", Key("config")}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET config"));
  if (reply.is_nil()) {
    return absl::NotFoundError(absl::StrCat("job ", options_.job_id, " is not registered"));
  }
  v1::JobConfig config;
  if (!config.ParseFromString(reply.str())) {
    return absl::DataLossError(absl::StrCat("job ", options_.job_id, ": stored config is corrupt"));
  }
  return config;
}

absl::StatusOr<std::optional<uint64_t>> RedisInstructionStore::Claim(const std::string& planner_id,
                                                                     uint64_t limit) {
  limit = std::min(limit, options_.total_iterations);
  if (limit == 0) return std::optional<uint64_t>();
  VP_ASSIGN_OR_RETURN(
      int64_t claimed,
      Eval(*redis_, kClaimScript,
           {Prefix(), planner_id, std::to_string(absl::ToInt64Milliseconds(options_.lease)),
            std::to_string(limit)},
           "claim"));
  if (claimed < 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(static_cast<uint64_t>(claimed));
}

absl::StatusOr<bool> RedisInstructionStore::ClaimIteration(uint64_t iteration,
                                                           const std::string& planner_id) {
  if (iteration >= options_.total_iterations) return false;
  VP_ASSIGN_OR_RETURN(int64_t claimed,
                      Eval(*redis_, kClaimIterationScript,
                           {Prefix(), std::to_string(iteration), planner_id,
                            std::to_string(absl::ToInt64Milliseconds(options_.lease))},
                           "claim iteration"));
  return claimed == 1;
}

absl::StatusOr<bool> RedisInstructionStore::Publish(uint64_t iteration,
                                                    const std::vector<std::string>& envelopes,
                                                    const std::string& summary_json,
                                                    const std::string& planner_id) {
  std::vector<std::string> args = {Prefix(),
                                   std::to_string(iteration),
                                   planner_id,
                                   std::to_string(absl::ToInt64Milliseconds(options_.plan_ttl)),
                                   std::to_string(options_.events_max_length),
                                   summary_json};
  args.insert(args.end(), envelopes.begin(), envelopes.end());
  VP_ASSIGN_OR_RETURN(int64_t result, Eval(*redis_, kPublishScript, std::move(args), "publish"));
  return result == 1;
}

absl::StatusOr<std::optional<std::string>> RedisInstructionStore::GetPlan(uint64_t iteration,
                                                                          int rank) {
  VP_ASSIGN_OR_RETURN(RedisReply reply,
                      redis_->Command({"HGET", Key(absl::StrCat("plan:", iteration)),
                                       absl::StrCat("rank:", rank)}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "HGET plan"));
  if (reply.is_nil()) return std::optional<std::string>();
  return std::optional<std::string>(reply.str());
}

absl::StatusOr<std::optional<std::string>> RedisInstructionStore::WaitPlan(uint64_t iteration,
                                                                           int rank,
                                                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // The newest event id first, then the plan: an event published after
    // the id is seen by the blocking read below.
    VP_ASSIGN_OR_RETURN(RedisReply last,
                        redis_->Command({"XREVRANGE", Key("events"), "+", "-", "COUNT", "1"}));
    VP_RETURN_IF_ERROR(RedisReplyError(last, "XREVRANGE"));
    std::string last_id = "0-0";
    if (last.size() > 0) last_id = ElementString(last.element(0)->element[0]);
    VP_ASSIGN_OR_RETURN(std::optional<std::string> plan, GetPlan(iteration, rank));
    if (plan.has_value()) return plan;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return std::optional<std::string>();
      const int64_t block_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(left));
      VP_ASSIGN_OR_RETURN(RedisReply read, redis_->Command({"XREAD", "COUNT", "100", "BLOCK",
                                                            std::to_string(block_ms), "STREAMS",
                                                            Key("events"), last_id},
                                                           absl::Milliseconds(block_ms)));
      VP_RETURN_IF_ERROR(RedisReplyError(read, "XREAD"));
      if (read.is_nil() || read.size() == 0) return std::optional<std::string>();
      const redisReply* entries = read.element(0)->element[1];
      bool mine = false;
      for (size_t e = 0; e < entries->elements; ++e) {
        const redisReply* entry = entries->element[e];
        last_id = ElementString(entry->element[0]);
        const redisReply* fields = entry->element[1];
        for (size_t f = 0; f + 1 < fields->elements; f += 2) {
          uint64_t published = 0;
          if (ElementString(fields->element[f]) == "iteration" &&
              absl::SimpleAtoi(ElementString(fields->element[f + 1]), &published) &&
              published == iteration) {
            mine = true;
          }
        }
      }
      if (mine) break;
    }
  }
}

absl::StatusOr<bool> RedisInstructionStore::WaitForReport(int rank, uint64_t iteration,
                                                          absl::Duration timeout) {
  const std::string stream = Key(absl::StrCat("reported:", rank));
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // The newest report event first, then the progress: a report after the
    // event is seen by the blocking read below.
    VP_ASSIGN_OR_RETURN(RedisReply last,
                        redis_->Command({"XREVRANGE", stream, "+", "-", "COUNT", "1"}));
    VP_RETURN_IF_ERROR(RedisReplyError(last, "XREVRANGE"));
    std::string last_id = "0-0";
    if (last.size() > 0) last_id = ElementString(last.element(0)->element[0]);
    VP_ASSIGN_OR_RETURN(RedisReply progress,
                        redis_->Command({"HGET", Key("progress"), std::to_string(rank)}));
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
                        redis_->Command({"XREAD", "COUNT", "16", "BLOCK", std::to_string(block_ms),
                                         "STREAMS", stream, last_id},
                                        absl::Milliseconds(block_ms)));
    VP_RETURN_IF_ERROR(RedisReplyError(read, "XREAD"));
    if (read.is_nil() || read.size() == 0) return false;
  }
}

absl::Status RedisInstructionStore::Acknowledge(uint64_t iteration, int rank) {
  static const std::string* const script = new std::string(WithRetire(kAckScript));
  return Eval(*redis_, script->c_str(),
              {Prefix(), std::to_string(iteration), std::to_string(rank),
               std::to_string(options_.world_size)},
              "acknowledge")
      .status();
}

absl::Status RedisInstructionStore::RecordFetch(uint64_t iteration, int rank) {
  const std::string key = Key(absl::StrCat("fetched:", iteration));
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_->Pipeline(
          {{"SADD", key, std::to_string(rank)},
           {"PEXPIRE", key, std::to_string(absl::ToInt64Milliseconds(options_.plan_ttl))}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SADD fetched"));
  return absl::OkStatus();
}

absl::Status RedisInstructionStore::CheckedReport(uint64_t iteration, int rank,
                                                  const std::string& report_json) {
  static const std::string* const script = new std::string(WithRetire(kReportScript));
  VP_ASSIGN_OR_RETURN(int64_t result,
                      Eval(*redis_, script->c_str(),
                           {Prefix(), std::to_string(iteration), std::to_string(rank),
                            std::to_string(options_.world_size), report_json,
                            std::to_string(absl::ToInt64Milliseconds(options_.plan_ttl))},
                           "report progress"));
  if (result == -1) {
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", rank, " reported iteration ", iteration,
                     " without having fetched its plan; the report is ignored"));
  }
  if (result == -2) {
    VP_ASSIGN_OR_RETURN(RedisReply last,
                        redis_->Command({"HGET", Key("progress"), std::to_string(rank)}));
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " reported iteration ", iteration, " but completed only ", last.str(),
        " so far: it is due to run iteration ", last.str(), " + 1; the report is ignored"));
  }
  return absl::OkStatus();
}

absl::Status RedisInstructionStore::ReportProgress(int rank, uint64_t iteration,
                                                   const std::string& report_json) {
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_->Pipeline({{"HSET", Key("progress"), std::to_string(rank), std::to_string(iteration)},
                        {"HSET", Key("reports"), std::to_string(rank), report_json}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "HSET progress"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int, uint64_t>>> RedisInstructionStore::Progress() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_->Command({"HGETALL", Key("progress")}));
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

absl::StatusOr<StoreCounters> RedisInstructionStore::Counters() {
  VP_ASSIGN_OR_RETURN(std::vector<RedisReply> r, redis_->Pipeline({{"GET", Key("claimed")},
                                                                   {"GET", Key("published")},
                                                                   {"GET", Key("acknowledged")},
                                                                   {"ZCARD", Key("unpublished")}}));
  StoreCounters c;
  const auto number = [](const RedisReply& reply) {
    uint64_t v = 0;
    if (reply.is_integer()) return static_cast<uint64_t>(reply.integer());
    (void)absl::SimpleAtoi(reply.str(), &v);
    return v;
  };
  c.claimed = number(r[0]);
  c.published = number(r[1]);
  c.acknowledged = number(r[2]);
  c.unpublished = number(r[3]);
  VP_ASSIGN_OR_RETURN(auto progress, Progress());
  if (static_cast<int>(progress.size()) >= options_.world_size) {
    uint64_t lowest = ~uint64_t{0};
    for (const auto& [rank, iteration] : progress) lowest = std::min(lowest, iteration);
    c.min_progress = lowest + 1;
  }
  return c;
}

absl::StatusOr<bool> RedisInstructionStore::IsPublished(uint64_t iteration) {
  VP_ASSIGN_OR_RETURN(RedisReply reply,
                      redis_->Command({"EXISTS", Key(absl::StrCat("plan:", iteration))}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "EXISTS plan"));
  return reply.integer() == 1;
}

absl::StatusOr<v1::CalibrationState> RedisInstructionStore::LoadCalibration() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_->Command({"GET", Key("calibration")}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET calibration"));
  v1::CalibrationState state;
  if (reply.is_nil()) return state;
  if (!state.ParseFromString(reply.str())) {
    return absl::DataLossError(absl::StrCat(Key("calibration"), " is not a CalibrationState"));
  }
  return state;
}

absl::Status RedisInstructionStore::UpdateCalibration(
    const std::function<bool(v1::CalibrationState*)>& update) {
  const std::string key = Key("calibration");
  constexpr int kAttempts = 20;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    VP_ASSIGN_OR_RETURN(RedisReply watch, redis_->Command({"WATCH", key}));
    VP_RETURN_IF_ERROR(RedisReplyError(watch, "WATCH calibration"));
    absl::StatusOr<v1::CalibrationState> state = LoadCalibration();
    if (!state.ok() || !update(&*state)) {
      (void)redis_->Command({"UNWATCH"});
      return state.status();
    }
    std::string bytes;
    state->SerializeToString(&bytes);
    // EXEC answers nil when the key changed since WATCH: try again.
    VP_ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                        redis_->Pipeline({{"MULTI"}, {"SET", key, bytes}, {"EXEC"}}));
    for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SET calibration"));
    if (!replies.back().is_nil()) return absl::OkStatus();
  }
  return absl::AbortedError(
      absl::StrCat("calibration update lost to concurrent writers ", kAttempts, " times"));
}

absl::Status RedisInstructionStore::RecordPrediction(const PredictionRecord& record) {
  const std::string key = Key("predictions");
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_->Pipeline({{"LPUSH", key,
                         absl::StrFormat("%d %.17g %.17g", record.iteration, record.predicted_ms,
                                         record.measured_ms)},
                        {"LTRIM", key, "0", std::to_string(kPredictionWindow - 1)}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "LPUSH predictions"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PredictionRecord>> RedisInstructionStore::Predictions() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_->Command({"LRANGE", Key("predictions"), "0", "-1"}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "LRANGE predictions"));
  std::vector<PredictionRecord> out;
  for (size_t i = 0; i < reply.size(); ++i) {
    const std::vector<std::string> f =
        absl::StrSplit(ElementString(reply.element(i)), ' ', absl::SkipEmpty());
    PredictionRecord r;
    if (f.size() == 3 && absl::SimpleAtoi(f[0], &r.iteration) &&
        absl::SimpleAtod(f[1], &r.predicted_ms) && absl::SimpleAtod(f[2], &r.measured_ms)) {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace varipipe::service
