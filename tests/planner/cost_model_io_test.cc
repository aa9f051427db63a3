#include "planner/cost/cost_model_io.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/cost_model_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/dynapipe_profile_reader.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

class CostModelIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("varipipe-cost-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

// Numbers of a small T5 profile, as functions of the point, so the test can
// write the same values in both formats.
double Fw(const char* part, uint32_t b, uint32_t e, uint32_t d) {
  return std::string(part) == "encoder"   ? 0.1 * b * e / 64
         : std::string(part) == "decoder" ? 0.2 * b * (d + e / 4.0) / 64
                                          : 0.05 * b * d / 64;
}
double Act(const char* part, uint32_t b, uint32_t e, uint32_t d) {
  return std::string(part) == "encoder" ? 1.5 * b * e / 64 : 2.5 * b * (d + e) / 64;
}

void WriteDynaPipeFile(const fs::path& dir, uint32_t b, uint32_t e, uint32_t d, const char* rc) {
  std::ofstream out(dir / absl::StrCat("microbench_tp1_hs512_ah8_kv64_ffhs2048_encsl", e, "_decsl",
                                       d, "_mbs", b, rc, ".txt"));
  out.precision(17);
  // DynaPipe's profiler starts each file with a configuration header and
  // may write lines the importer does not know.
  out << "# tp1_hs512_ah8_kv64_ffhs2048_encsl" << e << "_decsl" << d << "_mbs" << b << rc << "\n";
  out << "profiling_iterations: 20\n";
  for (const char* part : {"encoder", "decoder", "postprocess"}) {
    out << "forward_" << part << ": " << Fw(part, b, e, d) << " ms\n";
    out << "backward_" << part << ": " << 2 * Fw(part, b, e, d) << " ms\n";
  }
  for (const char* part : {"encoder", "decoder"}) {
    out << part << "_activation: " << Act(part, b, e, d) << " MB\n";
    out << "peak_" << part << "_activation: " << 2 * Act(part, b, e, d) << " MB\n";
  }
  out << "model_embedding_params: 31.0 MB\nmodel_encoder_params: 6.0 MB\n"
      << "model_decoder_params: 8.0 MB\n";
}

TEST_F(CostModelIoTest, DynaPipeImportAgreesWithJsonHoldingTheSameNumbers) {
  const std::vector<uint32_t> bs = {1, 2, 4};
  const std::vector<uint32_t> ls = {64, 128};
  for (uint32_t b : bs) {
    for (uint32_t e : ls) {
      for (uint32_t d : ls) {
        WriteDynaPipeFile(dir_, b, e, d, "");
        WriteDynaPipeFile(dir_, b, e, d, "_rc_full");
      }
    }
  }
  DynaPipeProfileSummary summary;
  absl::StatusOr<CostModel> imported = ReadDynaPipeProfileDirectory(dir_.string(), &summary);
  ASSERT_THAT(imported, IsOk());
  EXPECT_EQ(summary.files, 24);
  EXPECT_EQ(summary.skipped_lines, 48);  // each file's header and unknown line
  EXPECT_THAT(imported->description(), HasSubstr("48 comment or unknown lines skipped"));
  EXPECT_TRUE(summary.encoder_decoder);
  EXPECT_EQ(summary.hidden, 512u);
  EXPECT_THAT(imported->CheckUsable(ModelKind::kT5, 1), IsOk());
  EXPECT_EQ(imported->CompleteRecomputeModes(ModelKind::kT5, 1),
            (std::vector<Recompute>{Recompute::kNone, Recompute::kFull}));

  // The same numbers in the project's JSON format.
  v1::CostModelFile file;
  file.set_format_version(kCostModelFormatVersion);
  for (Recompute mode : {Recompute::kNone, Recompute::kFull}) {
    for (const char* part : {"encoder", "decoder", "postprocess"}) {
      v1::CostGrid* g = file.add_grids();
      const bool dec = std::string(part) == "decoder";
      g->set_component(std::string(part) == "encoder" ? v1::ENCODER_LAYER
                       : dec                          ? v1::DECODER_LAYER
                                                      : v1::POSTPROCESS);
      g->set_recompute(RecomputeToProto(mode));
      for (uint32_t b : bs) g->add_micro_batch_sizes(b);
      for (uint32_t l : ls) g->add_seq_lens(l);
      if (dec)
        for (uint32_t l : ls) g->add_encoder_seq_lens(l);
      for (uint32_t b : bs) {
        for (uint32_t e : dec ? ls : std::vector<uint32_t>{0}) {
          for (uint32_t s : ls) {
            const uint32_t enc = dec ? e : s;
            const double f = Fw(part, b, enc, s);
            g->add_forward_ms(f);
            g->add_backward_ms(2 * f);
            const double a = std::string(part) == "postprocess" ? 0 : Act(part, b, enc, s);
            g->add_stored_activation_mib(a);
            g->add_peak_activation_mib(2 * a);
          }
        }
      }
    }
  }
  absl::StatusOr<CostModel> json = CostModelFromProto(file, "inline");
  ASSERT_THAT(json, IsOk());
  for (Recompute mode : {Recompute::kNone, Recompute::kFull}) {
    for (Component c :
         {Component::kEncoderLayer, Component::kDecoderLayer, Component::kPostprocess}) {
      const ProfileGrid* a = imported->Grid(c, mode, 1);
      const ProfileGrid* b = json->Grid(c, mode, 1);
      ASSERT_NE(a, nullptr);
      ASSERT_NE(b, nullptr);
      for (double mb : {1.0, 1.5, 3.0, 4.0}) {
        for (double s : {64.0, 100.0, 128.0}) {
          CostValues va, vb;
          ASSERT_TRUE(a->Lookup(mb, s, 90, &va));
          ASSERT_TRUE(b->Lookup(mb, s, 90, &vb));
          EXPECT_NEAR(va.forward_ms, vb.forward_ms, 1e-6 * (1 + vb.forward_ms));
          EXPECT_NEAR(va.backward_ms, vb.backward_ms, 1e-6 * (1 + vb.backward_ms));
          EXPECT_NEAR(va.stored_bytes, vb.stored_bytes, 1e-6 * (1 + vb.stored_bytes));
          EXPECT_NEAR(va.peak_bytes, vb.peak_bytes, 1e-6 * (1 + vb.peak_bytes));
        }
      }
    }
  }
  EXPECT_DOUBLE_EQ(imported->Parameters(Component::kEncoderLayer), 6.0 * (1 << 20) / 2);
  EXPECT_DOUBLE_EQ(imported->Parameters(Component::kPostprocess),
                   imported->Parameters(Component::kEmbedding));
}

TEST_F(CostModelIoTest, MissingSweepPointsAreInfeasible) {
  Write(
      "microbench_tp1_hs64_ah4_kv16_ffhs256_sl64_mbs1.txt",
      "forward_encoder: 1 ms\nbackward_encoder: 2 ms\nforward_postprocess: 0.1 ms\n"
      "backward_postprocess: 0.2 ms\nencoder_activation: 10 MB\npeak_encoder_activation: 20 MB\n");
  Write(
      "microbench_tp1_hs64_ah4_kv16_ffhs256_sl128_mbs1.txt",
      "forward_encoder: 2 ms\nbackward_encoder: 4 ms\nforward_postprocess: 0.1 ms\n"
      "backward_postprocess: 0.2 ms\nencoder_activation: 20 MB\npeak_encoder_activation: 40 MB\n");
  Write(
      "microbench_tp1_hs64_ah4_kv16_ffhs256_sl64_mbs2.txt",
      "forward_encoder: 2 ms\nbackward_encoder: 4 ms\nforward_postprocess: 0.2 ms\n"
      "backward_postprocess: 0.4 ms\nencoder_activation: 20 MB\npeak_encoder_activation: 40 MB\n");
  Write("notes.txt", "ignored: not a profile\n");
  absl::StatusOr<CostModel> model = ReadDynaPipeProfileDirectory(dir_.string());
  ASSERT_THAT(model, IsOk());
  const ProfileGrid* g = model->Grid(Component::kEncoderLayer, Recompute::kNone, 1);
  ASSERT_NE(g, nullptr);
  CostValues v;
  EXPECT_TRUE(g->Lookup(2, 64, &v));
  EXPECT_FALSE(g->Lookup(2, 128, &v));  // (mbs 2, sl 128) ran out of memory
  ASSERT_TRUE(g->Lookup(1, 96, &v));
  EXPECT_DOUBLE_EQ(v.forward_ms, 1.5);
}

TEST_F(CostModelIoTest, MalformedLinesNameFileAndLine) {
  const std::string name = "microbench_tp1_hs64_ah4_kv16_ffhs256_sl64_mbs1.txt";
  // A line that is not 'name: value unit' is skipped, so the value it
  // meant to give is missing.
  Write(name, "forward_encoder: 1 ms\nbackward_encoder 2 ms\n");
  EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(name), HasSubstr("has no 'backward_encoder:' line"))));
  Write(name, "forward_encoder: 1 s\n");
  EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(name + ":1:"), HasSubstr("must be ms"))));
  Write(name, "forward_encoder: -1 ms\n");
  EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 0")));
  Write(name, "forward_encoder: 1 ms\n");
  EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(name), HasSubstr("has no 'backward_encoder:' line"))));
  fs::remove(dir_ / name);
  Write("microbench_tp1_hs64_sl64.txt", "forward_encoder: 1 ms\n");
  EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("microbench_tp1_hs64_sl64.txt"), HasSubstr("file name"))));
}

