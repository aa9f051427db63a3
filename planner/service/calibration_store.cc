#include "planner/service/calibration_store.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace varipipe::service {

absl::StatusOr<v1::CalibrationState> CalibrationStore::LoadCalibration() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"GET", keys_.Calibration()}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "GET calibration"));
  v1::CalibrationState state;
  if (reply.is_nil()) return state;
  if (!state.ParseFromString(reply.str())) {
    return absl::DataLossError(absl::StrCat(keys_.Calibration(), " is not a CalibrationState"));
  }
  return state;
}

absl::Status CalibrationStore::UpdateCalibration(
    const std::function<bool(v1::CalibrationState*)>& update) {
  const std::string key = keys_.Calibration();
  constexpr int kAttempts = 20;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    VP_ASSIGN_OR_RETURN(RedisReply watch, redis_.Command({"WATCH", key}));
    VP_RETURN_IF_ERROR(RedisReplyError(watch, "WATCH calibration"));
    absl::StatusOr<v1::CalibrationState> state = LoadCalibration();
    if (!state.ok() || !update(&*state)) {
      (void)redis_.Command({"UNWATCH"});
      return state.status();
    }
    std::string bytes;
    state->SerializeToString(&bytes);
    // EXEC answers nil when the key changed since WATCH: try again.
    VP_ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                        redis_.Pipeline({{"MULTI"}, {"SET", key, bytes}, {"EXEC"}}));
    for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "SET calibration"));
    if (!replies.back().is_nil()) return absl::OkStatus();
  }
  return absl::AbortedError(
      absl::StrCat("calibration update lost to concurrent writers ", kAttempts, " times"));
}

absl::Status CalibrationStore::RecordPrediction(const PredictionRecord& record) {
  const std::string key = keys_.Predictions();
  VP_ASSIGN_OR_RETURN(
      std::vector<RedisReply> replies,
      redis_.Pipeline({{"LPUSH", key,
                        absl::StrFormat("%d %.17g %.17g", record.iteration, record.predicted_ms,
                                        record.measured_ms)},
                       {"LTRIM", key, "0", std::to_string(kPredictionWindow - 1)}}));
  for (const RedisReply& r : replies) VP_RETURN_IF_ERROR(RedisReplyError(r, "LPUSH predictions"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PredictionRecord>> CalibrationStore::Predictions() {
  VP_ASSIGN_OR_RETURN(RedisReply reply, redis_.Command({"LRANGE", keys_.Predictions(), "0", "-1"}));
  VP_RETURN_IF_ERROR(RedisReplyError(reply, "LRANGE predictions"));
  std::vector<PredictionRecord> out;
  for (size_t i = 0; i < reply.size(); ++i) {
    const std::vector<std::string> f =
        absl::StrSplit(ElementString(reply.element(i)), ' ', absl::SkipEmpty());
    PredictionRecord r;
    if (f.size() == 3 && absl::SimpleAtoi(f[0], &r.iteration) &&
        absl::SimpleAtod(f[1], &r.predicted_ms) && absl::SimpleAtod(f[2], &r.measured_ms)) {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace varipipe::service
