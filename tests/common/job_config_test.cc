#include "common/config/job_config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

// A small valid GPT config; tests modify it by text replacement.
constexpr char kValidGpt[] = R"json({
  "job_id": "test-job",
  "model": {"kind": "GPT", "num_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "vocab_size": 1000},
  "parallelism": {"pipeline": 2, "data": 2},
  "cluster": {"device_memory_limit_mib": 8192},
  "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 8192,
           "max_sequence_length": 1024},
  "training": {"iterations": 10}
})json";

absl::StatusOr<v1::JobConfig> ParseAndValidate(const std::string& json) {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "job.json");
  if (!config.ok()) return config;
  ApplyJobConfigDefaults(*config);
  if (absl::Status status = ValidateJobConfig(*config, "job.json"); !status.ok()) return status;
  return config;
}

std::string Replace(absl::string_view from, absl::string_view to) {
  const std::string json = absl::StrReplaceAll(kValidGpt, {{from, to}});
  EXPECT_NE(json, kValidGpt) << "replacement of '" << from << "' did not apply";
  return json;
}

TEST(JobConfig, ValidConfigGetsDocumentedDefaults) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(kValidGpt);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->model().kv_channels(), 64u);
  EXPECT_EQ(config->model().ffn_hidden_size(), 1024u);
  EXPECT_EQ(config->model().dtype(), v1::BFLOAT16);
  EXPECT_EQ(config->model().attention_kernel(), v1::EXPLICIT);
  EXPECT_EQ(config->model().packed_attention(), v1::FASTEST_PER_MICRO_BATCH);
  EXPECT_EQ(config->parallelism().tensor(), 1u);
  EXPECT_EQ(config->parallelism().virtual_chunks(), 1u);
  EXPECT_EQ(config->cluster().devices_per_node(), 8u);
  EXPECT_EQ(config->cluster().hardware(), "a100-40gb");
  EXPECT_EQ(config->data().synthetic_num_samples(), 1000000u);
  // The default search: every method (baseline settings tuned per
  // mini-batch) and every schedule.
  EXPECT_EQ(config->planner().partition_methods_size(), 5);
  EXPECT_EQ(config->planner().partition_methods(0), v1::DYNAMIC_PROGRAMMING);
  EXPECT_EQ(config->planner().schedules_size(), 6);
  EXPECT_EQ(config->planner().recompute_modes_size(), 3);
  EXPECT_DOUBLE_EQ(config->planner().tmax_interval_ms(), 0.5);
  EXPECT_EQ(config->planner().length_multiple(), 8u);
  EXPECT_EQ(config->planner().micro_batch_token_budget(), 0u);
  EXPECT_EQ(config->planner().fixed_micro_batch_size(), 0u);
  // With virtual chunks, the one schedule that runs them.
  absl::StatusOr<v1::JobConfig> chunked =
      ParseAndValidate(Replace(R"("data": 2})", R"("data": 2, "virtual_chunks": 2})"));
  ASSERT_THAT(chunked, IsOk());
  ASSERT_EQ(chunked->planner().schedules_size(), 1);
  EXPECT_EQ(chunked->planner().schedules(0), v1::INTERLEAVED_1F1B);
  EXPECT_EQ(config->store().key_prefix(), "varipipe");
  EXPECT_EQ(config->store().password_env(), "VARIPIPE_REDIS_PASSWORD");
  EXPECT_DOUBLE_EQ(config->training().min_learning_rate(), 1e-5);
  EXPECT_DOUBLE_EQ(config->training().gradient_clip_norm(), 1.0);
  EXPECT_EQ(WorldSize(*config), 4);
}

TEST(JobConfig, LlamaGetsDocumentedDefaults) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(
      Replace(R"("kind": "GPT", "num_layers": 4, "hidden_size": 256)",
              R"("kind": "GPT", "architecture": "LLAMA", "num_layers": 4, "hidden_size": 4096,
                 "rope_scaling": {"factor": 8})"));
  ASSERT_THAT(config, IsOk());
  const v1::ModelConfig& m = config->model();
  EXPECT_EQ(m.ffn_hidden_size(), 11008u);  // Llama-2-7B's
  EXPECT_EQ(m.num_key_value_heads(), 4u);
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-5);
  EXPECT_DOUBLE_EQ(m.rope_theta(), 10000);
  EXPECT_DOUBLE_EQ(m.rope_scaling().low_freq_factor(), 1);
  EXPECT_DOUBLE_EQ(m.rope_scaling().high_freq_factor(), 4);
  EXPECT_EQ(m.rope_scaling().original_max_position_embeddings(), 8192u);
}

TEST(JobConfig, T5V11GetsDocumentedDefaults) {
  absl::StatusOr<v1::JobConfig> config =
      ParseAndValidate(Replace(R"("kind": "GPT")", R"("kind": "T5", "architecture": "T5V11")"));
  ASSERT_THAT(config, IsOk());
  const v1::ModelConfig& m = config->model();
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-6);
  EXPECT_EQ(m.num_key_value_heads(), m.num_attention_heads());
  EXPECT_EQ(m.relative_attention_num_buckets(), 32u);
  EXPECT_EQ(m.relative_attention_max_distance(), 128u);
  EXPECT_FALSE(m.has_rope_theta());
  EXPECT_FALSE(m.tie_word_embeddings());
}

// A tied LLAMA head across pipeline stages: the last stage holds a replica.
TEST(JobConfig, TiedEmbeddingsSpanPipelineStages) {
  EXPECT_THAT(
      ParseAndValidate(Replace(R"("kind": "GPT")", R"("kind": "GPT", "architecture": "LLAMA", )"
                                                   R"("tie_word_embeddings": true)")),
      IsOk());
}

TEST(JobConfig, MegatronResolvedConfigIsUnchanged) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(kValidGpt);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->model().architecture(), v1::ARCHITECTURE_UNSPECIFIED);
  EXPECT_FALSE(config->model().has_norm_epsilon());
  EXPECT_FALSE(config->model().has_rope_theta());
  EXPECT_EQ(config->model().num_key_value_heads(), 0u);
}

TEST(JobConfig, DefaultsAreIdempotent) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(kValidGpt);
  ASSERT_THAT(config, IsOk());
  v1::JobConfig again = *config;
  ApplyJobConfigDefaults(again);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*config, again));
}

TEST(JobConfig, ExplicitZeroOfOptionalFieldIsKept) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(Replace(
      R"("iterations": 10)", R"("iterations": 10, "gradient_clip_norm": 0, "weight_decay": 0)"));
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->training().gradient_clip_norm(), 0.0);
  EXPECT_EQ(config->training().weight_decay(), 0.0);
  absl::StatusOr<v1::JobConfig> no_bucketing = ParseAndValidate(
      Replace(R"("training")", R"("planner": {"tmax_interval_ms": 0}, "training")"));
  ASSERT_THAT(no_bucketing, IsOk());
  EXPECT_EQ(no_bucketing->planner().tmax_interval_ms(), 0.0);
}

