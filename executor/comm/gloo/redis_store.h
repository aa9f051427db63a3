// A Gloo rendezvous store on the job's Redis (Gloo's own RedisStore cannot
// authenticate): set/get/wait on keys under a prefix, through the project's
// Redis client (AUTH, reconnects). Used only while ranks connect.
#ifndef VARIPIPE_EXECUTOR_COMM_GLOO_REDIS_STORE_H_
#define VARIPIPE_EXECUTOR_COMM_GLOO_REDIS_STORE_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "gloo/rendezvous/store.h"

namespace varipipe::executor {

class GlooRedisStore final : public gloo::rendezvous::Store {
 public:
  // Keys are "<prefix>/<key>" and expire after `ttl` (so nothing stays
  // behind a finished job). A wait ends with an IoException naming the key
  // as soon as `cancelled` (polled with the keys) returns true.
  GlooRedisStore(std::unique_ptr<RedisClient> redis, std::string prefix,
                 std::function<bool()> cancelled = {},
                 std::chrono::seconds ttl = std::chrono::hours(24));

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // From now on a wait honours `cancelled` only once it has lasted `grace`:
  // a rank cancelled after every rank arrived finishes connecting (its peers
  // are about to connect to it) instead of leaving them in a connection
  // wait nothing can cancel.
  void SetCancelGrace(absl::Duration grace) { grace_ = grace; }

 private:
  std::unique_ptr<RedisClient> redis_;
  std::string prefix_;
  std::function<bool()> cancelled_;
  std::chrono::seconds ttl_;
  absl::Duration grace_ = absl::ZeroDuration();
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_GLOO_REDIS_STORE_H_
