// An export that started from a Hugging Face checkpoint carries its
// config.json field by field (only the weights' dtype follows the export)
// and copies its tokenizer and generation files: configs of the shapes of
// Llama-2, Llama-3.1 (llama3 rope scaling, a list of end tokens) and
// FLAN-T5 as their hubs publish them.
#include "common/checkpoint/hf_export_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"

namespace varipipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr char kLlama2[] = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pad_token_id": 0,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kFlanT5[] = R"({
  "architectures": ["T5ForConditionalGeneration"],
  "d_ff": 5120,
  "d_kv": 64,
  "d_model": 2048,
  "decoder_start_token_id": 0,
  "dense_act_fn": "gelu_new",
  "dropout_rate": 0.1,
  "eos_token_id": 1,
  "feed_forward_proj": "gated-gelu",
  "initializer_factor": 1.0,
  "is_encoder_decoder": true,
  "is_gated_act": true,
  "layer_norm_epsilon": 1e-06,
  "model_type": "t5",
  "n_positions": 512,
  "num_decoder_layers": 24,
  "num_heads": 32,
  "num_layers": 24,
  "output_past": true,
  "pad_token_id": 0,
  "relative_attention_max_distance": 128,
  "relative_attention_num_buckets": 32,
  "task_specific_params": {
    "summarization": {"early_stopping": true, "length_penalty": 2.0, "max_length": 200,
                      "min_length": 30, "no_repeat_ngram_size": 3, "num_beams": 4,
                      "prefix": "summarize: "}
  },
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "transformers_version": "4.23.1",
  "use_cache": true,
  "vocab_size": 32128
})";

struct Fixture {
  const char* name;
  const char* json;
  const char* dtype;  // its torch_dtype
};

const Fixture kFixtures[] = {
    {"llama-2", kLlama2, "float16"},
    {"llama-3.1", kLlama31, "bfloat16"},
    {"flan-t5", kFlanT5, "float32"},
};

// Every field of `want` is in `got` with an equal value, in the same order,
// and `got` has no other field.
void ExpectSameFields(const nlohmann::ordered_json& got, const nlohmann::ordered_json& want) {
  ASSERT_TRUE(got.is_object());
  std::vector<std::string> got_keys, want_keys;
  for (const auto& [key, value] : got.items()) got_keys.push_back(key);
  for (const auto& [key, value] : want.items()) {
    want_keys.push_back(key);
    ASSERT_TRUE(got.contains(key)) << key << " was dropped";
    EXPECT_EQ(got[key], value) << key;
  }
  EXPECT_EQ(got_keys, want_keys);
}

nlohmann::ordered_json Parse(const std::string& text) {
  return nlohmann::ordered_json::parse(text);
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(CarriedHuggingFaceConfig, RoundTripsFieldByField) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    absl::StatusOr<std::string> out = CarriedHuggingFaceConfig(f.json, f.name, f.dtype);
    ASSERT_THAT(out, IsOk());
    ExpectSameFields(Parse(*out), Parse(f.json));
  }
  // What the data limits of a job would have changed stays the checkpoint's.
  const nlohmann::ordered_json llama3 = Parse(*CarriedHuggingFaceConfig(kLlama31, "", "bfloat16"));
  EXPECT_EQ(llama3["max_position_embeddings"], 131072);
  EXPECT_EQ(llama3["bos_token_id"], 128000);
  EXPECT_EQ(llama3["eos_token_id"], nlohmann::ordered_json::array({128001, 128008, 128009}));
  EXPECT_EQ(llama3["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(Parse(*CarriedHuggingFaceConfig(kFlanT5, "", "float32"))["n_positions"], 512);
}

TEST(CarriedHuggingFaceConfig, OnlyTheDtypeFollowsTheExport) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    absl::StatusOr<std::string> out = CarriedHuggingFaceConfig(f.json, f.name, "bfloat16");
    ASSERT_THAT(out, IsOk());
    nlohmann::ordered_json want = Parse(f.json);
    want["torch_dtype"] = "bfloat16";
    ExpectSameFields(Parse(*out), want);
  }
}