TEST(JobConfig, ZeroStageDefaultsToZeroAndAcceptsOne) {
  absl::StatusOr<v1::JobConfig> plain = ParseAndValidate(kValidGpt);
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ(plain->training().zero_stage(), 0u);
  absl::StatusOr<v1::JobConfig> sharded =
      ParseAndValidate(Replace(R"("iterations": 10)", R"("iterations": 10, "zero_stage": 1)"));
  ASSERT_THAT(sharded, IsOk());
  EXPECT_EQ(sharded->training().zero_stage(), 1u);
}

TEST(JobConfig, ExplicitZeroLatencyAndBetaAreKept) {
  absl::StatusOr<v1::JobConfig> config =
      ParseAndValidate(Replace(R"("device_memory_limit_mib": 8192)",
                               R"("device_memory_limit_mib": 8192, "intra_node_latency_us": 0)"));
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->cluster().intra_node_latency_us(), 0.0);
  EXPECT_EQ(config->cluster().inter_node_latency_us(), 30.0);
  absl::StatusOr<v1::JobConfig> beta =
      ParseAndValidate(Replace(R"("iterations": 10)", R"("iterations": 10, "adam_beta1": 0)"));
  ASSERT_THAT(beta, IsOk());
  EXPECT_EQ(beta->training().adam_beta1(), 0.0);
}

TEST(JobConfig, EnumsAreCaseInsensitive) {
  absl::StatusOr<v1::JobConfig> config =
      ParseAndValidate(Replace(R"("kind": "GPT")", R"("kind": "gpt", "dtype": "float32")"));
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->model().kind(), v1::GPT);
  EXPECT_EQ(config->model().dtype(), v1::FLOAT32);
}

TEST(JobConfig, CamelCaseFieldNamesAreAccepted) {
  EXPECT_THAT(ParseAndValidate(Replace(R"("hidden_size")", R"("hiddenSize")")), IsOk());
}

