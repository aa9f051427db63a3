// The job's model section from a Hugging Face config.json (what
// `varipipe-plan --model_from_hf` prints): the tiny checkpoints' configs of
// tests/data/hf, written by transformers 5, and configs in the older layout
// (top-level rope_theta, rope_scaling) and with what LLAMA cannot express.
#include "common/checkpoint/hf_model_config.h"

#include <filesystem>
#include <fstream>
#include <string>

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
  EXPECT_EQ(m->dtype(), v1::BFLOAT16);
}

TEST(ModelConfigFromHuggingFace, WhatLlamaCannotExpressIsNamed) {
  EXPECT_THAT(ModelConfigFromHuggingFace(WriteConfig(R"({"model_type": "t5"})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model_type is \"t5\"; only Llama-family checkpoints")));
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
