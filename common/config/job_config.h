// Loading, defaulting and validating the job configuration
// (varipipe.v1.JobConfig, proto/varipipe/v1/config.proto).
//
// Configs are JSON in protobuf's JSON mapping. Loading a file is three steps:
// parse (syntax and field names), fill defaults (documented per field in
// config.proto), validate (every rule in docs/configuration.md). Every error
// names the file and the field, e.g.
//
//   job.json: invalid job config:
//     model.hidden_size: must be divisible by model.num_attention_heads
//       (1000 % 12 = 4) unless model.kv_channels is set
//     parallelism.tensor: only 1 is supported (got 2)
#ifndef VARIPIPE_COMMON_CONFIG_JOB_CONFIG_H_
#define VARIPIPE_COMMON_CONFIG_JOB_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {

// Reads, parses, defaults and validates a JSON config file. Relative paths in
// the config (data.path, data.target_path, store.password_file,
// planner.cost_model_path) are resolved against the file's directory.
absl::StatusOr<v1::JobConfig> LoadJobConfigFile(const std::string& path);

// Parses JSON text into a JobConfig without defaults or validation.
// `source` names the text in errors (usually the file name).
absl::StatusOr<v1::JobConfig> ParseJobConfigJson(absl::string_view json, absl::string_view source);

// Fills every zero-valued field that has a documented default.
// Idempotent.
void ApplyJobConfigDefaults(v1::JobConfig& config);

// Returns every rule violation as "field.path: message", in field order.
// Empty means valid. Expects defaults to be applied.
std::vector<std::string> JobConfigErrors(const v1::JobConfig& config);

// InvalidArgument listing JobConfigErrors(config) under `source`, or OK.
absl::Status ValidateJobConfig(const v1::JobConfig& config, absl::string_view source);

// The config as indented JSON with the proto field names, every field
// printed (defaults included).
std::string JobConfigToJson(const v1::JobConfig& config);

// Number of ranks the job needs: pipeline * data * tensor.
int WorldSize(const v1::JobConfig& config);

// Names of the analytic hardware presets accepted in cluster.hardware.
const std::vector<std::string>& HardwarePresetNames();

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CONFIG_JOB_CONFIG_H_