// Found by the dynapipe_profile fuzz target: a number in a file name beyond
// 64 bits made std::stoul throw (ending the planner); one beyond 32 bits was
// silently truncated (tp 4294967297 read as tp 1).
TEST_F(CostModelIoTest, FileNameNumbersBeyond32BitsAreMalformed) {
  const std::string body =
      "forward_encoder: 1 ms\nbackward_encoder: 2 ms\nforward_postprocess: 0.1 ms\n"
      "backward_postprocess: 0.2 ms\nencoder_activation: 10 MB\npeak_encoder_activation: 20 MB\n";
  for (const std::string name :
       {"microbench_tp77777777777777777777_hs64_ah4_kv16_ffhs256_sl64_mbs1.txt",
        "microbench_tp4294967297_hs64_ah4_kv16_ffhs256_sl64_mbs1.txt",
        "microbench_tp1_hs64_ah4_kv16_ffhs256_sl64_mbs4294967296.txt"}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Write(name, body);
    EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(name), HasSubstr("too large"))))
        << name;
  }
}

TEST_F(CostModelIoTest, MixedModelsAreRejected) {
  const std::string body =
      "forward_encoder: 1 ms\nbackward_encoder: 2 ms\nforward_postprocess: 0.1 ms\n"
      "backward_postprocess: 0.2 ms\nencoder_activation: 10 MB\npeak_encoder_activation: 20 MB\n";
  Write("microbench_tp1_hs64_ah4_kv16_ffhs256_sl64_mbs1.txt", body);
  Write("microbench_tp1_hs128_ah4_kv16_ffhs256_sl64_mbs2.txt", body);
  EXPECT_THAT(ReadDynaPipeProfileDirectory(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model dimensions")));
}

TEST_F(CostModelIoTest, JsonRoundTripAndErrors) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims dims{.kind = ModelKind::kGpt,
                       .encoder_layers = 4,
                       .hidden = 256,
                       .heads = 4,
                       .kv_channels = 64,
                       .ffn = 1024,
                       .vocab = 1000,
                       .dtype_bytes = 2};
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(dims, *hw, {.max_micro_batch_size = 8, .max_seq_len = 128});
  ASSERT_THAT(model, IsOk());
  const std::string path = (dir_ / "model.json").string();
  ASSERT_THAT(SaveCostModelJson(*model, path), IsOk());
  absl::StatusOr<CostModel> loaded = LoadCostModel(path);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::ApproximatelyEquals(
      CostModelToProto(*model), CostModelToProto(*loaded)));
  EXPECT_THAT(loaded->CheckMatches(dims), IsOk());
  ModelDims other = dims;
  other.hidden = 512;
  EXPECT_THAT(loaded->CheckMatches(other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hidden size 256")));
  // The file records the attention kernel; a job with the other one is
  // refused (its activation memory grows with s instead of s^2).
  EXPECT_EQ(CostModelToProto(*loaded).model().attention_kernel(), v1::EXPLICIT);
  other = dims;
  other.attention_kernel = AttentionKernel::kFused;
  EXPECT_THAT(loaded->CheckMatches(other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("measured with the EXPLICIT attention kernel but the job's "
                                 "model.attention_kernel is FUSED")));

  Write("bad.json", R"({"format_version": 2, "grids": [{"component": "ENCODER_LAYER",
      "recompute": "RECOMPUTE_NONE", "micro_batch_sizes": [1, 2], "seq_lens": [16],
      "forward_ms": [1], "backward_ms": [1, 2], "stored_activation_mib": [1, 1],
      "peak_activation_mib": [1, 1]}]})");
  EXPECT_THAT(LoadCostModel((dir_ / "bad.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("bad.json: grids[0].forward_ms"),
                             HasSubstr("1 values for a grid of 2 points"))));
  Write("nan.json", R"({"format_version": 2, "grids": [{"component": "ENCODER_LAYER",
      "recompute": "RECOMPUTE_NONE", "micro_batch_sizes": [1], "seq_lens": [16],
      "forward_ms": ["NaN"], "backward_ms": [1], "stored_activation_mib": [1],
      "peak_activation_mib": [1]}]})");
  EXPECT_THAT(LoadCostModel((dir_ / "nan.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("nan.json: grids[0]"), HasSubstr("zero or positive"))));
  Write("v3.json", R"({"format_version": 3})");
  EXPECT_THAT(LoadCostModel((dir_ / "v3.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("v3.json: format_version must be 2 (got 3)")));
}

// A profile written before packed rows' attention ran as one
// variable-length kernel and the head only on labelled tokens (version 1)
// is refused, naming the file, both versions and what to do.
TEST_F(CostModelIoTest, RefusesProfilesOfTheFirstVersion) {
  Write("old.json", R"({"format_version": 1, "grids": [{"component": "ENCODER_LAYER",
      "recompute": "RECOMPUTE_NONE", "micro_batch_sizes": [1], "seq_lens": [16],
      "forward_ms": [1], "backward_ms": [1], "stored_activation_mib": [1],
      "peak_activation_mib": [1]}]})");
  EXPECT_THAT(LoadCostModel((dir_ / "old.json").string()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("old.json: cost model of format_version 1, expected 2"),
                             HasSubstr("re-profile with varipipe-profile"))));
  // What the planner writes, it reads.
  CostModel model;
  ASSERT_THAT(SaveCostModelJson(model, (dir_ / "new.json").string()), IsOk());
  std::ifstream in(dir_ / "new.json");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("\"format_version\": 2"));
  EXPECT_THAT(LoadCostModel((dir_ / "new.json").string()), IsOk());
}

