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
//     parallelism.tensor: 3 must divide model.num_attention_heads (4): each
//       tensor rank holds an equal part
#ifndef VARIPIPE_COMMON_CONFIG_JOB_CONFIG_H_
#define VARIPIPE_COMMON_CONFIG_JOB_CONFIG_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {

// Bounds on the numbers of a job config (docs/configuration.md, "Validation
// rules"): generous enough that no real job reaches them, tight enough that
// nothing derived from a valid config overflows. Every bound is inclusive;
// a value beyond one is an error naming the field, the value and the bound:
//
//   training.iterations: is too large (18446744073709551615; at most
//     1000000000000)
//
// Double fields must also be finite: NaN and infinities are errors naming
// the field ("must be a finite number (got nan)").
//
// What the bounds keep far from overflow (64-bit integers): a planned
// micro-batch fits kMaxDeviceMemoryMib (2^46 bytes), so none of its tensors
// (rows x length x width, scores rows x heads x length^2) reaches 2^46
// elements; the planner's memory model, which rejects larger ones, computes
// in doubles. A weight matrix (hidden x ffn, hidden x heads x kv_channels,
// vocab x hidden) has at most 2^50 elements, a whole model below 2^60
// parameters. Layers and stages stay far inside 32 bits. Iteration
// numbers stay below 2^40, so iteration + plan_ahead or first + count never
// wraps; token counts of a mini-batch stay below 2^33 (budget plus one
// sample).
namespace job_config_bounds {

// model.num_layers and (T5) model.num_decoder_layers, each. The largest
// published models have about 100-200 layers.
inline constexpr uint64_t kMaxLayers = 4096;
// model.hidden_size and model.kv_channels: 2^20 (the largest models use
// 2^14-2^15).
inline constexpr uint64_t kMaxHiddenSize = uint64_t{1} << 20;
// model.ffn_hidden_size: 4 x kMaxHiddenSize, the default's largest value.
inline constexpr uint64_t kMaxFfnHiddenSize = uint64_t{1} << 22;
// model.num_attention_heads.
inline constexpr uint64_t kMaxAttentionHeads = uint64_t{1} << 16;
// model.num_attention_heads x model.kv_channels, the width of the attention
// projections (the default kv_channels makes it hidden_size); as wide as
// the widest feed-forward layer.
inline constexpr uint64_t kMaxAttentionWidth = kMaxFfnHiddenSize;
// model.vocab_size: 2^30 (real vocabularies have 2^15-2^18 entries).
inline constexpr uint64_t kMaxVocabSize = uint64_t{1} << 30;

// parallelism.pipeline (at most the layers anyway).
inline constexpr uint64_t kMaxPipeline = 4096;
// parallelism.data.
inline constexpr uint64_t kMaxData = uint64_t{1} << 16;
// parallelism.context: a context group all-gathers keys and values in
// every layer, so it belongs within a node (as a tensor group).
inline constexpr uint64_t kMaxContext = 1024;
// pipeline x data x tensor x context: 2^20 ranks, ten times the largest clusters
// built; rank numbers stay far inside int32.
inline constexpr uint64_t kMaxWorldSize = uint64_t{1} << 20;

// cluster.devices_per_node.
inline constexpr uint64_t kMaxDevicesPerNode = 1024;
// cluster.device_memory_limit_mib: 2^26 MiB = 64 TiB per device (GPUs hold
// up to about 0.3 TiB). In bytes 2^46, exact in a double.
inline constexpr uint64_t kMaxDeviceMemoryMib = uint64_t{1} << 26;
// cluster.*_bandwidth_gbps: from 1 MB/s to 1 PB/s (NVLink: about 1 TB/s).
// The lower bound keeps transfer times finite.
inline constexpr double kMinBandwidthGbps = 1e-3;
inline constexpr double kMaxBandwidthGbps = 1e6;
// cluster.*_latency_us: one second per transfer.
inline constexpr double kMaxLatencyUs = 1e6;

// data.max_sequence_length and (T5) data.max_target_length: 2^24 tokens.
inline constexpr uint64_t kMaxSequenceLength = uint64_t{1} << 24;
// data.tokens_per_global_batch and planner.micro_batch_token_budget: 2^32
// tokens, 256 times the largest published global batches (2^24 tokens).
inline constexpr uint64_t kMaxTokensPerBatch = uint64_t{1} << 32;
// data.synthetic_num_samples: 2^32. Tools that walk the synthetic dataset
// hold its lengths in memory (16 bytes a sample: 64 GiB at the bound).
inline constexpr uint64_t kMaxSyntheticSamples = uint64_t{1} << 32;

// planner.tmax_interval_ms: a bucket of 1,000 s, wider than any
// micro-batch's time.
inline constexpr double kMaxTmaxIntervalMs = 1e6;
// planner.length_multiple.
inline constexpr uint64_t kMaxLengthMultiple = 4096;
// planner.plan_ahead: 2^20 iterations (the default is 8).
inline constexpr uint64_t kMaxPlanAhead = uint64_t{1} << 20;
// planner.threads.
inline constexpr uint64_t kMaxPlannerThreads = 1024;
// planner.kfkb_k: micro-batches per kFkB group; keeps the schedule's
// 32-bit arithmetic (groups of k) exact.
inline constexpr uint64_t kMaxKfkbK = 1024;
// planner.fixed_micro_batch_size: 2^20 samples or packed rows, the largest
// micro-batch of the analytic cost model's grid.
inline constexpr uint64_t kMaxFixedMicroBatchSize = uint64_t{1} << 20;

// training.iterations, training.warmup_iterations and
// training.checkpoint_interval: 10^12 (31,000 years at a step a second).
inline constexpr uint64_t kMaxIterations = 1'000'000'000'000;
// training.watchdog_timeout_s: one week.
inline constexpr uint64_t kMaxWatchdogTimeoutS = 7 * 24 * 3600;
// training.learning_rate (and so min_learning_rate) and
// training.weight_decay: 1,000 (real values are below 10).
inline constexpr double kMaxLearningRate = 1e3;
inline constexpr double kMaxWeightDecay = 1e3;
// training.adam_epsilon: 1 (real values are 1e-8 to 1e-6).
inline constexpr double kMaxAdamEpsilon = 1;
// training.gradient_clip_norm: 10^6 (0 turns clipping off).
inline constexpr double kMaxGradientClipNorm = 1e6;

}  // namespace job_config_bounds

// Reads, parses, defaults and validates a JSON config file. Every path field
// comes back absolute (ResolveJobConfigPaths against the file's directory),
// so the config means the same files from any working directory and when
// passed on to other processes (GetJob).
absl::StatusOr<v1::JobConfig> LoadJobConfigFile(const std::string& path);

// Makes every path field of `config` absolute: a relative one is taken
// under `directory` (itself made absolute against the working directory)
// and normalised ("a/../b" is "b"); absolute and empty ones stay as they
// are. The path fields: data.path, data.target_path, store.password_file,
// planner.cost_model_path, training.checkpoint_dir, training.init_from.
void ResolveJobConfigPaths(v1::JobConfig& config, const std::filesystem::path& directory);

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

// Number of ranks the job needs: pipeline * data * tensor * context
// (common/config/rank_layout.h).
int WorldSize(const v1::JobConfig& config);

// Names of the analytic hardware presets accepted in cluster.hardware.
const std::vector<std::string>& HardwarePresetNames();

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CONFIG_JOB_CONFIG_H_
