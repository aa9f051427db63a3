#include "planner/service/plan_queue.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "hiredis/hiredis.h"
#include "planner/service/store_script.h"

namespace varipipe::service {
namespace {

// A lost iteration first (unpublished, no lease), else a new one.
// ARGV[2..]: planner_id, lease_ms, limit. -1: nothing to claim.
constexpr char kClaimScript[] = R"lua(
local id = ARGV[2]
local lease = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local lost = redis.call('ZRANGEBYSCORE', K.unpublished, '-inf', limit - 1)
for _, i in ipairs(lost) do
  if redis.call('EXISTS', K.plan(i)) == 0 then
    if redis.call('SET', K.lease(i), id, 'NX', 'PX', lease) then return tonumber(i) end
  else
    redis.call('ZREM', K.unpublished, i)
  end
end
local nxt = tonumber(redis.call('GET', K.claimed) or '0')
if nxt >= limit then return -1 end
redis.call('SET', K.claimed, nxt + 1)
redis.call('ZADD', K.unpublished, nxt, nxt)
redis.call('SET', K.lease(nxt), id, 'PX', lease)
return nxt
)lua";

// ARGV[2..]: iteration, planner_id, lease_ms. 1: claimed.
constexpr char kClaimIterationScript[] = R"lua(
local i = ARGV[2]
if redis.call('EXISTS', K.plan(i)) == 1 then return 0 end
if not redis.call('SET', K.lease(i), ARGV[3], 'NX', 'PX', tonumber(ARGV[4])) then return 0 end
redis.call('ZADD', K.unpublished, i, i)
local nxt = tonumber(redis.call('GET', K.claimed) or '0')
if tonumber(i) >= nxt then redis.call('SET', K.claimed, tonumber(i) + 1) end
return 1
)lua";

// ARGV[2..]: iteration, planner_id, ttl_ms, events_maxlen, summary,
// envelope_0, envelope_1, ... 1: published; 0: it was; -1: not the lease
// holder.
constexpr char kPublishScript[] = R"lua(
local i = ARGV[2]
local plan = K.plan(i)
if redis.call('EXISTS', plan) == 1 then return 0 end
if redis.call('GET', K.lease(i)) ~= ARGV[3] then return -1 end
local fields = {K.summary_field, ARGV[6]}
for r = 7, #ARGV do
  table.insert(fields, K.rank_field(r - 7))
  table.insert(fields, ARGV[r])
end
redis.call('HSET', plan, unpack(fields))
redis.call('PEXPIRE', plan, tonumber(ARGV[4]))
redis.call('DEL', K.lease(i))
redis.call('ZREM', K.unpublished, i)
redis.call('ZADD', K.open, i, i)
redis.call('INCR', K.published)
redis.call('XADD', K.events, 'MAXLEN', '~', ARGV[5], '*', 'iteration', i)
return 1
)lua";

std::string Milliseconds(absl::Duration d) { return std::to_string(absl::ToInt64Milliseconds(d)); }

// Whether a stream read's entries announce `iteration`; `last_id` becomes
// the last entry's id.
bool AnnouncesIteration(const redisReply* entries, uint64_t iteration, std::string& last_id) {
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
  return mine;
}

}  // namespace

absl::StatusOr<std::optional<uint64_t>> PlanQueue::Claim(const std::string& planner_id,
                                                         uint64_t limit) {
  limit = std::min(limit, options_.total_iterations);
  if (limit == 0) return std::optional<uint64_t>();
  VP_ASSIGN_OR_RETURN(
      int64_t claimed,
      EvalStoreScript(redis_, keys_, kClaimScript,
                      {planner_id, Milliseconds(options_.lease), std::to_string(limit)}, "claim"));
  if (claimed < 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(static_cast<uint64_t>(claimed));
}

absl::StatusOr<bool> PlanQueue::ClaimIteration(uint64_t iteration, const std::string& planner_id) {
  if (iteration >= options_.total_iterations) return false;
  VP_ASSIGN_OR_RETURN(int64_t claimed, EvalStoreScript(redis_, keys_, kClaimIterationScript,
                                                       {std::to_string(iteration), planner_id,
                                                        Milliseconds(options_.lease)},
                                                       "claim iteration"));
  return claimed == 1;
}

absl::StatusOr<bool> PlanQueue::Publish(uint64_t iteration,
                                        const std::vector<std::string>& envelopes,
                                        const std::string& summary_json,
                                        const std::string& planner_id) {
  std::vector<std::string> args = {std::to_string(iteration), planner_id,
                                   Milliseconds(options_.plan_ttl),
                                   std::to_string(options_.events_max_length), summary_json};
  args.insert(args.end(), envelopes.begin(), envelopes.end());
  VP_ASSIGN_OR_RETURN(int64_t result,
                      EvalStoreScript(redis_, keys_, kPublishScript, std::move(args), "publish"));
  return result == 1;
}

absl::StatusOr<std::optional<std::string>> PlanQueue::GetPlan(uint64_t iteration, int rank) {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"HGET", keys_.Plan(iteration),
                                                        StoreKeys::PlanRankField(rank)}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "HGET plan"));
  if (reply.is_nil()) return std::optional<std::string>();
  return std::optional<std::string>(reply.str());
}

absl::StatusOr<std::optional<std::string>> PlanQueue::WaitPlan(uint64_t iteration, int rank,
                                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // The newest event id first, then the plan: an event published after
    // the id is seen by the blocking read below.
    VP_ASSIGN_OR_RETURN(RedisReply last,
                        redis_.Command({"XREVRANGE", keys_.Events(), "+", "-", "COUNT", "1"}));
    VP_RETURN_IF_ERROR(RedisReplyError(last, "XREVRANGE"));
    std::string last_id = "0-0";
    if (last.size() > 0) last_id = ElementString(last.element(0)->element[0]);
    VP_ASSIGN_OR_RETURN(std::optional<std::string> plan, GetPlan(iteration, rank));
    if (plan.has_value()) return plan;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return std::optional<std::string>();
      const int64_t block_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(left));
      VP_ASSIGN_OR_RETURN(RedisReply read, redis_.Command({"XREAD", "COUNT", "100", "BLOCK",
                                                           std::to_string(block_ms), "STREAMS",
                                                           keys_.Events(), last_id},
                                                          absl::Milliseconds(block_ms)));
      VP_RETURN_IF_ERROR(RedisReplyError(read, "XREAD"));
      if (read.is_nil() || read.size() == 0) return std::optional<std::string>();
      if (AnnouncesIteration(read.element(0)->element[1], iteration, last_id)) break;
    }
  }
}

absl::StatusOr<bool> PlanQueue::IsPublished(uint64_t iteration) {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"EXISTS", keys_.Plan(iteration)}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "EXISTS plan"));
  return reply.integer() == 1;
}

}  // namespace varipipe::service
