#ifndef VARIPIPE_PLANNER_SERVICE_STORE_SCRIPT_H_
#define VARIPIPE_PLANNER_SERVICE_STORE_SCRIPT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "planner/service/store_keys.h"

namespace varipipe::service {

// Runs a store script atomically (EVAL; standalone Redis, so no KEYS): the
// body runs after `p` (the job's prefix, ARGV[1]) and the key table `K`
// (StoreKeys::LuaKeys) are defined; `args` are ARGV[2..]. Returns the
// script's integer answer; errors name `what`.
absl::StatusOr<int64_t> EvalStoreScript(RedisClient& redis, const StoreKeys& keys,
                                        const std::string& body, std::vector<std::string> args,
                                        const char* what);

// The body with its prelude, as EvalStoreScript sends it (for tests).
std::string StoreScript(const std::string& body);

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_STORE_SCRIPT_H_
