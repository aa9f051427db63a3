#include "planner/service/redis_instruction_store.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/status.h"

namespace varipipe::service {

RedisInstructionStore::RedisInstructionStore(std::unique_ptr<RedisClient> redis,
                                             const StoreOptions& options)
    : redis_(std::move(redis)),
      options_(options),
      keys_(options_.key_prefix, options_.job_id),
      job_(*redis_, keys_, options_),
      plans_(*redis_, keys_, options_),
      progress_(*redis_, keys_, options_),
      calibration_(*redis_, keys_) {}

absl::StatusOr<std::unique_ptr<RedisInstructionStore>> RedisInstructionStore::Open(
    const RedisClient::Options& redis, const StoreOptions& options) {
  if (options.job_id.empty() || options.world_size < 1) {
    return absl::InvalidArgumentError("instruction store: job id and world size are required");
  }
  VP_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client, RedisClient::Connect(redis));
  return std::unique_ptr<RedisInstructionStore>(
      new RedisInstructionStore(std::move(client), options));
}

absl::StatusOr<StoreCounters> RedisInstructionStore::Counters() {
  VP_ASSIGN_OR_RETURN(std::vector<RedisReply> r,
                      redis_->Pipeline({{"GET", keys_.Claimed()},
                                        {"GET", keys_.Published()},
                                        {"GET", keys_.Acknowledged()},
                                        {"ZCARD", keys_.Unpublished()}}));
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
  VP_ASSIGN_OR_RETURN(auto progress, progress_.Progress());
  if (static_cast<int>(progress.size()) >= options_.world_size) {
    uint64_t lowest = ~uint64_t{0};
    for (const auto& [rank, iteration] : progress) lowest = std::min(lowest, iteration);
    c.min_progress = lowest + 1;
  }
  return c;
}

}  // namespace varipipe::service