TEST(JobConfig, UnknownFieldIsNamed) {
  EXPECT_THAT(ParseAndValidate(Replace(R"("hidden_size")", R"("hidden_sise")")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.json:3:"), HasSubstr("hidden_sise"))));
}

TEST(JobConfig, UnknownEnumValueIsNamed) {
  EXPECT_THAT(ParseAndValidate(Replace(R"("kind": "GPT")", R"("kind": "bert")")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.json:3:"), HasSubstr("bert"))));
}

// A key that appears twice gets no (possibly wrong) line number.
TEST(JobConfig, AmbiguousUnknownKeyHasNoLine) {
  const std::string json =
      Replace(R"("training": {"iterations": 10})", R"("training": {"iterations": 10, "kind": 1})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "job.json");
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("job.json: not a valid"), HasSubstr("kind"))));
}

TEST(JobConfig, SyntaxErrorNamesTheFile) {
  EXPECT_THAT(ParseAndValidate("{\"job_id\": "),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.json")));
}

struct BadCase {
  std::string name;
  std::string from;
  std::string to;
  std::string expected;  // substring of the error: the field and the reason
};

class JobConfigRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(JobConfigRejects, NamesTheField) {
  const BadCase& c = GetParam();
  EXPECT_THAT(ParseAndValidate(Replace(c.from, c.to)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.json: invalid job config"), HasSubstr(c.expected))));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, JobConfigRejects,
    ::testing::Values(
        BadCase{"MissingJobId", R"("job_id": "test-job",)", "", "job_id: is required"},
        BadCase{"BadJobId", R"("test-job")", R"("test job!")", "job_id: 'test job!'"},
        BadCase{"MissingKind", R"("kind": "GPT", )", "", "model.kind: is required"},
        BadCase{"ZeroLayers", R"("num_layers": 4)", R"("num_layers": 0)",
                "model.num_layers: must be at least 1"},
        BadCase{"HeadsDoNotDivide", R"("num_attention_heads": 4)", R"("num_attention_heads": 6)",
                "model.hidden_size: must be divisible by model.num_attention_heads (256 % 6 = 4)"},
        BadCase{"DecoderLayersOnGpt", R"("num_layers": 4)",
                R"("num_layers": 4, "num_decoder_layers": 2)", "model.num_decoder_layers"},
        BadCase{"Int64Dtype", R"("kind": "GPT")", R"("kind": "GPT", "dtype": "INT64")",
                "model.dtype: must be FLOAT32, BFLOAT16 or FLOAT16 (got INT64)"},
        BadCase{"UnknownAttentionKernel", R"("kind": "GPT")",
                R"("kind": "GPT", "attention_kernel": 7)",
                "model.attention_kernel: must be EXPLICIT or FUSED (got 7)"},
        BadCase{"UnknownPackedAttention", R"("kind": "GPT")",
                R"("kind": "GPT", "packed_attention": 9)",
                "model.packed_attention: must be FASTEST_PER_MICRO_BATCH, PER_SAMPLE or "
                "BLOCK_DIAGONAL_MASK (got 9)"},
        BadCase{"ZeroVocab", R"("vocab_size": 1000)", R"("vocab_size": 0)", "model.vocab_size"},
        BadCase{"LlamaT5", R"("kind": "GPT")", R"("kind": "T5", "architecture": "LLAMA")",
                "model.architecture: LLAMA is a decoder-only architecture"},
        BadCase{"KvHeadsDoNotDivide", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "num_key_value_heads": 3)",
                "model.num_key_value_heads: must divide model.num_attention_heads (4; got 3)"},
        BadCase{
            "GroupedQueryOnMegatron", R"("kind": "GPT")",
            R"("kind": "GPT", "num_key_value_heads": 2)",
            "model.num_key_value_heads: grouped-query attention needs model.architecture LLAMA"},
        BadCase{"RopeThetaOnMegatron", R"("kind": "GPT")", R"("kind": "GPT", "rope_theta": 5e5)",
                "model.rope_theta: is only used by LLAMA models"},
        BadCase{"OddLlamaHeadWidth", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "kv_channels": 63)",
                "model.kv_channels: must be even for rotary embeddings (got 63)"},
        BadCase{"RopeScalingWithoutFactor", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "rope_scaling": {"low_freq_factor": 1})",
                "model.rope_scaling.factor: must be above 1"},
        BadCase{"RopeScalingBandsReversed", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "rope_scaling": {"factor": 8,
                   "low_freq_factor": 4, "high_freq_factor": 2})",
                "model.rope_scaling.high_freq_factor: must exceed low_freq_factor"},
        BadCase{"TiedEmbeddingsOverInterleavedStages",
                R"("vocab_size": 1000},
  "parallelism": {"pipeline": 2, "data": 2})",
                R"("vocab_size": 1000, "architecture": "LLAMA", "tie_word_embeddings": true},
  "parallelism": {"pipeline": 2, "data": 2, "virtual_chunks": 2})",
                "model.tie_word_embeddings: does not work with interleaved stages"},
        BadCase{"InitFromOnMegatron", R"("iterations": 10)",
                R"("iterations": 10, "init_from": "checkpoints/llama")",
                "training.init_from: loads Hugging Face checkpoints into model.architecture LLAMA "
                "or T5V11 only"},
        BadCase{"MaxPositionsOnMegatron", R"("kind": "GPT")",
                R"("kind": "GPT", "max_position_embeddings": 4096)",
                "model.max_position_embeddings: is only used by LLAMA models"},
        BadCase{"MaxPositionsBeyondTheBound", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "max_position_embeddings": 16777217)",
                "model.max_position_embeddings: is too large (16777217; at most 16777216)"},
        BadCase{"NegativeNormEpsilon", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "norm_epsilon": -1)",
                "model.norm_epsilon: must be positive"},
        BadCase{"T5V11Gpt", R"("kind": "GPT")", R"("kind": "GPT", "architecture": "T5V11")",
                "model.architecture: T5V11 is an encoder-decoder architecture: model.kind must "
                "be T5"},
        BadCase{"T5V11Tied", R"("kind": "GPT")",
                R"("kind": "T5", "architecture": "T5V11", "tie_word_embeddings": true)",
                "model.tie_word_embeddings: T5V11 has an untied LM head"},
        BadCase{"T5V11GroupedQuery", R"("kind": "GPT")",
                R"("kind": "T5", "architecture": "T5V11", "num_key_value_heads": 2)",
                "model.num_key_value_heads: grouped-query attention needs model.architecture "
                "LLAMA"},
        BadCase{"OddRelativeBuckets", R"("kind": "GPT")",
                R"("kind": "T5", "architecture": "T5V11", "relative_attention_num_buckets": 7)",
                "model.relative_attention_num_buckets: must be even, from 4 to 1024 (got 7)"},
        BadCase{"RelativeDistanceInsideTheExactBuckets", R"("kind": "GPT")",
                R"("kind": "T5", "architecture": "T5V11", "relative_attention_max_distance": 16)",
                "model.relative_attention_max_distance: must exceed half the buckets (16) and be "
                "at most 16777216 (got 16)"},
        BadCase{"RelativeBucketsOnLlama", R"("kind": "GPT")",
                R"("kind": "GPT", "architecture": "LLAMA", "relative_attention_num_buckets": 32)",
                "model.relative_attention_num_buckets: is only used by T5V11 models"},
        BadCase{"T5V11OverInterleavedStages",
                R"("kind": "GPT", "num_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "vocab_size": 1000},
  "parallelism": {"pipeline": 2, "data": 2})",
                R"("kind": "T5", "architecture": "T5V11", "num_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "vocab_size": 1000},
  "parallelism": {"pipeline": 2, "data": 2, "virtual_chunks": 2})",
                "parallelism.virtual_chunks: T5V11 shares parameters across stages"},
        BadCase{"T5OverInterleavedStages",
                R"("kind": "GPT", "num_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "vocab_size": 1000},
  "parallelism": {"pipeline": 2, "data": 2})",
                R"("kind": "T5", "num_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "vocab_size": 1000},
  "parallelism": {"pipeline": 2, "data": 2, "virtual_chunks": 2})",
                "parallelism.virtual_chunks: T5 runs without interleaving"},
        BadCase{"TensorDegreeDoesNotDivideTheHeads", R"("data": 2)", R"("data": 2, "tensor": 3)",
                "parallelism.tensor: 3 must divide model.num_attention_heads (4): each tensor "
                "rank holds an equal part"},
        BadCase{"SequenceParallelWithoutTensorParallel", R"("data": 2)",
                R"("data": 2, "sequence_parallel": true)",
                "parallelism.sequence_parallel: needs parallelism.tensor above 1 (got 1)"},
        BadCase{"ContextParallelWithInterleaving", R"("data": 2})",
                R"("data": 2, "context": 2, "virtual_chunks": 2},
  "planner": {"schedules": ["INTERLEAVED_1F1B"]})",
                "parallelism.context: context parallelism (2) does not run with the interleaved "
                "schedule: parallelism.virtual_chunks must be 1 (got 2)"},
        BadCase{"ContextParallelWithSequenceParallel", R"("data": 2)",
                R"("data": 2, "tensor": 2, "context": 2, "sequence_parallel": true)",
                "parallelism.context: context parallelism (2) does not run with "
                "parallelism.sequence_parallel"},
        BadCase{"ContextGroupLargerThanANode", R"("data": 2)", R"("data": 2, "context": 2048)",
                "parallelism.context: is too large (2048; at most 1024)"},
        BadCase{"TensorGroupLargerThanANode", R"("data": 2)", R"("data": 2, "tensor": 2048)",
                "parallelism.tensor: must be at most 1024 (got 2048)"},
        BadCase{"TooManyStages", R"("pipeline": 2)", R"("pipeline": 8)",
                "parallelism.pipeline: pipeline (8) x virtual_chunks (1) = 8 stages exceeds the "
                "model's 4 layers"},
        // Listed schedules without INTERLEAVED_1F1B (the default with
        // chunks is INTERLEAVED_1F1B alone).
        BadCase{"ChunksWithoutInterleaved", R"("data": 2},)",
                R"("data": 2, "virtual_chunks": 2}, "planner": {"schedules": ["ADAPTIVE"]},)",
                "parallelism.virtual_chunks"},
        BadCase{"LayoutMissesALayer", R"("pipeline": 2)",
                R"("pipeline": 2, "stage_layout": {"layers": [3, 2]})",
                "parallelism.stage_layout.layers: 3+2 = 5 layers, but model.num_layers is 4"},
        BadCase{"LayoutWithAnEmptyStage", R"("pipeline": 2)",
                R"("pipeline": 2, "stage_layout": {"layers": [4, 0]})",
                "parallelism.stage_layout.layers[1]: stage 1 holds no layer"},
        BadCase{"LayoutEntriesPerStage", R"("pipeline": 2)",
                R"("pipeline": 2, "stage_layout": {"layers": [1, 1, 2]})",
                "parallelism.stage_layout.layers: has 3 entries but the pipeline has 2 stages"},
        BadCase{"LayoutLayersWithAuto", R"("pipeline": 2)",
                R"("pipeline": 2, "stage_layout": {"mode": "AUTO", "layers": [2, 2]})",
                "parallelism.stage_layout: layers and encoder_stages are only read with mode "
                "LISTED (mode is AUTO)"},
        BadCase{"LayoutListedWithoutLayers", R"("pipeline": 2)",
                R"("pipeline": 2, "stage_layout": {"mode": "LISTED"})",
                "parallelism.stage_layout.layers: mode LISTED needs one entry per stage"},
        BadCase{"LayoutEncoderStagesOnGpt", R"("pipeline": 2)",
                R"("pipeline": 2, "stage_layout": {"layers": [2, 2], "encoder_stages": 1})",
                "parallelism.stage_layout.encoder_stages: only T5 has encoder stages"},
        BadCase{"NoMemoryLimit", R"("device_memory_limit_mib": 8192)", R"("devices_per_node": 8)",
                "cluster.device_memory_limit_mib: is required"},
        BadCase{"NegativeBandwidth", R"("device_memory_limit_mib": 8192)",
                R"("device_memory_limit_mib": 8192, "inter_node_bandwidth_gbps": -1)",
                "cluster.inter_node_bandwidth_gbps: must be positive"},
        BadCase{"UnknownHardware", R"("device_memory_limit_mib": 8192)",
                R"("device_memory_limit_mib": 8192, "hardware": "tpu-v5")",
                "cluster.hardware: unknown preset 'tpu-v5'"},
        BadCase{"MissingFormat", R"("format": "SYNTHETIC", )", "", "data.format: is required"},
        BadCase{"JsonlWithoutPath", R"("format": "SYNTHETIC")", R"("format": "JSONL")",
                "data.path: is required for JSONL data"},
        BadCase{"BudgetBelowOneSample", R"("tokens_per_global_batch": 8192)",
                R"("tokens_per_global_batch": 512)",
                "data.tokens_per_global_batch: (512) must hold at least one sample"},
        BadCase{"TargetLengthOnGpt", R"("max_sequence_length": 1024)",
                R"("max_sequence_length": 1024, "max_target_length": 64)",
                "data.max_target_length"},
        BadCase{
            "UnspecifiedSchedule", R"("training")",
            R"("planner": {"schedules": ["ADAPTIVE", "SCHEDULE_KIND_UNSPECIFIED"]}, "training")",
            "planner.schedules[1]: must name a value"},
        BadCase{"DuplicateMethod", R"("training")",
                R"("planner": {"partition_methods": ["PACKING", "packing"]}, "training")",
                "planner.partition_methods[1]: PACKING is listed twice"},
        BadCase{"NegativeTmaxInterval", R"("training")",
                R"("planner": {"tmax_interval_ms": -1}, "training")", "planner.tmax_interval_ms"},
        BadCase{"BadRedisAddress", R"("training")",
                R"("store": {"redis_address": "localhost"}, "training")",
                "store.redis_address: must be host:port"},
        BadCase{"BadRedisPort", R"("training")",
                R"("store": {"redis_address": "localhost:70000"}, "training")",
                "store.redis_address"},
        BadCase{"NoIterations", R"("iterations": 10)", R"("learning_rate": 0.1)",
                "training.iterations: is required"},
        BadCase{"MinAboveMaxLearningRate", R"("iterations": 10)",
                R"("iterations": 10, "learning_rate": 0.001, "min_learning_rate": 0.01)",
                "training.min_learning_rate"},
        BadCase{"UnknownKindNumber", R"("kind": "GPT")", R"("kind": 7)",
                "model.kind: unknown value 7"},
        BadCase{"UnknownMethodNumber", R"("training")",
                R"("planner": {"partition_methods": [99]}, "training")",
                "planner.partition_methods[0]: unknown value 99"},
        BadCase{"HugeHidden", R"("hidden_size": 256)", R"("hidden_size": 2000000000)",
                "model.hidden_size: is too large"},
        BadCase{"HugeSequence", R"("max_sequence_length": 1024)",
                R"("max_sequence_length": 100000000)", "data.max_sequence_length: is too large"},
        BadCase{"SpaceInRedisPort", R"("training")",
                R"("store": {"redis_address": "host: 80"}, "training")", "store.redis_address"},
        BadCase{"TwoColonsInRedisAddress", R"("training")",
                R"("store": {"redis_address": "a:b:80"}, "training")", "store.redis_address"},
        BadCase{"TwoDTourOnGpt", R"("training")",
                R"("planner": {"sample_order": "TWO_D_TOUR"}, "training")", "planner.sample_order"},
        BadCase{"BetaOne", R"("iterations": 10)", R"("iterations": 10, "adam_beta2": 1.0)",
                "training.adam_beta2: must be in [0, 1)"},
        BadCase{"ZeroStage2", R"("iterations": 10)", R"("iterations": 10, "zero_stage": 2)",
                "training.zero_stage: must be 0 or 1 (got 2"},
        BadCase{"ZeroStage3", R"("iterations": 10)", R"("iterations": 10, "zero_stage": 3)",
                "training.zero_stage: must be 0 or 1 (got 3"},
        BadCase{"UnknownOptimizerNumber", R"("iterations": 10)",
                R"("iterations": 10, "optimizer": 7)",
                "training.optimizer: unknown value 7 (ADAMW or SGD)"},
        BadCase{"UnknownMixtureNumber", R"("format": "SYNTHETIC")",
                R"("format": "SYNTHETIC", "synthetic_mixture": 5)",
                "data.synthetic_mixture: unknown value 5 (FLAN_LIKE, DOCUMENTS or LONG_TAIL)"},
        BadCase{"UnknownSampleOrderNumber", R"("training")",
                R"("planner": {"sample_order": 9}, "training")",
                "planner.sample_order: unknown value 9 (LENGTH_SORT or TWO_D_TOUR)"},
        BadCase{"TinyBandwidth", R"("device_memory_limit_mib": 8192)",
                R"("device_memory_limit_mib": 8192, "intra_node_bandwidth_gbps": 0.0009)",
                "cluster.intra_node_bandwidth_gbps: is too small (0.0009; at least 0.001)"},
        BadCase{"NegativeLatency", R"("device_memory_limit_mib": 8192)",
                R"("device_memory_limit_mib": 8192, "inter_node_latency_us": -0.5)",
                "cluster.inter_node_latency_us: must be zero or positive (got -0.5)"},
        BadCase{"NegativeClipNorm", R"("iterations": 10)",
                R"("iterations": 10, "gradient_clip_norm": -1)",
                "training.gradient_clip_norm: must be zero (off) or positive (got -1)"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// The numbers of the issue: a daemon loaded them and reported "2 of
// 18446744073709551615" iterations.
TEST(JobConfigBounds, AbsurdIterationsAndMemoryAreRefusedNamingFieldValueAndBound) {
  EXPECT_THAT(
      ParseAndValidate(Replace(R"("iterations": 10)", R"("iterations": 18446744073709551615)")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("training.iterations: is too large (18446744073709551615; at most "
                         "1000000000000)")));
  // 64-bit integers may also be JSON strings.
  EXPECT_THAT(
      ParseAndValidate(Replace(R"("iterations": 10)", R"("iterations": "18446744073709551615")")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("training.iterations: is too large (18446744073709551615; at most "
                         "1000000000000)")));
  EXPECT_THAT(ParseAndValidate(Replace(R"("device_memory_limit_mib": 8192)",
                                       R"("device_memory_limit_mib": 1e18)")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cluster.device_memory_limit_mib: is too large "
                                 "(1000000000000000000; at most 67108864)")));
}

