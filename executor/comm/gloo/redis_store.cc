#include "executor/comm/gloo/redis_store.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"

namespace varipipe::executor {

GlooRedisStore::GlooRedisStore(std::unique_ptr<RedisClient> redis, std::string prefix,
                               std::function<bool()> cancelled, std::chrono::seconds ttl)
    : redis_(std::move(redis)),
      prefix_(std::move(prefix)),
      cancelled_(std::move(cancelled)),
      ttl_(ttl) {}

void GlooRedisStore::set(const std::string& key, const std::vector<char>& data) {
  absl::StatusOr<RedisReply> r =
      redis_->Command({"SET", absl::StrCat(prefix_, "/", key),
                       std::string(data.begin(), data.end()), "EX", std::to_string(ttl_.count())});
  if (!r.ok()) GLOO_THROW_IO_EXCEPTION(std::string(r.status().message()));
}

std::vector<char> GlooRedisStore::get(const std::string& key) {
  wait({key});
  absl::StatusOr<RedisReply> r = redis_->Command({"GET", absl::StrCat(prefix_, "/", key)});
  if (!r.ok()) GLOO_THROW_IO_EXCEPTION(std::string(r.status().message()));
  const std::string value = r->str();
  return std::vector<char>(value.begin(), value.end());
}

void GlooRedisStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::seconds(300));
}

void GlooRedisStore::wait(const std::vector<std::string>& keys,
                          const std::chrono::milliseconds& timeout) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    // Rendezvous happens once per job start: a short polling interval is
    // cheap and keeps the store to plain SET/GET/EXISTS.
    while (true) {
      absl::StatusOr<RedisReply> r = redis_->Command({"EXISTS", absl::StrCat(prefix_, "/", key)});
      if (!r.ok()) GLOO_THROW_IO_EXCEPTION(std::string(r.status().message()));
      if (r->integer() == 1) break;
      if (cancelled_ && absl::Now() - start >= grace_ && cancelled_()) {
        GLOO_THROW_IO_EXCEPTION(
            absl::StrCat("rendezvous: cancelled while waiting for key ", prefix_, "/", key));
      }
      if (absl::Now() > deadline) {
        GLOO_THROW_IO_EXCEPTION(absl::StrCat("rendezvous: timed out after ", timeout.count(),
                                             " ms waiting for key ", prefix_, "/", key,
                                             " (is every rank running?)"));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
}

}  // namespace varipipe::executor
