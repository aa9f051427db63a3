// The tests' Redis fixture: a real redis-server on a free loopback port with
// a random password (common/redis/redis_server_process.h).
#ifndef VARIPIPE_TESTS_TESTING_REDIS_SERVER_H_
#define VARIPIPE_TESTS_TESTING_REDIS_SERVER_H_

#include "common/redis/redis_server_process.h"

namespace varipipe::testing {

using ::varipipe::PickFreeLoopbackPort;
using ::varipipe::RedisServer;

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_REDIS_SERVER_H_