// Every bound documented in docs/configuration.md, with its value written
// out: changing a bound fails here until the docs follow.
TEST(JobConfigBounds, ConstantsAreTheDocumentedOnes) {
  namespace b = job_config_bounds;
  EXPECT_EQ(b::kMaxLayers, 4096u);
  EXPECT_EQ(b::kMaxHiddenSize, 1048576u);
  EXPECT_EQ(b::kMaxFfnHiddenSize, 4194304u);
  EXPECT_EQ(b::kMaxAttentionHeads, 65536u);
  EXPECT_EQ(b::kMaxAttentionWidth, 4194304u);
  EXPECT_EQ(b::kMaxVocabSize, 1073741824u);
  EXPECT_EQ(b::kMaxPipeline, 4096u);
  EXPECT_EQ(b::kMaxData, 65536u);
  EXPECT_EQ(b::kMaxWorldSize, 1048576u);
  EXPECT_EQ(b::kMaxDevicesPerNode, 1024u);
  EXPECT_EQ(b::kMaxContext, 1024u);
  EXPECT_EQ(b::kMaxDeviceMemoryMib, 67108864u);
  EXPECT_EQ(b::kMinBandwidthGbps, 1e-3);
  EXPECT_EQ(b::kMaxBandwidthGbps, 1e6);
  EXPECT_EQ(b::kMaxLatencyUs, 1e6);
  EXPECT_EQ(b::kMaxSequenceLength, 16777216u);
  EXPECT_EQ(b::kMaxTokensPerBatch, 4294967296u);
  EXPECT_EQ(b::kMaxSyntheticSamples, 4294967296u);
  EXPECT_EQ(b::kMaxTmaxIntervalMs, 1e6);
  EXPECT_EQ(b::kMaxLengthMultiple, 4096u);
  EXPECT_EQ(b::kMaxPlanAhead, 1048576u);
  EXPECT_EQ(b::kMaxPlannerThreads, 1024u);
  EXPECT_EQ(b::kMaxKfkbK, 1024u);
  EXPECT_EQ(b::kMaxFixedMicroBatchSize, 1048576u);
  EXPECT_EQ(b::kMaxIterations, 1000000000000u);
  EXPECT_EQ(b::kMaxWatchdogTimeoutS, 604800u);
  EXPECT_EQ(b::kMaxLearningRate, 1e3);
  EXPECT_EQ(b::kMaxWeightDecay, 1e3);
  EXPECT_EQ(b::kMaxAdamEpsilon, 1.0);
  EXPECT_EQ(b::kMaxGradientClipNorm, 1e6);
}

