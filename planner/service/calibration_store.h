#ifndef VARIPIPE_PLANNER_SERVICE_CALIBRATION_STORE_H_
#define VARIPIPE_PLANNER_SERVICE_CALIBRATION_STORE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "planner/service/store_keys.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe::service {

// One iteration's predicted and measured time (rank 0's report).
struct PredictionRecord {
  uint64_t iteration = 0;
  double predicted_ms = 0;
  double measured_ms = 0;
};

// The job's online calibration of the cost model (planner/cost/
// calibration.h), shared by its daemons, and the recent predictions it is
// judged by.
class CalibrationStore {
 public:
  CalibrationStore(RedisClient& redis, const StoreKeys& keys) : redis_(redis), keys_(keys) {}

  // The job's calibration state; the empty state (version 0) when there is
  // none yet.
  absl::StatusOr<v1::CalibrationState> LoadCalibration();
  // Applies `update` to the stored state atomically: optimistic, retried
  // when another daemon wrote the state in between. `update` returns false
  // to leave it as it is.
  absl::Status UpdateCalibration(const std::function<bool(v1::CalibrationState*)>& update);
  // Records an iteration's predicted and measured time; the newest
  // kPredictionWindow are kept.
  static constexpr int kPredictionWindow = 100;
  absl::Status RecordPrediction(const PredictionRecord& record);
  // The recorded predictions, newest first.
  absl::StatusOr<std::vector<PredictionRecord>> Predictions();

 private:
  RedisClient& redis_;
  const StoreKeys& keys_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_CALIBRATION_STORE_H_
