// The device a job's cost model describes, so that a run planned for another
// device says so (docs/cost-model.md, "Which device the cost model
// describes"): the planner daemon at start-up and on a far-off prediction,
// each executor against its own device, varipipe-ctl status beside the
// prediction error.
//
// Without planner.cost_model_path the planner uses the analytic model of
// cluster.hardware, a GPU preset; a profile records where it was measured in
// its description ("varipipe-profile on cpu (...)", executor/profile).
#ifndef VARIPIPE_COMMON_CONFIG_COST_MODEL_DEVICE_H_
#define VARIPIPE_COMMON_CONFIG_COST_MODEL_DEVICE_H_

#include <string>

#include "varipipe/v1/config.pb.h"

namespace varipipe {

struct CostModelDevice {
  // In words, e.g. "the analytic model of a100-40gb (cluster.hardware; no
  // planner.cost_model_path)" or "the profile /p.json (varipipe-profile on
  // cpu (...))".
  std::string source;
  // "cpu" or "cuda"; empty when unknown (a profile that is not readable
  // here or does not say).
  std::string kind;
  // True for the analytic model (no profile).
  bool analytic = false;
};

// Reads the profile's description when planner.cost_model_path is a
// readable varipipe-profile file; never fails (unknown stays empty).
CostModelDevice CostModelDeviceOf(const v1::JobConfig& config);

// The device kind of a LibTorch device name: "cpu" or "cuda" ("cuda:1"),
// else empty.
std::string DeviceKind(const std::string& device);

// One line naming both devices and how to profile when `executor_device`
// ("cpu", "cuda:N") is not of the kind the cost model describes; empty when
// it is, or when either is unknown.
std::string CostModelDeviceMismatch(const CostModelDevice& model,
                                    const std::string& executor_device);

// How to profile the executors' device for a job, in one sentence.
std::string HowToProfile();

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CONFIG_COST_MODEL_DEVICE_H_
