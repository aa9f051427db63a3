#include "executor/runtime/rank_liveness.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "hiredis/hiredis.h"
#include "spdlog/spdlog.h"

namespace varipipe::executor {
namespace {

// What outlives the launch for a post-mortem (varipipe-ctl, an operator).
constexpr char kReportTtlMs[] = "86400000";

}  // namespace

absl::StatusOr<std::unique_ptr<RankLiveness>> RankLiveness::Start(const LivenessOptions& options) {
  RedisClient::Options redis_options = options.redis;
  // Heartbeats must not wait long on a Redis that went away.
  redis_options.max_attempts = 2;
  redis_options.command_timeout = std::min(redis_options.command_timeout, options.ttl);
  absl::StatusOr<std::unique_ptr<RedisClient>> redis = RedisClient::Connect(redis_options);
  if (!redis.ok()) return redis.status();
  absl::StatusOr<std::unique_ptr<RedisClient>> refresher = RedisClient::Connect(redis_options);
  if (!refresher.ok()) return refresher.status();
  std::unique_ptr<RankLiveness> liveness(new RankLiveness(options, *std::move(redis)));
  (void)(*refresher)
      ->Command({"SET", liveness->Key("started", options.rank), "1", "PX", kReportTtlMs});
  liveness->Refresh(**refresher);
  liveness->refresher_ = std::thread(
      [self = liveness.get(), connection = std::shared_ptr<RedisClient>(*std::move(refresher))] {
        while (!self->stop_.WaitForNotificationWithTimeout(self->options_.interval)) {
          self->Refresh(*connection);
        }
      });
  return liveness;
}

RankLiveness::~RankLiveness() {
  StopWatch();
  stop_.Notify();
  if (refresher_.joinable()) refresher_.join();
}

void RankLiveness::StopWatch() {
  if (!stop_watch_.HasBeenNotified()) stop_watch_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

void RankLiveness::WatchPeers(std::function<void(const std::string&)> on_peer_failure) {
  if (watcher_.joinable() || options_.world_size <= 1) return;
  RedisClient::Options redis_options = options_.redis;
  redis_options.max_attempts = 2;
  redis_options.command_timeout = std::min(redis_options.command_timeout, options_.ttl);
  absl::StatusOr<std::unique_ptr<RedisClient>> connection = RedisClient::Connect(redis_options);
  if (!connection.ok()) {
    spdlog::warn("peer watch not started: {}", connection.status().message());
    return;
  }
  watcher_ = std::thread([this, on_peer_failure = std::move(on_peer_failure),
                          redis = std::shared_ptr<RedisClient>(*std::move(connection))] {
    std::map<int, absl::Time> silent_since;
    while (!stop_watch_.WaitForNotificationWithTimeout(options_.watch_interval)) {
      const std::string failure = PollPeers(*redis, silent_since);
      if (!failure.empty()) {
        on_peer_failure(failure);
        return;
      }
    }
  });
}

std::string RankLiveness::PollPeers(RedisClient& redis, std::map<int, absl::Time>& silent_since) {
  std::vector<std::vector<std::string>> commands;
  commands.push_back({"GET", absl::StrCat(options_.prefix, "/first_failure")});
  for (int r = 0; r < options_.world_size; ++r) {
    commands.push_back(
        {"MGET", Key("alive", r), Key("failed", r), Key("done", r), Key("started", r)});
  }
  absl::StatusOr<std::vector<RedisReply>> replies = redis.Pipeline(commands);
  if (!replies.ok() || replies->size() != commands.size()) {
    spdlog::warn("peer watch: {}", replies.ok() ? "short reply" : replies.status().message());
    return "";
  }
  // The launch's first failure wins: every rank names the same cause.
  if (const RedisReply& first = (*replies)[0]; first.is_string()) {
    std::string description = first.str();
    if (!absl::StartsWith(description, absl::StrCat("rank ", options_.rank, " "))) {
      return description;
    }
  }
  const absl::Time now = absl::Now();
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    const RedisReply& reply = (*replies)[r + 1];
    if (reply.size() != 4) continue;
    const bool alive = reply.element(0)->type != REDIS_REPLY_NIL;
    const bool has_failed = reply.element(1)->type != REDIS_REPLY_NIL;
    const bool done = reply.element(2)->type != REDIS_REPLY_NIL;
    const bool started = reply.element(3)->type != REDIS_REPLY_NIL;
    if (has_failed) return absl::StrCat("rank ", r, " failed: ", ElementString(reply.element(1)));
    if (!started || alive || done) {
      silent_since.erase(r);
      continue;
    }
    // Lapsed now; a rank is silent once it stays lapsed for two refresh
    // intervals more (a heartbeat thread delayed by load is not a death).
    const auto [it, inserted] = silent_since.emplace(r, now);
    if (!inserted && now - it->second >= 2 * options_.interval) {
      std::string description =
          absl::StrCat("rank ", r,
                       " stopped without reporting an error (killed, crashed, hung or "
                       "unreachable: no heartbeat for ",
                       absl::FormatDuration(options_.ttl + (now - it->second)), ")");
      (void)redis.Command({"SET", absl::StrCat(options_.prefix, "/first_failure"), description,
                           "NX", "PX", kReportTtlMs});
      return description;
    }
  }
  return "";
}

std::string RankLiveness::Key(const char* kind, int rank) const {
  return absl::StrCat(options_.prefix, "/", kind, "/", rank);
}

void RankLiveness::Refresh(RedisClient& redis) {
  // `started` again (NX) for a Redis that restarted empty, so the watch
  // still tells this rank's death from a rank that never joined.
  absl::StatusOr<std::vector<RedisReply>> reply =
      redis.Pipeline({{"SET", Key("alive", options_.rank), "1", "PX",
                       std::to_string(absl::ToInt64Milliseconds(options_.ttl))},
                      {"SET", Key("started", options_.rank), "1", "NX", "PX", kReportTtlMs}});
  if (!reply.ok()) spdlog::warn("heartbeat: {}", reply.status().message());
}

void RankLiveness::ReportDone() {
  StopWatch();
  (void)redis_->Pipeline({{"SET", Key("done", options_.rank), "1", "PX", kReportTtlMs},
                          {"DEL", Key("alive", options_.rank)}});
}

void RankLiveness::ReportFailure(const std::string& reason, bool first_candidate) {
  StopWatch();
  std::vector<std::vector<std::string>> commands = {
      {"SET", Key("failed", options_.rank), reason, "PX", kReportTtlMs}};
  if (first_candidate) {
    commands.push_back({"SET", absl::StrCat(options_.prefix, "/first_failure"),
                        absl::StrCat("rank ", options_.rank, " failed: ", reason), "NX", "PX",
                        kReportTtlMs});
  }
  commands.push_back({"DEL", Key("alive", options_.rank)});
  (void)redis_->Pipeline(commands);
}

std::string RankLiveness::DiagnosePeers(absl::Duration patience, bool until_first_finding) {
  const absl::Time deadline = absl::Now() + patience;
  std::vector<std::string> silent;
  std::vector<std::string> absent;  // never joined
  std::vector<std::string> failed;
  while (true) {
    silent.clear();
    absent.clear();
    failed.clear();
    int settled = 0;  // peers that reported an error or finished: nothing more to learn
    std::vector<std::vector<std::string>> commands;
    for (int r = 0; r < options_.world_size; ++r) {
      commands.push_back(
          {"MGET", Key("alive", r), Key("failed", r), Key("done", r), Key("started", r)});
    }
    absl::StatusOr<std::vector<RedisReply>> replies = redis_->Pipeline(commands);
    if (!replies.ok()) {
      return absl::StrCat(
          "(the job's Redis cannot tell which rank stopped: ", replies.status().message(), ")");
    }
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      const RedisReply& reply = (*replies)[r];
      if (reply.size() != 4) continue;
      const bool alive = reply.element(0)->type != REDIS_REPLY_NIL;
      const bool has_failed = reply.element(1)->type != REDIS_REPLY_NIL;
      const bool done = reply.element(2)->type != REDIS_REPLY_NIL;
      const bool started = reply.element(3)->type != REDIS_REPLY_NIL;
      // A report wins over everything else: a rank that said why it ended
      // is never blamed for stopping without a word.
      if (has_failed) {
        failed.push_back(absl::StrCat("rank ", r, " failed: ", ElementString(reply.element(1))));
      } else if (!alive && !done) {
        (started ? silent : absent).push_back(absl::StrCat("rank ", r));
      }
      if (has_failed || done) ++settled;
    }
    // A silent rank is a finding; a rank not yet joined may still report.
    if (!silent.empty() || settled == options_.world_size - 1 || absl::Now() >= deadline) break;
    if (until_first_finding && !failed.empty()) break;
    absl::SleepFor(std::min(absl::Milliseconds(200), deadline - absl::Now()));
  }
  std::string diagnosis;
  if (!silent.empty()) {
    diagnosis = absl::StrCat(absl::StrJoin(silent, ", "),
                             " stopped without reporting an error (killed, crashed, hung or "
                             "unreachable: no heartbeat for ",
                             absl::FormatDuration(options_.ttl), ")");
  }
  if (!absent.empty()) {
    absl::StrAppend(&diagnosis, diagnosis.empty() ? "" : "; ", absl::StrJoin(absent, ", "),
                    absent.size() == 1 ? " has" : " have",
                    " not joined this launch (no heartbeat yet: not started, or failed before "
                    "reaching the job's Redis; see its own log)");
  }
  for (const std::string& f : failed) {
    absl::StrAppend(&diagnosis, diagnosis.empty() ? "" : "; ", f);
  }
  return diagnosis;
}

}  // namespace varipipe::executor