// A profile records the architecture, key/value heads and head tying; a
// MEGATRON profile (every file written before LLAMA existed, and DynaPipe's)
// is refused for a LLAMA job of the same widths, and the other way round.
TEST_F(CostModelIoTest, ArchitectureAndKeyValueHeadsAreChecked) {
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims megatron{.kind = ModelKind::kGpt,
                           .encoder_layers = 4,
                           .hidden = 256,
                           .heads = 8,
                           .kv_channels = 32,
                           .ffn = 768,
                           .vocab = 1000,
                           .dtype_bytes = 2};
  ModelDims llama = megatron;
  llama.architecture = Architecture::kLlama;
  llama.kv_heads = 2;
  absl::StatusOr<CostModel> megatron_model =
      BuildAnalyticCostModel(megatron, *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  absl::StatusOr<CostModel> llama_model =
      BuildAnalyticCostModel(llama, *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  ASSERT_THAT(megatron_model, IsOk());
  ASSERT_THAT(llama_model, IsOk());
  // MEGATRON files keep their form (no architecture field); LLAMA files say
  // what they measured.
  EXPECT_EQ(CostModelToProto(*megatron_model).model().architecture(), v1::ARCHITECTURE_UNSPECIFIED);
  const v1::ModelConfig written = CostModelToProto(*llama_model).model();
  EXPECT_EQ(written.architecture(), v1::LLAMA);
  EXPECT_EQ(written.num_key_value_heads(), 2u);
  EXPECT_FALSE(written.tie_word_embeddings());

  const std::string megatron_path = (dir_ / "megatron.json").string();
  const std::string llama_path = (dir_ / "llama.json").string();
  ASSERT_THAT(SaveCostModelJson(*megatron_model, megatron_path), IsOk());
  ASSERT_THAT(SaveCostModelJson(*llama_model, llama_path), IsOk());
  absl::StatusOr<CostModel> megatron_loaded = LoadCostModel(megatron_path);
  absl::StatusOr<CostModel> llama_loaded = LoadCostModel(llama_path);
  ASSERT_THAT(megatron_loaded, IsOk());
  ASSERT_THAT(llama_loaded, IsOk());
  EXPECT_THAT(megatron_loaded->CheckMatches(megatron), IsOk());
  EXPECT_THAT(llama_loaded->CheckMatches(llama), IsOk());
  EXPECT_THAT(megatron_loaded->CheckMatches(llama),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the cost model was measured for a MEGATRON model but the job's "
                                 "model.architecture is LLAMA")));
  EXPECT_THAT(llama_loaded->CheckMatches(megatron),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("measured for a LLAMA model but the job's model.architecture is "
                                 "MEGATRON")));
  ModelDims other = llama;
  other.kv_heads = 4;
  EXPECT_THAT(llama_loaded->CheckMatches(other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("measured with key/value heads 2 but the job's model has 4")));
  other = llama;
  other.tied_embeddings = true;
  EXPECT_THAT(llama_loaded->CheckMatches(other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("measured with an untied LM head but the job's "
                                 "model.tie_word_embeddings is true")));

  // A hand-written LLAMA file takes the job config's defaults: LLAMA's
  // ffn width and multi-head attention.
  Write("sparse.json", R"({"format_version": 2, "model": {"kind": "GPT",
      "architecture": "LLAMA", "num_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "vocab_size": 32000}})");
  absl::StatusOr<CostModel> sparse = LoadCostModel((dir_ / "sparse.json").string());
  ASSERT_THAT(sparse, IsOk());
  ASSERT_TRUE(sparse->profiled_dims().has_value());
  EXPECT_TRUE(sparse->profiled_dims()->llama());
  EXPECT_EQ(sparse->profiled_dims()->ffn, 11008u);
  EXPECT_EQ(sparse->profiled_dims()->kv_channels, 128u);
  EXPECT_EQ(sparse->profiled_dims()->key_value_heads(), 32u);

  // The Llama-3-8B preset given the MEGATRON profile: refused naming the
  // file and both architectures.
  absl::StatusOr<v1::JobConfig> job =
      LoadJobConfigFile(absl::StrCat(VARIPIPE_SOURCE_DIR, "/deploy/configs/llama-3-8b.json"));
  ASSERT_THAT(job, IsOk());
  job->mutable_planner()->set_cost_model_path(megatron_path);
  EXPECT_THAT(CostModelForJob(*job),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(megatron_path), HasSubstr("MEGATRON model"),
                             HasSubstr("model.architecture is LLAMA"))));
  // ... and planned with the analytic model without one.
  job->mutable_planner()->clear_cost_model_path();
  absl::StatusOr<CostModel> analytic = CostModelForJob(*job);
  ASSERT_THAT(analytic, IsOk());
  EXPECT_THAT(analytic->description(), HasSubstr("LLAMA"));
}

