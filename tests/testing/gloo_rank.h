// One rank of a Gloo group whose ranks are threads of the test process:
// its transport over loopback TCP, meeting the others through a real
// redis-server under `prefix` (a prefix no other group of the same server
// uses).
#ifndef VARIPIPE_TESTS_TESTING_GLOO_RANK_H_
#define VARIPIPE_TESTS_TESTING_GLOO_RANK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "tests/testing/redis_server.h"

namespace varipipe::testing {

inline absl::StatusOr<std::unique_ptr<executor::GlooTransport>> ConnectGlooRank(
    const RedisServer& redis, const std::string& prefix, int rank, int size) {
  executor::GlooTransport::Options o;
  o.redis.host = redis.host();
  o.redis.port = redis.port();
  o.redis.password = redis.password();
  o.prefix = prefix;
  o.rank = rank;
  o.size = size;
  o.connect_timeout = absl::Seconds(30);
  return executor::GlooTransport::Create(o);
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_GLOO_RANK_H_
