#include "planner/service/store_script.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace varipipe::service {

std::string StoreScript(const std::string& body) {
  return absl::StrCat("local p = ARGV[1]\n", StoreKeys::LuaKeys(), body);
}

absl::StatusOr<int64_t> EvalStoreScript(RedisClient& redis, const StoreKeys& keys,
                                        const std::string& body, std::vector<std::string> args,
                                        const char* what) {
  std::vector<std::string> command = {"EVAL", StoreScript(body), "0", keys.prefix()};
  for (std::string& a : args) command.push_back(std::move(a));
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis.Command(command));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, what));
  return reply.integer();
}

}  // namespace varipipe::service