// A T5V11 profile says so (and its buckets); a MEGATRON T5 profile of the
// same widths is refused for a T5V11 job and the other way round.
TEST_F(CostModelIoTest, T5V11ArchitectureIsChecked) {
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims megatron{.kind = ModelKind::kT5,
                           .encoder_layers = 2,
                           .decoder_layers = 2,
                           .hidden = 256,
                           .heads = 8,
                           .kv_channels = 32,
                           .ffn = 640,
                           .vocab = 1000,
                           .dtype_bytes = 2};
  ModelDims t5v11 = megatron;
  t5v11.architecture = Architecture::kT5V11;
  t5v11.relative_attention_buckets = 16;
  absl::StatusOr<CostModel> megatron_model =
      BuildAnalyticCostModel(megatron, *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  absl::StatusOr<CostModel> t5v11_model =
      BuildAnalyticCostModel(t5v11, *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  ASSERT_THAT(megatron_model, IsOk());
  ASSERT_THAT(t5v11_model, IsOk());
  const v1::ModelConfig written = CostModelToProto(*t5v11_model).model();
  EXPECT_EQ(written.architecture(), v1::T5V11);
  EXPECT_EQ(written.kind(), v1::T5);
  EXPECT_EQ(written.relative_attention_num_buckets(), 16u);
  EXPECT_EQ(written.num_key_value_heads(), 0u);  // LLAMA's fields stay unset
  EXPECT_FALSE(written.tie_word_embeddings());

  const std::string megatron_path = (dir_ / "megatron-t5.json").string();
  const std::string t5v11_path = (dir_ / "t5v11.json").string();
  ASSERT_THAT(SaveCostModelJson(*megatron_model, megatron_path), IsOk());
  ASSERT_THAT(SaveCostModelJson(*t5v11_model, t5v11_path), IsOk());
  absl::StatusOr<CostModel> megatron_loaded = LoadCostModel(megatron_path);
  absl::StatusOr<CostModel> t5v11_loaded = LoadCostModel(t5v11_path);
  ASSERT_THAT(megatron_loaded, IsOk());
  ASSERT_THAT(t5v11_loaded, IsOk());
  ASSERT_TRUE(t5v11_loaded->profiled_dims().has_value());
  EXPECT_TRUE(t5v11_loaded->profiled_dims()->t5v11());
  EXPECT_EQ(t5v11_loaded->profiled_dims()->relative_attention_buckets, 16u);
  EXPECT_THAT(t5v11_loaded->CheckMatches(t5v11), IsOk());
  EXPECT_THAT(megatron_loaded->CheckMatches(t5v11),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the cost model was measured for a MEGATRON model but the job's "
                                 "model.architecture is T5V11")));
  EXPECT_THAT(t5v11_loaded->CheckMatches(megatron),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("measured for a T5V11 model but the job's model.architecture is "
                                 "MEGATRON")));
  for (Component c : {Component::kEncoderLayer, Component::kDecoderLayer, Component::kEmbedding,
                      Component::kPostprocess}) {
    EXPECT_EQ(t5v11_loaded->Parameters(c), t5v11_model->Parameters(c)) << ComponentName(c);
  }

  // The FLAN-T5-XL preset given the MEGATRON T5 profile: refused naming the
  // file and both architectures; planned with the analytic model without.
  absl::StatusOr<v1::JobConfig> job =
      LoadJobConfigFile(absl::StrCat(VARIPIPE_SOURCE_DIR, "/deploy/configs/flan-t5-xl.json"));
  ASSERT_THAT(job, IsOk());
  job->mutable_planner()->set_cost_model_path(megatron_path);
  EXPECT_THAT(CostModelForJob(*job),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(megatron_path), HasSubstr("MEGATRON model"),
                             HasSubstr("model.architecture is T5V11"))));
  job->mutable_planner()->clear_cost_model_path();
  absl::StatusOr<CostModel> analytic = CostModelForJob(*job);
  ASSERT_THAT(analytic, IsOk());
  EXPECT_THAT(analytic->description(), HasSubstr("T5V11 layers"));
}

