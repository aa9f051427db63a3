// The job's model section from a Hugging Face config.json (what
// `varipipe-plan --model_from_hf` prints): the tiny checkpoints' configs of
// tests/data/hf, written by transformers 5, and configs in the older layout
// (top-level rope_theta, rope_scaling) and with what LLAMA cannot express;
// and the checkpoint directory's errors, which name it absolute.
#include "common/checkpoint/hf_model_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "common/checkpoint/hf_checkpoint.h"
#include "common/config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

std::string Golden(const std::string& model) {
  return (std::filesystem::path(VARIPIPE_SOURCE_DIR) / "tests" / "data" / "hf" / model).string();
}

std::string WriteConfig(const std::string& json) {
  const std::filesystem::path dir = varipipe::testing::PerTestDirectory("hf-model-config");
  std::ofstream(dir / "config.json") << json;
  return (dir / "config.json").string();
}

TEST(ModelConfigFromHuggingFace, TheTinyLlamaMapsFieldByField) {
  absl::StatusOr<v1::ModelConfig> m = ModelConfigFromHuggingFace(Golden("llama-tiny"));
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->kind(), v1::GPT);
  EXPECT_EQ(m->architecture(), v1::LLAMA);
  EXPECT_EQ(m->num_layers(), 2u);
  EXPECT_EQ(m->hidden_size(), 32u);
  EXPECT_EQ(m->num_attention_heads(), 4u);
  EXPECT_EQ(m->num_key_value_heads(), 2u);
  EXPECT_EQ(m->kv_channels(), 8u);
  EXPECT_EQ(m->ffn_hidden_size(), 64u);
  EXPECT_EQ(m->vocab_size(), 96u);
  EXPECT_DOUBLE_EQ(m->norm_epsilon(), 1e-5);
  EXPECT_DOUBLE_EQ(m->rope_theta(), 10000);
  EXPECT_FALSE(m->has_rope_scaling());
  EXPECT_FALSE(m->tie_word_embeddings());
  EXPECT_EQ(m->max_position_embeddings(), 64u);
  EXPECT_EQ(m->dtype(), v1::FLOAT32);
  absl::StatusOr<v1::ModelConfig> tied = ModelConfigFromHuggingFace(Golden("llama-tiny-tied"));
  ASSERT_THAT(tied, IsOk());
  EXPECT_TRUE(tied->tie_word_embeddings());
}

TEST(ModelConfigFromHuggingFace, Llama31InTheOlderLayout) {
  const std::string path = WriteConfig(R"({"model_type": "llama", "num_hidden_layers": 32,
      "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
      "intermediate_size": 14336, "vocab_size": 128256, "rms_norm_eps": 1e-05,
      "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": false,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  absl::StatusOr<v1::ModelConfig> m = ModelConfigFromHuggingFace(path);
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->kv_channels(), 128u);
  EXPECT_DOUBLE_EQ(m->rope_theta(), 500000);
  EXPECT_DOUBLE_EQ(m->rope_scaling().factor(), 8);
  EXPECT_EQ(m->rope_scaling().original_max_position_embeddings(), 8192u);
  EXPECT_EQ(m->max_position_embeddings(), 0u);  // absent: unset
  EXPECT_EQ(m->dtype(), v1::BFLOAT16);
  absl::StatusOr<v1::ModelConfig> declared = ModelConfigFromHuggingFace(WriteConfig(R"({
      "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
      "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 96,
      "max_position_embeddings": 131072})"));
  ASSERT_THAT(declared, IsOk());
  EXPECT_EQ(declared->max_position_embeddings(), 131072u);
}

// A checkpoint directory named relative to the working directory is named
// absolute in errors: the executors' working directory is not the user's.
TEST(HuggingFaceCheckpoint, ErrorsNameTheAbsoluteDirectory) {
  const std::filesystem::path dir = varipipe::testing::PerTestDirectory("hf-checkpoint");
  std::filesystem::create_directories(dir / "no-config");
  const std::filesystem::path previous = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  const absl::Status missing = HuggingFaceCheckpoint::Open("hf-base").status();
  const absl::Status no_config = HuggingFaceCheckpoint::Open("no-config").status();
  std::filesystem::current_path(previous);
  const std::filesystem::path here = std::filesystem::canonical(dir);
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kNotFound,
                                HasSubstr((here / "hf-base").string() + ": not a directory")));
  EXPECT_THAT(no_config, StatusIs(absl::StatusCode::kNotFound,
                                  HasSubstr((here / "no-config").string() + ": no config.json")));
}

// google/flan-t5-xl's config.json: the model section of the FLAN-T5-XL
// preset.
TEST(ModelConfigFromHuggingFace, FlanT5XlIsTheT5V11Preset) {
  absl::StatusOr<v1::ModelConfig> m = ModelConfigFromHuggingFace(WriteConfig(R"({
      "architectures": ["T5ForConditionalGeneration"], "d_ff": 5120, "d_kv": 64,
      "d_model": 2048, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new",
      "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu",
      "initializer_factor": 1.0, "is_encoder_decoder": true, "is_gated_act": true,
      "layer_norm_epsilon": 1e-06, "model_type": "t5", "num_decoder_layers": 24,
      "num_heads": 32, "num_layers": 24, "output_past": true, "pad_token_id": 0,
      "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32,
      "tie_word_embeddings": false, "torch_dtype": "float32", "use_cache": true,
      "vocab_size": 32128})"));
  ASSERT_THAT(m, IsOk());
  absl::StatusOr<v1::JobConfig> preset =
      LoadJobConfigFile(std::string(VARIPIPE_SOURCE_DIR) + "/deploy/configs/flan-t5-xl.json");
  ASSERT_THAT(preset, IsOk());
  v1::ModelConfig want = preset->model();
  want.set_dtype(v1::FLOAT32);  // the checkpoint's weights
  want.clear_attention_kernel();
  v1::ModelConfig got = *m;
  got.clear_attention_kernel();
  v1::JobConfig a, b;
  *a.mutable_model() = want;
  *b.mutable_model() = got;
  ApplyJobConfigDefaults(a);
  ApplyJobConfigDefaults(b);
  EXPECT_EQ(a.model().DebugString(), b.model().DebugString());
}

TEST(ModelConfigFromHuggingFace, WhatLlamaCannotExpressIsNamed) {
  EXPECT_THAT(ModelConfigFromHuggingFace(WriteConfig(R"({"model_type": "gpt2"})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model_type is \"gpt2\"; only Llama-family (model_type "
                                 "\"llama\") and T5 v1.1 / FLAN-T5 (\"t5\") checkpoints")));
  EXPECT_THAT(ModelConfigFromHuggingFace(WriteConfig(
                  R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
                      "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 96,
                      "attention_bias": true})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("attention_bias is true; LLAMA layers have no biases")));
  EXPECT_THAT(ModelConfigFromHuggingFace(WriteConfig(
                  R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
                      "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 96,
                      "rope_scaling": {"type": "yarn", "factor": 4}})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rope_scaling.rope_type \"yarn\" is not supported")));
  EXPECT_THAT(
      ModelConfigFromHuggingFace(WriteConfig(R"({"model_type": "llama", "hidden_size": 32})")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_hidden_layers is missing")));
  EXPECT_THAT(ModelConfigFromHuggingFace("/nonexistent/config.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

}  // namespace
}  // namespace varipipe