// transformers 5 names the dtype `dtype` (tests/data/hf was written by it);
// a config naming none gains torch_dtype.
TEST(CarriedHuggingFaceConfig, Transformers5DtypeAndNone) {
  const std::string golden =
      ReadBytes(fs::path(VARIPIPE_SOURCE_DIR) / "tests/data/hf/llama-tiny/config.json");
  ASSERT_FALSE(golden.empty());
  absl::StatusOr<std::string> out = CarriedHuggingFaceConfig(golden, "llama-tiny", "float16");
  ASSERT_THAT(out, IsOk());
  nlohmann::ordered_json want = Parse(golden);
  ASSERT_EQ(want["dtype"], "float32");
  want["dtype"] = "float16";
  ExpectSameFields(Parse(*out), want);

  out = CarriedHuggingFaceConfig(R"({"model_type": "llama", "bos_token_id": 1})", "x", "bfloat16");
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(Parse(*out),
            Parse(R"({"model_type": "llama", "bos_token_id": 1, "torch_dtype": "bfloat16"})"));
}

TEST(CarriedHuggingFaceConfig, NotAnObjectIsNamed) {
  EXPECT_THAT(CarriedHuggingFaceConfig("[1, 2]", "/models/base/config.json", "float32"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("/models/base/config.json: not a JSON object")));
  EXPECT_THAT(CarriedHuggingFaceConfig("{\"a\": ", "c.json", "float32"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("c.json")));
}

TEST(CarryHuggingFaceModelFiles, WritesTheConfigAndCopiesTheTokenizer) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-export-config");
  const fs::path base = dir / "base";
  const fs::path out = dir / "out";
  fs::create_directories(base);
  fs::create_directories(out);
  std::ofstream(base / "config.json") << kLlama31;
  std::ofstream(base / "generation_config.json")
      << R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})";
  std::ofstream(base / "tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
  std::ofstream(base / "tokenizer_config.json") << R"({"model_max_length": 131072})";
  const std::string model_bytes("\x0a\x05\x00\xff<unk>", 9);  // binary: any byte
  std::ofstream(base / "tokenizer.model", std::ios::binary) << model_bytes;
  std::ofstream(base / "model.safetensors") << "weights are not carried";
  std::ofstream(base / "README.md") << "neither is anything else";

  ASSERT_THAT(CarryHuggingFaceModelFiles(base.string(), out.string(), "float32"), IsOk());
  nlohmann::ordered_json want = Parse(kLlama31);
  want["torch_dtype"] = "float32";
  ExpectSameFields(Parse(ReadBytes(out / "config.json")), want);
  for (const char* name :
       {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model"}) {
    EXPECT_EQ(ReadBytes(out / name), ReadBytes(base / name)) << name;
  }
  EXPECT_EQ(ReadBytes(out / "tokenizer.model"), model_bytes);
  EXPECT_FALSE(fs::exists(out / "special_tokens_map.json"));  // the base has none
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "README.md"));
}

TEST(CarryHuggingFaceModelFiles, ErrorsNameTheFieldAndTheAbsolutePath) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-export-config");
  fs::create_directories(dir / "empty");
  const fs::path previous = fs::current_path();
  fs::current_path(dir);
  const absl::Status missing = CarryHuggingFaceModelFiles("hf-base", ".", "float32");
  const absl::Status no_config = CarryHuggingFaceModelFiles("empty", ".", "float32");
  fs::current_path(previous);
  const fs::path here = fs::canonical(dir);
  EXPECT_THAT(missing,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("training.init_from: ", (here / "hf-base").string(),
                                              ": not a directory"))));
  EXPECT_THAT(no_config, StatusIs(absl::StatusCode::kNotFound,
                                  HasSubstr(absl::StrCat("training.init_from: open ",
                                                         (here / "empty/config.json").string()))));
}

}  // namespace
}  // namespace varipipe