// Transfer and optimizer costs measured by varipipe-profile survive a round
// trip in the file's units, and bad values are refused naming the field.
TEST_F(CostModelIoTest, CommunicationAndOptimizerCosts) {
  Write("measured.json", R"({"format_version": 2,
      "grids": [{"component": "ENCODER_LAYER", "recompute": "RECOMPUTE_NONE",
        "micro_batch_sizes": [1], "seq_lens": [16], "forward_ms": [1], "backward_ms": [2],
        "stored_activation_mib": [1], "peak_activation_mib": [1]},
       {"component": "POSTPROCESS", "recompute": "RECOMPUTE_NONE",
        "micro_batch_sizes": [1], "seq_lens": [16], "forward_ms": [1], "backward_ms": [2],
        "stored_activation_mib": [1], "peak_activation_mib": [1]}],
      "communication": {"transport": "gloo tcp", "p2p_latency_us": 50,
        "p2p_bandwidth_gbps": 2.5, "all_reduce_latency_us": 120,
        "all_reduce_bandwidth_gbps": 0.5, "all_reduce_ranks": 4,
        "all_gather_step_latency_us": 30, "all_gather_step_bandwidth_gbps": 4,
        "reduce_scatter_step_latency_us": 40, "reduce_scatter_step_bandwidth_gbps": 3,
        "collective_ranks": 4},
      "optimizer": {"optimizer": "ADAMW", "fixed_ms": 0.1, "ms_per_million_parameters": 1.5}})");
  absl::StatusOr<CostModel> model = LoadCostModel((dir_ / "measured.json").string());
  ASSERT_THAT(model, IsOk());
  ASSERT_TRUE(model->communication().has_value());
  EXPECT_DOUBLE_EQ(model->communication()->p2p.latency_ms, 0.05);
  EXPECT_DOUBLE_EQ(model->communication()->p2p.bytes_per_ms, 2.5e6);
  EXPECT_DOUBLE_EQ(model->communication()->all_reduce.TransferMs(1e6), 0.12 + 2);
  EXPECT_EQ(model->communication()->all_reduce_ranks, 4u);
  ASSERT_TRUE(model->communication()->all_gather_step.has_value());
  EXPECT_DOUBLE_EQ(model->communication()->all_gather_step->TransferMs(1e6), 0.03 + 0.25);
  ASSERT_TRUE(model->communication()->reduce_scatter_step.has_value());
  EXPECT_DOUBLE_EQ(model->communication()->reduce_scatter_step->TransferMs(3e6), 0.04 + 1);
  EXPECT_EQ(model->communication()->collective_ranks, 4u);
  ASSERT_TRUE(model->optimizer().has_value());
  EXPECT_DOUBLE_EQ(model->optimizer()->Ms(2e6), 0.1 + 3);
  const v1::CostModelFile file = CostModelToProto(*model);
  EXPECT_DOUBLE_EQ(file.communication().all_reduce_bandwidth_gbps(), 0.5);
  EXPECT_DOUBLE_EQ(file.communication().all_gather_step_latency_us(), 30);
  EXPECT_DOUBLE_EQ(file.communication().reduce_scatter_step_bandwidth_gbps(), 3);
  EXPECT_EQ(file.communication().collective_ranks(), 4u);
  EXPECT_DOUBLE_EQ(file.optimizer().ms_per_million_parameters(), 1.5);

  // A profile from before the collectives were measured prices none.
  Write("older.json", R"({"format_version": 2,
      "communication": {"p2p_bandwidth_gbps": 1, "all_reduce_bandwidth_gbps": 1}})");
  absl::StatusOr<CostModel> older = LoadCostModel((dir_ / "older.json").string());
  ASSERT_THAT(older, IsOk());
  EXPECT_FALSE(older->communication()->all_gather_step.has_value());
  EXPECT_FALSE(older->communication()->reduce_scatter_step.has_value());
  EXPECT_EQ(CostModelToProto(*older).communication().collective_ranks(), 0u);
  Write("no-ranks.json", R"({"format_version": 2,
      "communication": {"p2p_bandwidth_gbps": 1, "all_reduce_bandwidth_gbps": 1,
        "all_gather_step_bandwidth_gbps": 2}})");
  EXPECT_THAT(LoadCostModel((dir_ / "no-ranks.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no-ranks.json"), HasSubstr("collective_ranks"))));
  Write("nan.json", R"({"format_version": 2,
      "communication": {"p2p_bandwidth_gbps": 1, "all_reduce_bandwidth_gbps": 1,
        "reduce_scatter_step_latency_us": "NaN", "collective_ranks": 2}})");
  EXPECT_THAT(LoadCostModel((dir_ / "nan.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("communication.reduce_scatter_step_latency_us")));

  Write("negative.json", R"({"format_version": 2,
      "communication": {"p2p_latency_us": -1, "p2p_bandwidth_gbps": 1,
        "all_reduce_bandwidth_gbps": 1}})");
  EXPECT_THAT(LoadCostModel((dir_ / "negative.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative.json: communication.p2p_latency_us")));
  Write("zero.json", R"({"format_version": 2,
      "communication": {"p2p_bandwidth_gbps": 0, "all_reduce_bandwidth_gbps": 1}})");
  EXPECT_THAT(LoadCostModel((dir_ / "zero.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bandwidths must be positive")));
  Write("optimizer.json", R"({"format_version": 2, "optimizer": {"fixed_ms": "Infinity"}})");
  EXPECT_THAT(LoadCostModel((dir_ / "optimizer.json").string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer.fixed_ms")));
}

// A measured grid that dips (noise) is raised to its running maxima, the
// rule the DP needs, and the description names the first raised cell.
TEST_F(CostModelIoTest, NonMonotoneGridsAreRepairedAndReported) {
  Write("dip.json", R"({"format_version": 2,
      "grids": [{"component": "ENCODER_LAYER", "recompute": "RECOMPUTE_NONE",
        "micro_batch_sizes": [1, 2], "seq_lens": [64, 128],
        "forward_ms": [1, 2, 0.9, 4], "backward_ms": [2, 4, 4, 8],
        "stored_activation_mib": [1, 2, 2, 1.5], "peak_activation_mib": [1, 2, 2, 4]},
       {"component": "POSTPROCESS", "recompute": "RECOMPUTE_NONE",
        "micro_batch_sizes": [1], "seq_lens": [64, 128], "forward_ms": [1, 1],
        "backward_ms": [1, 1], "stored_activation_mib": [1, 1], "peak_activation_mib": [1, 1]}]})");
  absl::StatusOr<CostModel> model = LoadCostModel((dir_ / "dip.json").string());
  ASSERT_THAT(model, IsOk());
  const ProfileGrid* grid = model->Grid(Component::kEncoderLayer, Recompute::kNone, 1);
  ASSERT_NE(grid, nullptr);
  // forward at (b=2, s=64) was 0.9 < 1 at (b=1, s=64): raised to 1.
  EXPECT_DOUBLE_EQ(grid->values()[2].forward_ms, 1);
  // stored at (b=2, s=128) was 1.5 < 2: raised to 2 MiB.
  EXPECT_DOUBLE_EQ(grid->values()[3].stored_bytes, 2.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(grid->values()[3].forward_ms, 4) << "monotone values stay";
  EXPECT_THAT(model->description(),
              AllOf(HasSubstr("raised to keep the grids monotone"),
                    HasSubstr("grids[0].forward_ms (encoder layer)"),
                    HasSubstr("first at b=2 s=64: 0.9 below 1"),
                    HasSubstr("grids[0].stored_activation_mib")));
}

}  // namespace
}  // namespace varipipe::planner