// kValidGpt parsed, without defaults.
v1::JobConfig BaseConfig() {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(kValidGpt, "job.json");
  EXPECT_THAT(config, IsOk());
  return config.ok() ? *config : v1::JobConfig();
}

std::vector<std::string> ErrorsOf(v1::JobConfig config) {
  ApplyJobConfigDefaults(config);
  return JobConfigErrors(config);
}

// A bounded integer field: `set` writes a value into kValidGpt (and whatever
// else the value needs to be valid at the bound, e.g. enough layers for a
// deep pipeline).
struct IntegerBound {
  std::string name;
  std::string field;
  uint64_t bound;
  std::function<void(v1::JobConfig&, uint64_t)> set;
};

class JobConfigIntegerBounds : public ::testing::TestWithParam<IntegerBound> {};

TEST_P(JobConfigIntegerBounds, AcceptsTheBoundAndRefusesOneMore) {
  const IntegerBound& c = GetParam();
  v1::JobConfig at = BaseConfig();
  c.set(at, c.bound);
  EXPECT_THAT(ErrorsOf(at), ::testing::IsEmpty()) << "at the bound " << c.bound;
  v1::JobConfig above = BaseConfig();
  c.set(above, c.bound + 1);
  EXPECT_THAT(ErrorsOf(above), Contains(absl::StrCat(c.field, ": is too large (", c.bound + 1,
                                                     "; at most ", c.bound, ")")));
}

void MakeT5(v1::JobConfig& config) { config.mutable_model()->set_kind(v1::T5); }

INSTANTIATE_TEST_SUITE_P(
    EveryField, JobConfigIntegerBounds,
    ::testing::Values(
        IntegerBound{"NumLayers", "model.num_layers", 4096,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_model()->set_num_layers(v); }},
        IntegerBound{"NumDecoderLayers", "model.num_decoder_layers", 4096,
                     [](v1::JobConfig& c, uint64_t v) {
                       MakeT5(c);
                       c.mutable_model()->set_num_decoder_layers(v);
                     }},
        IntegerBound{"HiddenSize", "model.hidden_size", uint64_t{1} << 20,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_model()->set_hidden_size(v); }},
        IntegerBound{"AttentionHeads", "model.num_attention_heads", uint64_t{1} << 16,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_model()->set_num_attention_heads(v);
                       c.mutable_model()->set_kv_channels(1);
                     }},
        IntegerBound{"KvChannels", "model.kv_channels", uint64_t{1} << 20,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_model()->set_num_attention_heads(1);
                       c.mutable_model()->set_kv_channels(v);
                     }},
        IntegerBound{
            "FfnHiddenSize", "model.ffn_hidden_size", uint64_t{1} << 22,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_model()->set_ffn_hidden_size(v); }},
        IntegerBound{"VocabSize", "model.vocab_size", uint64_t{1} << 30,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_model()->set_vocab_size(v); }},
        IntegerBound{"Pipeline", "parallelism.pipeline", 4096,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_model()->set_num_layers(4096);
                       c.mutable_parallelism()->set_pipeline(v);
                     }},
        IntegerBound{"Data", "parallelism.data", uint64_t{1} << 16,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_parallelism()->set_data(v); }},
        IntegerBound{"Context", "parallelism.context", 1024,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_parallelism()->set_context(v); }},
        IntegerBound{
            "DevicesPerNode", "cluster.devices_per_node", 1024,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_cluster()->set_devices_per_node(v); }},
        IntegerBound{"DeviceMemory", "cluster.device_memory_limit_mib", uint64_t{1} << 26,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_cluster()->set_device_memory_limit_mib(v);
                     }},
        IntegerBound{"MaxSequenceLength", "data.max_sequence_length", uint64_t{1} << 24,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_data()->set_max_sequence_length(v);
                       c.mutable_data()->set_tokens_per_global_batch(uint64_t{1} << 32);
                     }},
        IntegerBound{"MaxTargetLength", "data.max_target_length", uint64_t{1} << 24,
                     [](v1::JobConfig& c, uint64_t v) {
                       MakeT5(c);
                       c.mutable_data()->set_max_target_length(v);
                       c.mutable_data()->set_tokens_per_global_batch(uint64_t{1} << 32);
                     }},
        IntegerBound{
            "TokensPerGlobalBatch", "data.tokens_per_global_batch", uint64_t{1} << 32,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_data()->set_tokens_per_global_batch(v); }},
        IntegerBound{
            "SyntheticSamples", "data.synthetic_num_samples", uint64_t{1} << 32,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_data()->set_synthetic_num_samples(v); }},
        IntegerBound{
            "LengthMultiple", "planner.length_multiple", 4096,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_planner()->set_length_multiple(v); }},
        IntegerBound{"PlanAhead", "planner.plan_ahead", uint64_t{1} << 20,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_planner()->set_plan_ahead(v); }},
        IntegerBound{"Threads", "planner.threads", 1024,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_planner()->set_threads(v); }},
        IntegerBound{"KfkbK", "planner.kfkb_k", 1024,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_planner()->set_kfkb_k(v); }},
        IntegerBound{"FixedMicroBatchSize", "planner.fixed_micro_batch_size", uint64_t{1} << 20,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_planner()->set_fixed_micro_batch_size(v);
                     }},
        IntegerBound{"MicroBatchTokenBudget", "planner.micro_batch_token_budget", uint64_t{1} << 32,
                     [](v1::JobConfig& c, uint64_t v) {
                       c.mutable_planner()->set_micro_batch_token_budget(v);
                     }},
        IntegerBound{"Iterations", "training.iterations", 1000000000000,
                     [](v1::JobConfig& c, uint64_t v) { c.mutable_training()->set_iterations(v); }},
        IntegerBound{
            "WarmupIterations", "training.warmup_iterations", 1000000000000,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_training()->set_warmup_iterations(v); }},
        IntegerBound{
            "CheckpointInterval", "training.checkpoint_interval", 1000000000000,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_training()->set_checkpoint_interval(v); }},
        IntegerBound{
            "WatchdogTimeout", "training.watchdog_timeout_s", 7 * 24 * 3600,
            [](v1::JobConfig& c, uint64_t v) { c.mutable_training()->set_watchdog_timeout_s(v); }}),
    [](const ::testing::TestParamInfo<IntegerBound>& info) { return info.param.name; });

