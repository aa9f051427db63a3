#include "common/config/job_config.h"

#include <filesystem>
#include <fstream>
#include <string>
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
  EXPECT_EQ(config->parallelism().tensor(), 1u);
  EXPECT_EQ(config->parallelism().virtual_chunks(), 1u);
  EXPECT_EQ(config->cluster().devices_per_node(), 8u);
  EXPECT_EQ(config->cluster().hardware(), "a100-40gb");
  EXPECT_EQ(config->data().synthetic_num_samples(), 1000000u);
  ASSERT_EQ(config->planner().partition_methods_size(), 1);
  EXPECT_EQ(config->planner().partition_methods(0), v1::DYNAMIC_PROGRAMMING);
  EXPECT_EQ(config->planner().schedules_size(), 2);
  EXPECT_EQ(config->planner().recompute_modes_size(), 3);
  EXPECT_DOUBLE_EQ(config->planner().tmax_interval_ms(), 0.5);
  EXPECT_EQ(config->planner().length_multiple(), 8u);
  EXPECT_EQ(config->planner().micro_batch_token_budget(), 4096u);
  EXPECT_EQ(config->store().key_prefix(), "varipipe");
  EXPECT_EQ(config->store().password_env(), "VARIPIPE_REDIS_PASSWORD");
  EXPECT_DOUBLE_EQ(config->training().min_learning_rate(), 1e-5);
  EXPECT_DOUBLE_EQ(config->training().gradient_clip_norm(), 1.0);
  EXPECT_EQ(WorldSize(*config), 4);
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
        BadCase{"ZeroVocab", R"("vocab_size": 1000)", R"("vocab_size": 0)", "model.vocab_size"},
        BadCase{"TensorParallel", R"("data": 2)", R"("data": 2, "tensor": 2)",
                "parallelism.tensor: only 1 is supported (got 2)"},
        BadCase{"TooManyStages", R"("pipeline": 2)", R"("pipeline": 8)",
                "parallelism.pipeline: pipeline (8) x virtual_chunks (1) = 8 stages exceeds the "
                "model's 4 layers"},
        BadCase{"ChunksWithoutInterleaved", R"("data": 2)", R"("data": 2, "virtual_chunks": 2)",
                "parallelism.virtual_chunks"},
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
                "training.zero_stage: must be 0 or 1 (got 3"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

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

}  // namespace
}  // namespace varipipe
