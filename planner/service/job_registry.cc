#include "planner/service/job_registry.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/deterministic_bytes.h"
#include "common/status.h"
#include "google/protobuf/util/message_differencer.h"

namespace varipipe::service {
namespace {

// The first field in which `stored` (serialized) and `config` differ, or
// "unknown".
std::string FirstDifference(const std::string& stored, const v1::JobConfig& config) {
  v1::JobConfig other;
  std::string difference;
  if (other.ParseFromString(stored)) {
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&difference);
    differ.Compare(other, config);
    if (const size_t eol = difference.find('\n'); eol != std::string::npos) {
      difference.resize(eol);
    }
  }
  return difference.empty() ? "unknown" : difference;
}

}  // namespace

std::string ConfigHash(const v1::JobConfig& config) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : DeterministicBytes(config)) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return absl::StrFormat("%016x", h);
}

absl::Status JobRegistry::RegisterJob(const v1::JobConfig& config) {
  const std::string hash = ConfigHash(config);
  VP_ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                      redis_.Pipeline({{"SET", keys_.Config(), DeterministicBytes(config), "NX"},
                                       {"SET", keys_.ConfigHash(), hash, "NX"},
                                       {"GET", keys_.ConfigHash()},
                                       {"GET", keys_.Config()}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SET config"));
  const std::string stored = replies[2].str();
  if (stored == hash) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", options_.job_id,
      " is already registered in the instruction store with another config (stored digest ", stored,
      ", this daemon's ", hash, "; first difference: ", FirstDifference(replies[3].str(), config),
      "); start every daemon of a job with the same config, or use another job_id"));
}

absl::StatusOr<v1::JobConfig> JobRegistry::LoadJob() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"GET", keys_.Config()}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET config"));
  if (reply.is_nil()) {
    return absl::NotFoundError(absl::StrCat("job ", options_.job_id, " is not registered"));
  }
  v1::JobConfig config;
  if (!config.ParseFromString(reply.str())) {
    return absl::DataLossError(absl::StrCat("job ", options_.job_id, ": stored config is corrupt"));
  }
  return config;
}

absl::StatusOr<std::string> JobRegistry::RegisterToken(const std::string& candidate,
                                                       bool must_match) {
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_.Pipeline({{"SET", keys_.Token(), candidate, "NX"}, {"GET", keys_.Token()}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SET token"));
  const std::string stored = replies[1].str();
  if (must_match && stored != candidate) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", options_.job_id,
        " already has another token in the instruction store than the one in --token_file; "
        "give every daemon of a job the same token file"));
  }
  return stored;
}

absl::StatusOr<v1::StageLayoutConfig> JobRegistry::LoadStageLayout() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"GET", keys_.StageLayout()}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET stage_layout"));
  if (reply.is_nil()) {
    return absl::NotFoundError(
        absl::StrCat("job ", options_.job_id, " has no stage layout chosen yet"));
  }
  v1::StageLayoutConfig layout;
  if (!layout.ParseFromString(reply.str())) {
    return absl::DataLossError(absl::StrCat(keys_.StageLayout(), " is not a StageLayoutConfig"));
  }
  return layout;
}

absl::StatusOr<v1::StageLayoutConfig> JobRegistry::RegisterStageLayout(
    const v1::StageLayoutConfig& chosen) {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"SET", keys_.StageLayout(),
                                                        DeterministicBytes(chosen), "NX"}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "SET stage_layout"));
  return LoadStageLayout();
}

}  // namespace varipipe::service