// The largest value of each uint32 field (and of each uint64 field) is
// refused with its full digits: nothing wraps on the way to the message.
TEST(JobConfigBounds, LargestIntegersAreRefusedWithTheirDigits) {
  constexpr uint32_t kMax32 = std::numeric_limits<uint32_t>::max();
  constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
  v1::JobConfig config = BaseConfig();
  config.mutable_model()->set_kv_channels(kMax32);
  config.mutable_parallelism()->set_pipeline(kMax32);
  config.mutable_parallelism()->set_data(kMax32);
  config.mutable_parallelism()->set_virtual_chunks(kMax32);
  config.mutable_cluster()->set_device_memory_limit_mib(kMax64);
  config.mutable_data()->set_tokens_per_global_batch(kMax64);
  config.mutable_data()->set_synthetic_num_samples(kMax64);
  config.mutable_planner()->set_micro_batch_token_budget(kMax64);
  config.mutable_training()->set_iterations(kMax64);
  config.mutable_training()->set_watchdog_timeout_s(kMax32);
  const std::vector<std::string> errors = ErrorsOf(config);
  EXPECT_THAT(errors, Contains("model.kv_channels: is too large (4294967295; at most 1048576)"));
  EXPECT_THAT(errors, Contains("parallelism.pipeline: is too large (4294967295; at most 4096)"));
  EXPECT_THAT(errors, Contains("parallelism.data: is too large (4294967295; at most 65536)"));
  EXPECT_THAT(errors, Contains("parallelism.pipeline: pipeline (4294967295) x virtual_chunks "
                               "(4294967295) = 18446744065119617025 stages exceeds the model's 4 "
                               "layers"));
  EXPECT_THAT(errors, Contains("cluster.device_memory_limit_mib: is too large "
                               "(18446744073709551615; at most 67108864)"));
  EXPECT_THAT(errors, Contains("data.tokens_per_global_batch: is too large "
                               "(18446744073709551615; at most 4294967296)"));
  EXPECT_THAT(errors, Contains("training.iterations: is too large (18446744073709551615; at most "
                               "1000000000000)"));
  EXPECT_THAT(errors,
              Contains("training.watchdog_timeout_s: is too large (4294967295; at most 604800)"));
}

TEST(JobConfigBounds, WorldSizeIsBounded) {
  v1::JobConfig at = BaseConfig();
  at.mutable_model()->set_num_layers(32);
  at.mutable_parallelism()->set_pipeline(16);
  at.mutable_parallelism()->set_data(65536);
  EXPECT_THAT(ErrorsOf(at), ::testing::IsEmpty());
  v1::JobConfig above = at;
  above.mutable_parallelism()->set_pipeline(17);
  EXPECT_THAT(ErrorsOf(above), ElementsAre("parallelism.data: pipeline (17) x data (65536) x "
                                           "tensor (1) = 1114112 ranks is too many (at most "
                                           "1048576)"));
}

TEST(JobConfigBounds, WorldSizeCountsTheContextGroups) {
  v1::JobConfig at = BaseConfig();
  at.mutable_model()->set_num_layers(32);
  at.mutable_parallelism()->set_pipeline(16);
  at.mutable_parallelism()->set_data(16384);
  at.mutable_parallelism()->set_context(4);
  EXPECT_THAT(ErrorsOf(at), ::testing::IsEmpty());
  ApplyJobConfigDefaults(at);
  EXPECT_EQ(WorldSize(at), 16 * 16384 * 4);
  v1::JobConfig above = at;
  above.mutable_parallelism()->set_context(8);
  EXPECT_THAT(ErrorsOf(above), ElementsAre("parallelism.data: pipeline (16) x data (16384) x "
                                           "tensor (1) x context (8) = 2097152 ranks is too many "
                                           "(at most 1048576)"));
}

TEST(JobConfig, ContextParallelismDefaultsAndWorldSize) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(kValidGpt);
  ASSERT_THAT(config, IsOk());
  // 0 (unset) means 1; the split policy defaults to the per-micro-batch
  // choice.
  EXPECT_EQ(config->parallelism().context(), 1u);
  EXPECT_EQ(config->parallelism().context_split(), v1::PER_MICRO_BATCH);
  absl::StatusOr<v1::JobConfig> cp = ParseAndValidate(Replace(
      R"("data": 2})", R"("data": 2, "tensor": 2, "context": 2, "context_split": "always"})"));
  ASSERT_THAT(cp, IsOk());
  EXPECT_EQ(cp->parallelism().context_split(), v1::ALWAYS);
  // pipeline 2 x data 2 x tensor 2 x context 2.
  EXPECT_EQ(WorldSize(*cp), 16);
  absl::StatusOr<v1::JobConfig> llama =
      ParseAndValidate(Replace(R"("kind": "GPT", "num_layers": 4)",
                               R"("kind": "GPT", "architecture": "LLAMA", "num_layers": 4)"));
  ASSERT_THAT(llama, IsOk());
}

TEST(JobConfig, ContextParallelismRefusesT5NamingTheFieldAndTheKind) {
  std::string json = Replace(R"("kind": "GPT")", R"("kind": "T5")");
  json = absl::StrReplaceAll(json, {{R"("data": 2})", R"("data": 2, "context": 2})"}});
  EXPECT_THAT(ParseAndValidate(json),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parallelism.context: context parallelism (2) is for GPT and "
                                 "Llama models only (model.kind is T5): must be 1")));
  // Context 1 is every model's.
  json = absl::StrReplaceAll(json, {{R"("context": 2)", R"("context": 1)"}});
  EXPECT_THAT(ParseAndValidate(json), IsOk());
}

TEST(JobConfigBounds, AttentionWidthIsBounded) {
  v1::JobConfig at = BaseConfig();
  at.mutable_model()->set_num_attention_heads(4);
  at.mutable_model()->set_kv_channels(uint64_t{1} << 20);
  EXPECT_THAT(ErrorsOf(at), ::testing::IsEmpty());
  v1::JobConfig above = at;
  above.mutable_model()->set_num_attention_heads(5);
  EXPECT_THAT(ErrorsOf(above), ElementsAre("model.kv_channels: num_attention_heads (5) x "
                                           "kv_channels (1048576) = 5242880 is too large (at "
                                           "most 4194304)"));
}

