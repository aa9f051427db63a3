#include "common/redis/redis_client.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "hiredis/hiredis.h"
#include "spdlog/spdlog.h"

namespace varipipe {
namespace {

timeval TimevalOf(absl::Duration d) {
  const int64_t us = absl::ToInt64Microseconds(d);
  return timeval{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
}

}  // namespace

RedisReply::RedisReply(redisReply* reply) : reply_(reply) {}
RedisReply::~RedisReply() {
  if (reply_ != nullptr) freeReplyObject(reply_);
}
RedisReply::RedisReply(RedisReply&& other) noexcept
    : reply_(std::exchange(other.reply_, nullptr)) {}
RedisReply& RedisReply::operator=(RedisReply&& other) noexcept {
  if (this != &other) {
    if (reply_ != nullptr) freeReplyObject(reply_);
    reply_ = std::exchange(other.reply_, nullptr);
  }
  return *this;
}
bool RedisReply::is_nil() const { return reply_ == nullptr || reply_->type == REDIS_REPLY_NIL; }
bool RedisReply::is_string() const {
  return reply_ != nullptr &&
         (reply_->type == REDIS_REPLY_STRING || reply_->type == REDIS_REPLY_STATUS);
}
bool RedisReply::is_integer() const {
  return reply_ != nullptr && reply_->type == REDIS_REPLY_INTEGER;
}
bool RedisReply::is_array() const { return reply_ != nullptr && reply_->type == REDIS_REPLY_ARRAY; }
std::string RedisReply::str() const {
  return is_string() ? std::string(reply_->str, reply_->len) : "";
}
int64_t RedisReply::integer() const { return is_integer() ? reply_->integer : 0; }
size_t RedisReply::size() const { return is_array() ? reply_->elements : 0; }
const redisReply* RedisReply::element(size_t i) const { return reply_->element[i]; }

std::string ElementString(const redisReply* e) {
  if (e == nullptr) return "";
  if (e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS) {
    return std::string(e->str, e->len);
  }
  if (e->type == REDIS_REPLY_INTEGER) return std::to_string(e->integer);
  return "";
}

absl::Status RedisReplyError(const RedisReply& reply, absl::string_view command) {
  const redisReply* r = reply.raw();
  if (r == nullptr || r->type != REDIS_REPLY_ERROR) return absl::OkStatus();
  const std::string message(r->str, r->len);
  if (absl::StartsWith(message, "NOAUTH") || absl::StartsWith(message, "WRONGPASS")) {
    return absl::PermissionDeniedError(absl::StrCat("Redis ", command, ": ", message));
  }
  return absl::FailedPreconditionError(absl::StrCat("Redis ", command, ": ", message));
}

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(const Options& options) {
  std::unique_ptr<RedisClient> client(new RedisClient(options));
  if (absl::Status s = client->Reconnect(); !s.ok()) return s;
  return client;
}

RedisClient::~RedisClient() {
  if (context_ != nullptr) redisFree(context_);
}

std::string RedisClient::address() const { return absl::StrCat(options_.host, ":", options_.port); }

absl::Status RedisClient::ConnectOnce() {
  if (context_ != nullptr) {
    redisFree(context_);
    context_ = nullptr;
  }
  context_ = redisConnectWithTimeout(options_.host.c_str(), options_.port,
                                     TimevalOf(options_.connect_timeout));
  if (context_ == nullptr || context_->err != 0) {
    const std::string why = context_ != nullptr ? context_->errstr : "out of memory";
    return absl::UnavailableError(absl::StrCat("Redis ", address(), ": ", why));
  }
  redisSetTimeout(context_, TimevalOf(options_.command_timeout));
  if (!options_.password.empty()) {
    RedisReply auth(static_cast<redisReply*>(
        redisCommand(context_, "AUTH %b", options_.password.data(), options_.password.size())));
    if (auth.raw() == nullptr) {
      return absl::UnavailableError(absl::StrCat("Redis ", address(), ": ", context_->errstr));
    }
    if (absl::Status s = RedisReplyError(auth, "AUTH"); !s.ok()) {
      return absl::PermissionDeniedError(
          absl::StrCat("Redis ", address(), " rejected the password (", s.message(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status RedisClient::Reconnect() {
  absl::Duration backoff = options_.backoff_initial;
  absl::Status last;
  for (int attempt = 0; attempt < std::max(1, options_.max_attempts); ++attempt) {
    last = ConnectOnce();
    if (last.ok() || absl::IsPermissionDenied(last)) return last;
    if (attempt + 1 < options_.max_attempts) {
      spdlog::debug("{}; retrying in {}", last.message(), absl::FormatDuration(backoff));
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options_.backoff_max);
    }
  }
  return last;
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& args,
                                                absl::Duration block) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (context_ == nullptr || context_->err != 0) {
      if (absl::Status s = Reconnect(); !s.ok()) return s;
    }
    if (block > absl::ZeroDuration()) {
      redisSetTimeout(context_, TimevalOf(options_.command_timeout + block));
    }
    RedisReply reply(static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
    if (block > absl::ZeroDuration())
      redisSetTimeout(context_, TimevalOf(options_.command_timeout));
    if (reply.raw() != nullptr) return reply;
    spdlog::warn("Redis {}: {} failed: {}; reconnecting", address(), args.empty() ? "" : args[0],
                 context_->errstr);
    if (attempt == 0) {
      redisFree(context_);
      context_ = nullptr;
    }
  }
  return absl::UnavailableError(
      absl::StrCat("Redis ", address(), ": ", args.empty() ? "" : args[0], " failed"));
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (context_ == nullptr || context_->err != 0) {
      if (absl::Status s = Reconnect(); !s.ok()) return s;
    }
    for (const auto& args : commands) {
      std::vector<const char*> argv;
      std::vector<size_t> lengths;
      for (const std::string& a : args) {
        argv.push_back(a.data());
        lengths.push_back(a.size());
      }
      redisAppendCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data());
    }
    std::vector<RedisReply> replies;
    bool broken = false;
    for (size_t i = 0; i < commands.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(context_, &raw) != REDIS_OK) {
        broken = true;
        break;
      }
      replies.emplace_back(static_cast<redisReply*>(raw));
    }
    if (!broken) return replies;
    spdlog::warn("Redis {}: pipeline failed: {}; reconnecting", address(), context_->errstr);
    redisFree(context_);
    context_ = nullptr;
  }
  return absl::UnavailableError(absl::StrCat("Redis ", address(), ": pipeline failed"));
}

absl::StatusOr<std::pair<std::string, int>> ParseHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

absl::StatusOr<std::string> ReadRedisPassword(const v1::StoreConfig& store) {
  if (!store.password_file().empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(store.password_file());
    if (!text.ok()) return Annotate(text.status(), "store.password_file");
    const size_t end = text->find('\n');
    std::string first(absl::StripAsciiWhitespace(text->substr(0, end)));
    if (first.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("store.password_file: ", store.password_file(),
                                                     ": the first line holds no password"));
    }
    return first;
  }
  if (!store.password_env().empty()) {
    if (const char* value = std::getenv(store.password_env().c_str()); value != nullptr) {
      return std::string(value);
    }
  }
  return std::string();
}

}  // namespace varipipe