// A bounded double field, set through the JSON text: `before` is replaced
// by `before`, "field": value.
struct RealBound {
  std::string name;
  std::string field;  // full path; the JSON key is its last part
  std::string before;
  std::string bound;  // as the error prints it
  std::string above;
};

std::string WithValue(const RealBound& c, absl::string_view value) {
  const std::string key = c.field.substr(c.field.rfind('.') + 1);
  if (c.before == "planner") {
    return Replace(R"("training")",
                   absl::StrCat(R"("planner": {")", key, R"(": )", value, R"(}, "training")"));
  }
  return Replace(c.before, absl::StrCat(c.before, R"(, ")", key, R"(": )", value));
}

class JobConfigRealBounds : public ::testing::TestWithParam<RealBound> {};

TEST_P(JobConfigRealBounds, AcceptsTheBoundAndRefusesMore) {
  const RealBound& c = GetParam();
  EXPECT_THAT(ParseAndValidate(WithValue(c, c.bound)), IsOk());
  EXPECT_THAT(ParseAndValidate(WithValue(c, c.above)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(c.field, ": is too large (", c.above, "; at most ",
                                              c.bound, ")"))));
}

// NaN and both infinities (protobuf JSON: "NaN", "Infinity", "-Infinity")
// are refused naming the field, whatever the field's range.
TEST_P(JobConfigRealBounds, RefusesNanAndInfinities) {
  const RealBound& c = GetParam();
  for (const auto& [json, printed] : std::vector<std::pair<std::string, std::string>>{
           {R"("NaN")", "nan"}, {R"("Infinity")", "inf"}, {R"("-Infinity")", "-inf"}}) {
    EXPECT_THAT(
        ParseAndValidate(WithValue(c, json)),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr(absl::StrCat(c.field, ": must be a finite number (got ", printed, ")"))))
        << json;
  }
}

constexpr char kCluster[] = R"("device_memory_limit_mib": 8192)";
constexpr char kTraining[] = R"("iterations": 10)";

INSTANTIATE_TEST_SUITE_P(
    EveryField, JobConfigRealBounds,
    ::testing::Values(
        RealBound{"IntraBandwidth", "cluster.intra_node_bandwidth_gbps", kCluster, "1000000",
                  "1000000.001"},
        RealBound{"IntraLatency", "cluster.intra_node_latency_us", kCluster, "1000000",
                  "1000000.001"},
        RealBound{"InterBandwidth", "cluster.inter_node_bandwidth_gbps", kCluster, "1000000",
                  "1000000.001"},
        RealBound{"InterLatency", "cluster.inter_node_latency_us", kCluster, "1000000",
                  "1000000.001"},
        RealBound{"TmaxInterval", "planner.tmax_interval_ms", "planner", "1000000", "1000000.001"},
        RealBound{"LearningRate", "training.learning_rate", kTraining, "1000", "1000.000001"},
        RealBound{"WeightDecay", "training.weight_decay", kTraining, "1000", "1000.000001"},
        RealBound{"AdamEpsilon", "training.adam_epsilon", kTraining, "1", "1.000000001"},
        RealBound{"GradientClipNorm", "training.gradient_clip_norm", kTraining, "1000000",
                  "1000000.001"}),
    [](const ::testing::TestParamInfo<RealBound>& info) { return info.param.name; });

// The double fields without an upper bound of their own are checked for
// NaN and infinities too.
TEST(JobConfigBounds, EveryDoubleFieldRefusesNanAndInfinities) {
  for (const RealBound& c : {RealBound{"", "training.min_learning_rate", kTraining, "", ""},
                             RealBound{"", "training.adam_beta1", kTraining, "", ""},
                             RealBound{"", "training.adam_beta2", kTraining, "", ""}}) {
    for (const auto& [json, printed] : std::vector<std::pair<std::string, std::string>>{
             {R"("NaN")", "nan"}, {R"("Infinity")", "inf"}, {R"("-Infinity")", "-inf"}}) {
      EXPECT_THAT(ParseAndValidate(WithValue(c, json)),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr(absl::StrCat(c.field, ": must be a finite number (got ",
                                                  printed, ")"))))
          << c.field << " " << json;
    }
  }
  // The learning rate's NaN reaches the default minimum (learning_rate / 10):
  // both are named.
  absl::StatusOr<v1::JobConfig> nan_rate =
      ParseAndValidate(Replace(kTraining, R"("iterations": 10, "learning_rate": "NaN")"));
  EXPECT_THAT(nan_rate, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("training.learning_rate: must be a finite number"),
                                       HasSubstr("training.min_learning_rate: must be a finite "
                                                 "number"))));
}

TEST(JobConfigBounds, SmallestBandwidthIsAccepted) {
  EXPECT_THAT(ParseAndValidate(Replace(kCluster, R"("device_memory_limit_mib": 8192, )"
                                                 R"("inter_node_bandwidth_gbps": 0.001)")),
              IsOk());
}

TEST(JobConfig, ReportsEveryErrorAtOnce) {
  std::string json = Replace(R"("num_layers": 4)", R"("num_layers": 0)");
  json = absl::StrReplaceAll(json, {{R"("iterations": 10)", R"("iterations": 0)"}});
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "job.json");
  ASSERT_THAT(config, IsOk());
  ApplyJobConfigDefaults(*config);
  const std::vector<std::string> errors = JobConfigErrors(*config);
  ASSERT_EQ(errors.size(), 2u) << absl::StrJoin(errors, "\n");
  EXPECT_THAT(errors[0], HasSubstr("model.num_layers"));
  EXPECT_THAT(errors[1], HasSubstr("training.iterations"));
}

TEST(JobConfig, T5DefaultsAndTargetPathRule) {
  std::string json = Replace(R"("kind": "GPT")", R"("kind": "T5")");
  json = absl::StrReplaceAll(
      json, {{R"("format": "SYNTHETIC")", R"("format": "MEGATRON_INDEXED", "path": "in")"}});
  EXPECT_THAT(ParseAndValidate(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.target_path")));
  json = absl::StrReplaceAll(json, {{R"("path": "in")", R"("path": "in", "target_path": "out")"}});
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(json);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->model().num_decoder_layers(), 4u);
  EXPECT_EQ(config->data().max_target_length(), 1024u);
}

TEST(JobConfig, JsonRoundTrip) {
  absl::StatusOr<v1::JobConfig> config = ParseAndValidate(kValidGpt);
  ASSERT_THAT(config, IsOk());
  const std::string json = JobConfigToJson(*config);
  EXPECT_THAT(json, HasSubstr("\"micro_batch_token_budget\""));  // proto field names
  absl::StatusOr<v1::JobConfig> again = ParseJobConfigJson(json, "round-trip");
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*config, *again));
}

class JobConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        std::filesystem::temp_directory_path() / absl::StrCat("varipipe-config-test-", getpid());
    std::filesystem::create_directories(directory_ / "conf");
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path path = directory_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::filesystem::path directory_;
};

TEST_F(JobConfigFileTest, ResolvesRelativePathsAgainstTheConfigDirectory) {
  std::string json = Replace(R"("format": "SYNTHETIC")", R"("format": "JSONL", "path": "d.jsonl")");
  json = absl::StrReplaceAll(
      json, {{R"("training")", R"("store": {"password_file": "../secret"}, "training")"}});
  const std::string path = Write("conf/job.json", json);
  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile(path);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->data().path(), (directory_ / "conf/d.jsonl").string());
  EXPECT_EQ(config->store().password_file(), (directory_ / "secret").string());
}

// Changes the working directory while it lives.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const std::filesystem::path& to)
      : previous_(std::filesystem::current_path()) {
    std::filesystem::current_path(to);
  }
  ~WorkingDirectory() { std::filesystem::current_path(previous_); }

 private:
  std::filesystem::path previous_;
};

// Every path field of the job, relative.
std::string ConfigWithRelativePaths() {
  std::string json = absl::StrReplaceAll(
      kValidGpt,
      {{R"("kind": "GPT")", R"("kind": "GPT", "architecture": "LLAMA")"},
       {R"("format": "SYNTHETIC")",
        R"("format": "MEGATRON_INDEXED", "path": "data/in", "target_path": "./data/../data/tg")"},
       {R"("training": {"iterations": 10})",
        R"("planner": {"cost_model_path": "../profiles/job.json"},
           "store": {"password_file": "secret"},
           "training": {"iterations": 10, "checkpoint_dir": "ckpt", "init_from": "hf-base"})"}});
  EXPECT_NE(json, kValidGpt);
  return json;
}

// A daemon started as `varipipe-planner --config job.json` hands its config
// to executors running elsewhere: the paths must not depend on either's
// working directory.
TEST_F(JobConfigFileTest, EveryPathFieldIsAbsoluteUnderTheConfigDirectory) {
  Write("conf/job.json", ConfigWithRelativePaths());
  std::filesystem::create_directories(directory_ / "elsewhere");
  // getcwd names the directory without symbolic links.
  const std::filesystem::path conf = std::filesystem::canonical(directory_ / "conf");
  const std::filesystem::path top = conf.parent_path();
  for (const auto& [cwd, given] : std::vector<std::pair<std::filesystem::path, std::string>>{
           {directory_ / "conf", "job.json"},
           {directory_ / "elsewhere", "../conf/job.json"},
           {directory_ / "elsewhere", (directory_ / "conf/job.json").string()}}) {
    SCOPED_TRACE(absl::StrCat("--config ", given, " from ", cwd.string()));
    absl::StatusOr<v1::JobConfig> config;
    {
      WorkingDirectory in(cwd);
      config = LoadJobConfigFile(given);
    }
    ASSERT_THAT(config, IsOk());
    EXPECT_EQ(config->data().path(), (conf / "data/in").string());
    EXPECT_EQ(config->data().target_path(), (conf / "data/tg").string());
    EXPECT_EQ(config->planner().cost_model_path(), (top / "profiles/job.json").string());
    EXPECT_EQ(config->store().password_file(), (conf / "secret").string());
    EXPECT_EQ(config->training().checkpoint_dir(), (conf / "ckpt").string());
    EXPECT_EQ(config->training().init_from(), (conf / "hf-base").string());
    for (const std::string* path :
         {&config->data().path(), &config->data().target_path(),
          &config->planner().cost_model_path(), &config->store().password_file(),
          &config->training().checkpoint_dir(), &config->training().init_from()}) {
      EXPECT_TRUE(std::filesystem::path(*path).is_absolute()) << *path;
    }
  }
}

TEST_F(JobConfigFileTest, AbsolutePathsStayAndEmptyOnesStayEmpty) {
  std::string json = absl::StrReplaceAll(ConfigWithRelativePaths(),
                                         {{R"("data/in")", R"("/data/in")"},
                                          {R"("./data/../data/tg")", R"("/data/tg")"},
                                          {R"("../profiles/job.json")", R"("/profiles/job.json")"},
                                          {R"("secret")", R"("/run/secret")"},
                                          {R"("ckpt")", R"("/checkpoints/job/")"},
                                          {R"("hf-base")", R"("/models/hf-base")"}});
  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile(Write("conf/absolute.json", json));
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->data().path(), "/data/in");
  EXPECT_EQ(config->data().target_path(), "/data/tg");
  EXPECT_EQ(config->planner().cost_model_path(), "/profiles/job.json");
  EXPECT_EQ(config->store().password_file(), "/run/secret");
  EXPECT_EQ(config->training().checkpoint_dir(), "/checkpoints/job/");
  EXPECT_EQ(config->training().init_from(), "/models/hf-base");
  // kValidGpt names no file at all.
  config = LoadJobConfigFile(Write("conf/none.json", kValidGpt));
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->data().path(), "");
  EXPECT_EQ(config->data().target_path(), "");
  EXPECT_EQ(config->planner().cost_model_path(), "");
  EXPECT_EQ(config->store().password_file(), "");
  EXPECT_EQ(config->training().checkpoint_dir(), "");
  EXPECT_EQ(config->training().init_from(), "");
}

TEST_F(JobConfigFileTest, DirectoryIsRejectedClearly) {
  EXPECT_THAT(LoadJobConfigFile(directory_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
}

TEST_F(JobConfigFileTest, ErrorsNameTheFile) {
  const std::string path = Write("bad.json", Replace(R"("num_layers": 4)", R"("num_layers": 0)"));
  EXPECT_THAT(LoadJobConfigFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("model.num_layers"))));
  EXPECT_THAT(LoadJobConfigFile((directory_ / "missing.json").string()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.json")));
}

// Every example config shipped in deploy/configs/ loads and validates.
TEST(ExampleConfigs, AllLoad) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(VARIPIPE_SOURCE_DIR) / "deploy/configs")) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    EXPECT_THAT(LoadJobConfigFile(entry.path().string()), IsOk()) << entry.path();
  }
  EXPECT_GE(count, 3);
}

// So do the job configs the fuzz targets start from (seeds and the plan
// targets' configs), among them one with every bounded field at its bound.
// Seeds named regression-* are inputs that once failed, not configs.
TEST(ExampleConfigs, FuzzSeedConfigsLoad) {
  int count = 0;
  for (const char* dir : {"tests/fuzz/corpus/job_config", "tests/fuzz/plan_configs"}) {
    for (const auto& entry :
         std::filesystem::directory_iterator(std::filesystem::path(VARIPIPE_SOURCE_DIR) / dir)) {
      if (entry.path().extension() != ".json" ||
          entry.path().filename().string().rfind("regression-", 0) == 0) {
        continue;
      }
      ++count;
      EXPECT_THAT(LoadJobConfigFile(entry.path().string()), IsOk()) << entry.path();
    }
  }
  EXPECT_GE(count, 8);
}

}  // namespace
}  // namespace varipipe
