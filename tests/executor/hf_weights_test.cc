// Hugging Face weights into LLAMA stages, against what `transformers`
// computed for the same tiny checkpoints (tests/data/hf, written on the GPU
// machine by deploy/gpu/hf_goldens.py): the loss and every parameter's
// gradient norm at pipeline 1 and 2, and each bad-checkpoint case with the
// message it gives.
#include "executor/model/hf_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/hf_checkpoint.h"
#include "common/checkpoint/hf_model_config.h"
#include "common/checkpoint/safetensors_file.h"
#include "executor/model/hf_export.h"
#include "nlohmann/json.hpp"
#include "tests/testing/command.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"

namespace varipipe::executor {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

fs::path Golden(const std::string& model) {
  return fs::path(VARIPIPE_SOURCE_DIR) / "tests" / "data" / "hf" / model;
}

// The tiny models' shape (tests/data/hf/README.md).
ModelSpec TinyLlama(bool tied) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = 96;
  spec.max_sequence_length = 64;
  spec.seed = 7;
  spec.llama = true;
  spec.num_key_value_heads = 2;
  spec.norm_epsilon = 1e-5;
  spec.rope_theta = 10000;
  spec.tie_word_embeddings = tied;
  return spec;
}

// A T5V11 model of both stacks (2 encoder and 3 decoder layers).
ModelSpec TinyT5V11() {
  ModelSpec spec = TinyLlama(false);
  spec.llama = false;
  spec.num_key_value_heads = 0;
  spec.encoder_decoder = true;
  spec.num_decoder_layers = 3;
  spec.t5v11 = true;
  spec.norm_epsilon = 1e-6;
  spec.relative_buckets = 8;
  spec.relative_max_distance = 20;
  return spec;
}

// A golden file's tensor as a CPU tensor.
torch::Tensor ReadGolden(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsTensor* t = file.Find(name);
  if (t == nullptr) {
    ADD_FAILURE() << file.path() << " has no " << name;
    return {};
  }
  const torch::Dtype dtype = t->dtype == "I64" ? torch::kInt64 : torch::kFloat32;
  torch::Tensor out = torch::empty(t->shape, torch::TensorOptions().dtype(dtype));
  EXPECT_THAT(file.Read(*t, out.data_ptr()), IsOk());
  return out;
}

struct Stages {
  std::vector<std::shared_ptr<ModelStage>> owned;
  std::vector<ModelStage*> pointers;
};

Stages BuildStages(const ModelSpec& spec, int pipeline) {
  Stages s;
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(spec, pipeline);
  EXPECT_THAT(roles, IsOk());
  for (const StageRole& role : *roles) {
    s.owned.push_back(std::make_shared<ModelStage>(spec, role));
    s.pointers.push_back(s.owned.back().get());
  }
  return s;
}

// The causal LM loss of `transformers` (labels = input ids, shifted inside
// the model) as the stages compute it: label t is token t + 1, the last
// position has none, and the mean is over the 2 x 11 predicted tokens.
torch::Tensor Loss(const Stages& stages, const torch::Tensor& input_ids) {
  StageBatch batch;
  batch.input_tokens = input_ids;
  batch.input_lengths = torch::full({input_ids.size(0)}, input_ids.size(1), torch::kInt64);
  batch.labels = torch::full_like(input_ids, -1);
  batch.labels.slice(1, 0, input_ids.size(1) - 1).copy_(input_ids.slice(1, 1));
  batch.loss_scale = 1.0 / static_cast<double>(input_ids.size(0) * (input_ids.size(1) - 1));
  StageActivations acts;
  for (ModelStage* stage : stages.pointers) acts = stage->Forward(acts, batch);
  return acts.loss;
}

struct GoldenCase {
  std::string model;
  bool tied;
  int pipeline;
};

class HuggingFaceGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(HuggingFaceGolden, LossAndGradientNormsMatchTransformers) {
  const GoldenCase& c = GetParam();
  const ModelSpec spec = TinyLlama(c.tied);
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(Golden(c.model));
  ASSERT_THAT(ckpt, IsOk());
  ASSERT_THAT(CheckHuggingFaceConfig(*ckpt, spec), IsOk());
  Stages stages = BuildStages(spec, c.pipeline);
  ASSERT_THAT(LoadHuggingFaceWeights(*ckpt, spec, stages.pointers), IsOk());

  absl::StatusOr<SafetensorsFile> golden =
      SafetensorsFile::Open((Golden(c.model) / "golden.safetensors").string());
  ASSERT_THAT(golden, IsOk());
  const torch::Tensor input_ids = ReadGolden(*golden, "input_ids");
  const double want_loss = ReadGolden(*golden, "loss").item<double>();
  torch::Tensor loss = Loss(stages, input_ids);
  const double got_loss = loss.item<double>();
  EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss) << "loss";
  loss.backward();

  double worst = 0;
  std::string worst_name;
  int compared = 0;
  for (ModelStage* stage : stages.pointers) {
    for (const auto& item : stage->named_parameters(/*recurse=*/true)) {
      absl::StatusOr<std::string> hf = HuggingFaceName(spec, item.key());
      ASSERT_THAT(hf, IsOk());
      const double want = ReadGolden(*golden, "grad_norm/" + *hf).item<double>();
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      const double got = item.value().grad().norm().item<double>();
      const double rel = std::abs(got - want) / std::max(want, 1e-12);
      if (rel > worst) {
        worst = rel;
        worst_name = *hf;
      }
      EXPECT_NEAR(got, want, 1e-5 * want) << *hf;
      ++compared;
    }
  }
  // Every parameter of the Hugging Face model, on some stage.
  absl::StatusOr<std::vector<std::string>> names = HuggingFaceNames(spec);
  ASSERT_THAT(names, IsOk());
  EXPECT_EQ(compared, static_cast<int>(names->size()));
  std::printf(
      "%s at pp=%d: loss %.7f (transformers %.7f), worst relative gradient-norm "
      "difference %.3g (%s) over %d parameters\n",
      c.model.c_str(), c.pipeline, got_loss, want_loss, worst, worst_name.c_str(), compared);
}

INSTANTIATE_TEST_SUITE_P(Tiny, HuggingFaceGolden,
                         ::testing::Values(GoldenCase{"llama-tiny", false, 1},
                                           GoldenCase{"llama-tiny", false, 2},
                                           GoldenCase{"llama-tiny-tied", true, 1}),
                         [](const auto& info) {
                           std::string name =
                               info.param.model + "_pp" + std::to_string(info.param.pipeline);
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// ---------------------------------------------------------------------------
// Bad checkpoints. A minimal writer of test checkpoints (header JSON, then
// the tensors' bytes in order).

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void WriteSafetensors(const fs::path& path, const std::vector<RawTensor>& tensors,
                      std::string header_override = "") {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
    data += t.bytes;
  }
  const std::string json = header_override.empty() ? header.dump() : header_override;
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << json << data;
}

// Every tensor of a checkpoint's file, as raw bytes.
std::vector<RawTensor> ReadAll(const fs::path& file_path) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(file_path.string());
  EXPECT_THAT(file, IsOk());
  std::vector<RawTensor> out;
  for (const SafetensorsTensor& t : file->tensors()) {
    RawTensor raw{t.name, t.dtype, t.shape, std::string(t.bytes(), '\0')};
    EXPECT_THAT(file->Read(t, raw.bytes.data()), IsOk());
    out.push_back(std::move(raw));
  }
  return out;
}

// A copy of the tiny Llama checkpoint whose tensors `edit` may change.
fs::path EditedCopy(const std::function<void(std::vector<RawTensor>&)>& edit) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-weights");
  fs::copy_file(Golden("llama-tiny") / "config.json", dir / "config.json");
  std::vector<RawTensor> tensors = ReadAll(Golden("llama-tiny") / "model.safetensors");
  edit(tensors);
  WriteSafetensors(dir / "model.safetensors", tensors);
  return dir;
}

absl::Status LoadInto(const fs::path& dir, const ModelSpec& spec, int pipeline = 1) {
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(dir.string());
  if (!ckpt.ok()) return ckpt.status();
  if (absl::Status s = CheckHuggingFaceConfig(*ckpt, spec); !s.ok()) return s;
  Stages stages = BuildStages(spec, pipeline);
  return LoadHuggingFaceWeights(*ckpt, spec, stages.pointers);
}

void EraseTensor(std::vector<RawTensor>& tensors, const std::string& name) {
  std::erase_if(tensors, [&](const RawTensor& t) { return t.name == name; });
}

TEST(HuggingFaceWeights, AMissingTensorIsNamed) {
  const fs::path dir =
      EditedCopy([](auto& t) { EraseTensor(t, "model.layers.1.mlp.up_proj.weight"); });
  EXPECT_THAT(LoadInto(dir, TinyLlama(false)),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no tensor 'model.layers.1.mlp.up_proj.weight'")));
}

TEST(HuggingFaceWeights, AnUnexpectedTensorIsNamed) {
  const fs::path dir = EditedCopy([](auto& t) {
    t.push_back({"model.layers.2.mlp.up_proj.weight", "F32", {1}, std::string(4, '\0')});
  });
  EXPECT_THAT(LoadInto(dir, TinyLlama(false)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unexpected tensor 'model.layers.2.mlp.up_proj.weight'")));
}

TEST(HuggingFaceWeights, AMisshapenTensorIsNamedWithBothShapes) {
  const fs::path dir = EditedCopy([](auto& tensors) {
    for (RawTensor& t : tensors) {
      if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {32, 16};
    }
  });
  EXPECT_THAT(
      LoadInto(dir, TinyLlama(false)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("tensor 'model.layers.0.self_attn.k_proj.weight' has shape "
                         "[32, 16] but stage 0's encoder_layer_0.k_weight needs [16, 32]")));
}

TEST(HuggingFaceWeights, AWronglyTypedTensorIsNamed) {
  const fs::path dir = EditedCopy([](auto& tensors) {
    for (RawTensor& t : tensors) {
      if (t.name == "model.norm.weight") t.dtype = "I32";
    }
  });
  EXPECT_THAT(LoadInto(dir, TinyLlama(false)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'model.norm.weight' has dtype I32; weights must be F32, "
                                 "F16 or BF16")));
}

TEST(HuggingFaceWeights, BFloat16WeightsLoadAsTheirFloat32Values) {
  // Every F32 weight rounded to BF16 (truncating the low 16 bits): the
  // loaded parameters hold exactly the BF16 values.
  const fs::path dir = EditedCopy([](auto& tensors) {
    for (RawTensor& t : tensors) {
      std::string half(t.bytes.size() / 2, '\0');
      for (size_t i = 0; i < t.bytes.size() / 4; ++i)
        std::memcpy(&half[2 * i], &t.bytes[4 * i + 2], 2);
      t.bytes = half;
      t.dtype = "BF16";
    }
  });
  const ModelSpec spec = TinyLlama(false);
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(dir.string());
  ASSERT_THAT(ckpt, IsOk());
  Stages stages = BuildStages(spec, 1);
  ASSERT_THAT(LoadHuggingFaceWeights(*ckpt, spec, stages.pointers), IsOk());
  Stages reference = BuildStages(spec, 1);
  absl::StatusOr<HuggingFaceCheckpoint> f32 = HuggingFaceCheckpoint::Open(Golden("llama-tiny"));
  ASSERT_THAT(f32, IsOk());
  ASSERT_THAT(LoadHuggingFaceWeights(*f32, spec, reference.pointers), IsOk());
  const auto want = reference.owned[0]->named_parameters();
  for (const auto& item : stages.owned[0]->named_parameters()) {
    const torch::Tensor rounded = want[item.key()].to(torch::kBFloat16).to(torch::kFloat32);
    // Truncation and round-to-nearest differ by at most one BF16 step.
    EXPECT_TRUE(torch::allclose(item.value(), rounded, 1e-2, 0)) << item.key();
    EXPECT_TRUE(torch::equal(item.value().to(torch::kBFloat16).to(torch::kFloat32), item.value()))
        << item.key() << " holds values BF16 cannot";
  }
}

TEST(HuggingFaceWeights, ATruncatedFileIsReported) {
  const fs::path dir = EditedCopy([](auto&) {});
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 100);
  EXPECT_THAT(LoadInto(dir, TinyLlama(false)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the file's")));
}

TEST(HuggingFaceWeights, AHeaderLongerThanTheFileIsReported) {
  const fs::path dir = EditedCopy([](auto&) {});
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const char length[8] = {0, 0, 0, 0, 1, 0, 0, 0};  // 2^32 bytes
    f.write(length, 8);
  }
  EXPECT_THAT(LoadInto(dir, TinyLlama(false)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("header length 4294967296 does not fit the file's")));
}

TEST(HuggingFaceWeights, AnIndexNamingAMissingShardIsReported) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-weights");
  fs::copy_file(Golden("llama-tiny") / "config.json", dir / "config.json");
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})";
  EXPECT_THAT(
      HuggingFaceCheckpoint::Open(dir.string()).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("shard 'model-00002-of-00002.safetensors' of "
                                                      "'model.norm.weight' is not in")));
}

TEST(HuggingFaceWeights, AConfigDifferenceNamesTheFieldAndBothValues) {
  ModelSpec spec = TinyLlama(false);
  spec.ffn_hidden_size = 128;
  spec.num_layers = 2;
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(Golden("llama-tiny"));
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_THAT(CheckHuggingFaceConfig(*ckpt, spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config.json: intermediate_size is 64 but the job's "
                                 "model.ffn_hidden_size is 128")));
  EXPECT_THAT(CheckHuggingFaceConfig(*ckpt, TinyLlama(true)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tie_word_embeddings is false but the job's "
                                 "model.tie_word_embeddings is true")));
}

// Sharded by layer, a pipeline's second stage (layer 1, final norm, head)
// opens only the shard holding them and reads exactly its tensors' bytes.
TEST(HuggingFaceWeights, EachStageReadsOnlyItsOwnTensors) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-weights");
  fs::copy_file(Golden("llama-tiny") / "config.json", dir / "config.json");
  std::vector<RawTensor> first, second;
  for (RawTensor& t : ReadAll(Golden("llama-tiny") / "model.safetensors")) {
    const bool late = t.name.starts_with("model.layers.1.") || t.name == "model.norm.weight" ||
                      t.name == "lm_head.weight";
    (late ? second : first).push_back(std::move(t));
  }
  nlohmann::json index = {{"metadata", nlohmann::json::object()},
                          {"weight_map", nlohmann::json::object()}};
  uint64_t second_bytes = 0;
  for (const RawTensor& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const RawTensor& t : second) {
    index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    second_bytes += t.bytes.size();
  }
  WriteSafetensors(dir / "model-00001-of-00002.safetensors", first);
  WriteSafetensors(dir / "model-00002-of-00002.safetensors", second);
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();

  const ModelSpec spec = TinyLlama(false);
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(dir.string());
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_TRUE(ckpt->sharded());
  Stages stages = BuildStages(spec, 2);
  ASSERT_THAT(LoadHuggingFaceWeights(*ckpt, spec, {stages.pointers[1]}), IsOk());
  EXPECT_EQ(ckpt->bytes_read(), second_bytes);
  EXPECT_THAT(ckpt->opened_files(), ::testing::ElementsAre("model-00002-of-00002.safetensors"));

  // The same weights as from the single file.
  Stages reference = BuildStages(spec, 2);
  absl::StatusOr<HuggingFaceCheckpoint> single = HuggingFaceCheckpoint::Open(Golden("llama-tiny"));
  ASSERT_THAT(single, IsOk());
  ASSERT_THAT(LoadHuggingFaceWeights(*single, spec, {reference.pointers[1]}), IsOk());
  const auto want = reference.owned[1]->named_parameters();
  for (const auto& item : stages.owned[1]->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
  }
}

// ---------------------------------------------------------------------------
// Checkpoints written by an independent writer (deploy/make-hf-llama.py:
// Python's struct and json, not Varipipe's writer), single-file and sharded,
// F32 and BF16, at pipeline depths 1, 2 and 4.

struct Pass {
  double loss = 0;
  std::map<std::string, torch::Tensor> gradients;   // by Hugging Face name
  std::map<std::string, torch::Tensor> parameters;  // by Hugging Face name
};

// Loads `dir` into `pipeline` stages, runs `loss` once and records the
// parameters and gradients by Hugging Face name: every copy of a shared
// parameter must hold the owner's values, and their gradients are summed
// (what the interpreter's gradient sum gives each copy).
Pass LoadAndRun(const fs::path& dir, const ModelSpec& spec, int pipeline,
                const std::function<torch::Tensor(const Stages&)>& loss) {
  Pass pass;
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(dir.string());
  EXPECT_THAT(ckpt, IsOk());
  if (!ckpt.ok()) return pass;
  EXPECT_THAT(CheckHuggingFaceConfig(*ckpt, spec), IsOk());
  Stages stages = BuildStages(spec, pipeline);
  EXPECT_THAT(LoadHuggingFaceWeights(*ckpt, spec, stages.pointers), IsOk());
  torch::Tensor value = loss(stages);
  value.backward();
  pass.loss = value.item<double>();
  for (ModelStage* stage : stages.pointers) {
    for (const auto& item : stage->named_parameters()) {
      const std::string hf = *HuggingFaceName(spec, item.key());
      const auto [at, inserted] = pass.gradients.emplace(hf, item.value().grad().clone());
      if (!inserted) at->second += item.value().grad();
      if (inserted) pass.parameters[hf] = item.value().detach().clone();
      EXPECT_TRUE(torch::equal(item.value(), pass.parameters[hf])) << hf << " replica";
    }
  }
  return pass;
}

// `p` against the F32 single file's pass: the same parameters (a BF16 file
// holds the F32 values rounded to nearest even) and, for F32, the loss
// within 1e-6 and every gradient within 1e-5 of its largest entry.
void ExpectLikeF32(const Pass& p, const Pass& f32, bool bf16) {
  ASSERT_EQ(p.parameters.size(), f32.parameters.size());
  for (const auto& [hf, value] : p.parameters) {
    const torch::Tensor want = bf16 ? f32.parameters.at(hf).to(torch::kBFloat16).to(torch::kFloat32)
                                    : f32.parameters.at(hf);
    EXPECT_TRUE(torch::equal(value, want)) << hf;
  }
  if (bf16) return;
  EXPECT_NEAR(p.loss, f32.loss, 1e-6 * f32.loss);
  for (const auto& [hf, grad] : p.gradients) {
    const double scale = f32.gradients.at(hf).abs().max().item<double>();
    EXPECT_LE((grad - f32.gradients.at(hf)).abs().max().item<double>(), 1e-5 * scale) << hf;
  }
}

TEST(IndependentCheckpoints, LoadAtEveryPipelineDepthWithTheSameGradients) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-independent");
  const std::string script =
      (fs::path(VARIPIPE_SOURCE_DIR) / "deploy" / "make-hf-llama.py").string();
  const std::string shape =
      " --layers 4 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 96 --seed 3";
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"f32", ""},
           {"f32-sharded", " --shards 3"},
           {"bf16-sharded", " --dtype BF16 --shards 2"}}) {
    const varipipe::testing::CommandResult made = varipipe::testing::RunCommand(
        absl::StrCat("python3 '", script, "' --out '", (dir / name).string(), "'", shape, flags));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  ModelSpec spec = TinyLlama(false);
  spec.num_layers = 4;
  const uint64_t seed = 5;
  std::printf("token ids drawn with torch::manual_seed(%lu)\n", seed);
  torch::manual_seed(seed);
  const torch::Tensor input_ids =
      torch::randint(0, 96, {3, 10}, torch::TensorOptions().dtype(torch::kInt64));
  const auto loss = [&input_ids](const Stages& stages) { return Loss(stages, input_ids); };
  const Pass f32 = LoadAndRun(dir / "f32", spec, 1, loss);
  ASSERT_EQ(f32.parameters.size(), 39u);
  for (const std::string name : {"f32-sharded", "bf16-sharded"}) {
    for (int pipeline : {1, 2, 4}) {
      SCOPED_TRACE(absl::StrCat(name, " at pp=", pipeline));
      ExpectLikeF32(LoadAndRun(dir / name, spec, pipeline, loss), f32, name == "bf16-sharded");
    }
  }
  // BF16 weights at pp = 4 against pp = 1.
  const Pass bf16_one = LoadAndRun(dir / "bf16-sharded", spec, 1, loss);
  const Pass bf16_four = LoadAndRun(dir / "bf16-sharded", spec, 4, loss);
  EXPECT_NEAR(bf16_four.loss, bf16_one.loss, 1e-6 * bf16_one.loss);
  for (const auto& [hf, grad] : bf16_four.gradients) {
    const double scale = bf16_one.gradients.at(hf).abs().max().item<double>();
    EXPECT_LE((grad - bf16_one.gradients.at(hf)).abs().max().item<double>(), 1e-5 * scale) << hf;
  }
}

// FLAN-T5 checkpoints from deploy/make-hf-t5.py (its own safetensors writer,
// the standard library only): one file, three shards with the stacks'
// embedding aliases, and BF16 shards, at pp = 1, 2 and 4 (the last with the
// shared embedding and both bias tables replicated): the same parameters,
// and the loss and gradients (every copy of a shared parameter summed) of
// pp = 1 within 1e-5.
TEST(IndependentCheckpoints, FlanT5LoadsAtEveryPipelineDepthWithTheSameGradients) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-independent-t5");
  const std::string script = (fs::path(VARIPIPE_SOURCE_DIR) / "deploy" / "make-hf-t5.py").string();
  const std::string shape =
      " --hidden 32 --heads 4 --ffn 64 --vocab 96 --buckets 8 "
      "--max-distance 20 --decoder-layers 3 --seed 3";
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"f32", ""},
           {"f32-sharded", " --shards 3 --embed-aliases"},
           {"bf16-sharded", " --dtype BF16 --shards 2"}}) {
    const varipipe::testing::CommandResult made = varipipe::testing::RunCommand(
        absl::StrCat("python3 '", script, "' --out '", (dir / name).string(), "'", shape, flags));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  const ModelSpec spec = TinyT5V11();
  const uint64_t seed = 5;
  std::printf("token ids drawn with torch::manual_seed(%lu)\n", seed);
  torch::manual_seed(seed);
  StageBatch batch;
  batch.input_tokens = torch::randint(2, 96, {3, 10}, torch::kInt64);
  batch.labels = torch::randint(2, 96, {3, 6}, torch::kInt64);
  batch.decoder_tokens = torch::zeros_like(batch.labels);
  batch.decoder_tokens.slice(1, 1).copy_(batch.labels.slice(1, 0, -1));
  batch.input_lengths = torch::full({3}, 10, torch::kInt64);
  batch.target_lengths = torch::full({3}, 6, torch::kInt64);
  batch.loss_scale = 1.0 / 18;
  const auto loss = [&batch](const Stages& stages) {
    StageActivations acts;
    for (ModelStage* stage : stages.pointers) acts = stage->Forward(acts, batch);
    return acts.loss;
  };
  const Pass f32 = LoadAndRun(dir / "f32", spec, 1, loss);
  ASSERT_EQ(f32.parameters.size(), 6u + 2 * 9 + 3 * 14);
  for (const std::string name : {"f32-sharded", "bf16-sharded"}) {
    for (int pipeline : {1, 2, 4}) {
      SCOPED_TRACE(absl::StrCat(name, " at pp=", pipeline));
      ExpectLikeF32(LoadAndRun(dir / name, spec, pipeline, loss), f32, name == "bf16-sharded");
    }
  }
}

// ---------------------------------------------------------------------------
// Export.

std::string FileBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Exports the stages of a pipeline of `pipeline` stages, each stage on its
// own as a rank would, then the index.
fs::path ExportAt(const ModelSpec& spec, const Stages& stages, const std::string& name,
                  v1::DType dtype) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-export-" + name);
  for (ModelStage* stage : stages.pointers) {
    EXPECT_THAT(ExportHuggingFaceShards(dir.string(), spec, {stage}, dtype), IsOk());
  }
  EXPECT_THAT(ExportHuggingFaceIndex(dir.string(), spec, dtype), IsOk());
  return dir;
}

// Weights loaded at pp = 2, exported per stage, load back at pp = 1 bit for
// bit, and the files equal those of an export at pp = 1 byte for byte.
TEST(HuggingFaceExport, RoundTripsExactlyAndIndependentlyOfThePipeline) {
  const ModelSpec spec = TinyLlama(false);
  absl::StatusOr<HuggingFaceCheckpoint> golden = HuggingFaceCheckpoint::Open(Golden("llama-tiny"));
  ASSERT_THAT(golden, IsOk());
  Stages two = BuildStages(spec, 2);
  ASSERT_THAT(LoadHuggingFaceWeights(*golden, spec, two.pointers), IsOk());
  Stages one = BuildStages(spec, 1);
  ASSERT_THAT(LoadHuggingFaceWeights(*golden, spec, one.pointers), IsOk());
  const fs::path from_two = ExportAt(spec, two, "pp2", v1::FLOAT32);
  const fs::path from_one = ExportAt(spec, one, "pp1", v1::FLOAT32);

  int files = 0;
  for (const auto& entry : fs::directory_iterator(from_one)) {
    const fs::path other = from_two / entry.path().filename();
    ASSERT_TRUE(fs::exists(other)) << other;
    EXPECT_EQ(FileBytes(entry.path()), FileBytes(other)) << entry.path().filename();
    ++files;
  }
  EXPECT_EQ(files, 4);  // config.json, the index, one shard per layer

  absl::StatusOr<HuggingFaceCheckpoint> exported = HuggingFaceCheckpoint::Open(from_two.string());
  ASSERT_THAT(exported, IsOk());
  ASSERT_THAT(CheckHuggingFaceConfig(*exported, spec), IsOk());
  Stages back = BuildStages(spec, 1);
  ASSERT_THAT(LoadHuggingFaceWeights(*exported, spec, back.pointers), IsOk());
  const auto want = one.owned[0]->named_parameters();
  for (const auto& item : back.owned[0]->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
  }
  // VARIPIPE_KEEP_EXPORT=DIR keeps this export (tests/data/hf/varipipe-export
  // is one, which deploy/gpu/hf_goldens.py --check-export loads with
  // transformers).
  if (const char* keep = std::getenv("VARIPIPE_KEEP_EXPORT"); keep != nullptr && *keep != '\0') {
    fs::create_directories(keep);
    for (const auto& entry : fs::directory_iterator(from_two)) {
      fs::copy_file(entry.path(), fs::path(keep) / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
    }
  }
  // Every shard's tensors, and its name, as the index says.
  EXPECT_EQ(exported->TensorNames().size(), 21u);
  EXPECT_THAT(exported->Find("model.embed_tokens.weight"), IsOk());
  EXPECT_EQ(exported->Find("lm_head.weight")->file->path(),
            (from_two / "model-00002-of-00002.safetensors").string());
}

// BF16 exports round BF16-exact weights to themselves; a tied model has no
// lm_head.weight.
TEST(HuggingFaceExport, BFloat16AndTiedModels) {
  const ModelSpec spec = TinyLlama(true);
  absl::StatusOr<HuggingFaceCheckpoint> golden =
      HuggingFaceCheckpoint::Open(Golden("llama-tiny-tied"));
  ASSERT_THAT(golden, IsOk());
  Stages stages = BuildStages(spec, 1);
  ASSERT_THAT(LoadHuggingFaceWeights(*golden, spec, stages.pointers), IsOk());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : stages.owned[0]->parameters())
      p.copy_(p.to(torch::kBFloat16).to(torch::kFloat32));
  }
  const fs::path dir = ExportAt(spec, stages, "bf16", v1::BFLOAT16);
  absl::StatusOr<HuggingFaceCheckpoint> exported = HuggingFaceCheckpoint::Open(dir.string());
  ASSERT_THAT(exported, IsOk());
  EXPECT_THAT(exported->Find("lm_head.weight").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(exported->Find("model.norm.weight")->tensor->dtype, "BF16");
  Stages back = BuildStages(spec, 1);
  ASSERT_THAT(CheckHuggingFaceConfig(*exported, spec), IsOk());
  ASSERT_THAT(LoadHuggingFaceWeights(*exported, spec, back.pointers), IsOk());
  const auto want = stages.owned[0]->named_parameters();
  for (const auto& item : back.owned[0]->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
  }
}

// A tied head across stages: both the first stage and the last stage's
// replica load model.embed_tokens.weight, and only the first exports it, so
// the export at pp = 2 equals the one at pp = 1 byte for byte.
TEST(HuggingFaceExport, TiedEmbeddingReplicasLoadAndExportOnce) {
  const ModelSpec spec = TinyLlama(true);
  absl::StatusOr<HuggingFaceCheckpoint> golden =
      HuggingFaceCheckpoint::Open(Golden("llama-tiny-tied"));
  ASSERT_THAT(golden, IsOk());
  Stages one = BuildStages(spec, 1);
  ASSERT_THAT(LoadHuggingFaceWeights(*golden, spec, one.pointers), IsOk());
  Stages two = BuildStages(spec, 2);
  ASSERT_THAT(LoadHuggingFaceWeights(*golden, spec, two.pointers), IsOk());
  const auto embedding = [](const ModelStage& stage) {
    return stage.named_parameters()["word_embedding"];
  };
  EXPECT_TRUE(torch::equal(embedding(*two.owned[0]), embedding(*two.owned[1])));
  EXPECT_TRUE(two.owned[1]->IsReplica("word_embedding"));
  EXPECT_FALSE(two.owned[0]->IsReplica("word_embedding"));
  const fs::path from_one = ExportAt(spec, one, "tied-pp1", v1::FLOAT32);
  const fs::path from_two = ExportAt(spec, two, "tied-pp2", v1::FLOAT32);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(from_one)) {
    EXPECT_EQ(FileBytes(entry.path()), FileBytes(from_two / entry.path().filename()))
        << entry.path().filename();
    ++files;
  }
  EXPECT_EQ(files, 4);
  // The gradient-sum groups of a 4-layer model at pp = 4: first and last
  // rank of each pipeline replica.
  ModelSpec deep = spec;
  deep.num_layers = 4;
  absl::StatusOr<std::vector<StageRole>> four = PipelineStageRoles(deep, 4);
  ASSERT_THAT(four, IsOk());
  for (int64_t stage : {0, 3}) {
    const std::vector<SharedParameterGroup> groups = SharedParameterGroups(deep, *four, stage, 8);
    ASSERT_EQ(groups.size(), 1u);
    EXPECT_EQ(groups[0].name, "word_embedding");
    EXPECT_EQ(groups[0].ranks, (std::vector<int>{8, 11}));
  }
  EXPECT_TRUE(SharedParameterGroups(deep, *four, 1, 8).empty());
  EXPECT_TRUE(SharedParameters(deep, *PipelineStageRoles(deep, 1)).empty());  // one tensor
  deep.tie_word_embeddings = false;
  EXPECT_TRUE(SharedParameters(deep, *four).empty());
}

// Exports `stages` (one per rank, then the index) as an export of a job
// started from `init_from` does.
fs::path ExportFrom(const ModelSpec& spec, const Stages& stages, const std::string& name,
                    v1::DType dtype, const fs::path& init_from) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-export-" + name);
  for (ModelStage* stage : stages.pointers) {
    EXPECT_THAT(ExportHuggingFaceShards(dir.string(), spec, {stage}, dtype), IsOk());
  }
  EXPECT_THAT(ExportHuggingFaceIndex(dir.string(), spec, dtype, init_from.string()), IsOk());
  return dir;
}

nlohmann::ordered_json ReadConfig(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::ordered_json::parse(in);
}

// config.json of an export against the one it started from, field by field
// and in order: equal but for the weights' dtype, `dtype`.
void ExpectCarriedConfig(const fs::path& exported, const fs::path& source,
                         const std::string& dtype) {
  const nlohmann::ordered_json got = ReadConfig(exported / "config.json");
  nlohmann::ordered_json want = ReadConfig(source / "config.json");
  if (want.contains("dtype")) want["dtype"] = dtype;
  if (want.contains("torch_dtype") || !want.contains("dtype")) want["torch_dtype"] = dtype;
  std::vector<std::string> got_keys, want_keys;
  for (const auto& [key, value] : got.items()) got_keys.push_back(key);
  for (const auto& [key, value] : want.items()) {
    want_keys.push_back(key);
    ASSERT_TRUE(got.contains(key)) << key << " was dropped";
    EXPECT_EQ(got[key], value) << key;
  }
  EXPECT_EQ(got_keys, want_keys);
}

// A Llama-3.1-like checkpoint (llama3 rope scaling, a list of end tokens,
// 131072 positions, a tokenizer) fine-tuned by a job whose data limit is 16
// tokens: the export is a drop-in replacement, its config.json the
// checkpoint's but for the dtype, the tokenizer and generation files copied.
TEST(HuggingFaceExport, StartedFromACheckpointCarriesItsConfigAndTokenizer) {
  const fs::path base = varipipe::testing::PerTestDirectory("hf-export-llama3-base");
  {
    nlohmann::ordered_json config = ReadConfig(Golden("llama-tiny") / "config.json");
    config.erase("rope_parameters");
    config.erase("dtype");
    config["bos_token_id"] = 1;
    config["eos_token_id"] = {2, 3, 4};
    config["max_position_embeddings"] = 131072;
    config["rope_scaling"] = {{"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192},
                              {"rope_type", "llama3"}};
    config["rope_theta"] = 500000.0;
    config["torch_dtype"] = "float32";
    std::ofstream(base / "config.json") << config.dump(2);
    fs::copy_file(Golden("llama-tiny") / "model.safetensors", base / "model.safetensors");
    fs::copy_file(Golden("llama-tiny") / "generation_config.json", base / "generation_config.json");
    std::ofstream(base / "tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
    std::ofstream(base / "tokenizer_config.json") << R"({"model_max_length": 131072})";
    std::ofstream(base / "special_tokens_map.json") << R"({"bos_token": "<s>"})";
    std::ofstream(base / "tokenizer.model", std::ios::binary) << std::string("\x0a\x00\xff", 3);
  }
  ModelSpec spec = TinyLlama(false);
  spec.max_sequence_length = 16;  // the job's data limit, not the model's context
  spec.rope_theta = 500000;
  spec.rope_factor = 8;
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(base.string());
  ASSERT_THAT(ckpt, IsOk());
  ASSERT_THAT(CheckHuggingFaceConfig(*ckpt, spec), IsOk());
  Stages two = BuildStages(spec, 2);
  ASSERT_THAT(LoadHuggingFaceWeights(*ckpt, spec, two.pointers), IsOk());

  const fs::path out = ExportFrom(spec, two, "llama3", v1::BFLOAT16, base);
  ExpectCarriedConfig(out, base, "bfloat16");
  const nlohmann::ordered_json config = ReadConfig(out / "config.json");
  EXPECT_EQ(config["max_position_embeddings"], 131072);
  EXPECT_EQ(config["eos_token_id"], nlohmann::ordered_json::array({2, 3, 4}));
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "special_tokens_map.json", "tokenizer.model"}) {
    ASSERT_TRUE(fs::exists(out / name)) << name;
    EXPECT_EQ(FileBytes(out / name), FileBytes(base / name)) << name;
  }
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));  // the export's shards replace it
  absl::StatusOr<HuggingFaceCheckpoint> exported = HuggingFaceCheckpoint::Open(out.string());
  ASSERT_THAT(exported, IsOk());
  EXPECT_THAT(CheckHuggingFaceConfig(*exported, spec), IsOk());

  // A missing init_from fails naming the field and where it looked.
  EXPECT_THAT(
      ExportHuggingFaceIndex(out.string(), spec, v1::FLOAT32, (base / "gone").string()),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr("training.init_from: " + (base / "gone").string() + ": not a directory")));
}

// FLAN-T5's config.json (its tokens, positions and everything the job
// does not describe) comes through an export as it went in.
TEST(HuggingFaceExport, FlanT5ConfigRoundTrips) {
  ModelSpec spec = TinyT5V11();
  spec.num_decoder_layers = 2;
  spec.relative_buckets = 32;
  spec.relative_max_distance = 128;
  const Stages one = BuildStages(spec, 1);
  const fs::path out = ExportFrom(spec, one, "flan-t5", v1::FLOAT32, Golden("flan-t5-tiny"));
  ExpectCarriedConfig(out, Golden("flan-t5-tiny"), "float32");
  EXPECT_EQ(FileBytes(out / "generation_config.json"),
            FileBytes(Golden("flan-t5-tiny") / "generation_config.json"));
}

// Without training.init_from config.json holds the model's own values:
// max_position_embeddings is model.max_position_embeddings, unset the data
// limit; a job that sets it must agree with the checkpoint it loads.
TEST(HuggingFaceExport, ModelPositionsComeFromTheModelSection) {
  ModelSpec spec = TinyLlama(false);
  const Stages one = BuildStages(spec, 1);
  EXPECT_EQ(ReadConfig(ExportAt(spec, one, "positions-unset", v1::FLOAT32) /
                       "config.json")["max_position_embeddings"],
            64);
  spec.max_position_embeddings = 4096;
  EXPECT_EQ(ReadConfig(ExportAt(spec, one, "positions-set", v1::FLOAT32) /
                       "config.json")["max_position_embeddings"],
            4096);
  absl::StatusOr<HuggingFaceCheckpoint> golden = HuggingFaceCheckpoint::Open(Golden("llama-tiny"));
  ASSERT_THAT(golden, IsOk());
  EXPECT_THAT(CheckHuggingFaceConfig(*golden, spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_position_embeddings is 64 but the job's "
                                 "model.max_position_embeddings is 4096")));
  spec.max_position_embeddings = 64;
  EXPECT_THAT(CheckHuggingFaceConfig(*golden, spec), IsOk());
}

// FLAN-T5 out and in: weights exported at pp = 1 (moved off the
// initializer's, so a load that did nothing would show) load at pp = 4,
// where the encoder and the decoder take two stages each and the shared
// embedding and both bias tables have replicas; every copy gets the owner's
// values, and the pp = 4 export equals the pp = 1 export byte for byte.
TEST(HuggingFaceT5, ExportsLoadBackAtAnyPipelineDepth) {
  const ModelSpec spec = TinyT5V11();
  Stages one = BuildStages(spec, 1);
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(3);
    for (const auto& item : one.owned[0]->named_parameters()) {
      item.value().add_(0.1 * torch::randn_like(item.value()));
    }
  }
  const fs::path from_one = ExportAt(spec, one, "t5-pp1", v1::FLOAT32);
  absl::StatusOr<HuggingFaceCheckpoint> exported = HuggingFaceCheckpoint::Open(from_one.string());
  ASSERT_THAT(exported, IsOk());
  ASSERT_THAT(CheckHuggingFaceConfig(*exported, spec), IsOk());
  // 6 outside the layers, 9 per encoder and 14 per decoder layer.
  EXPECT_EQ(exported->TensorNames().size(), 6u + 2 * 9 + 3 * 14);
  EXPECT_EQ(exported->Find("lm_head.weight")->file->path(),
            (from_one / "model-00005-of-00005.safetensors").string());
  EXPECT_EQ(exported->Find("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
                ->file->path(),
            (from_one / "model-00003-of-00005.safetensors").string());

  Stages four = BuildStages(spec, 4);
  ASSERT_THAT(LoadHuggingFaceWeights(*exported, spec, four.pointers), IsOk());
  const auto want = one.owned[0]->named_parameters();
  int replicas = 0;
  for (const auto& stage : four.owned) {
    for (const auto& item : stage->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
      replicas += stage->IsReplica(item.key()) ? 1 : 0;
    }
  }
  EXPECT_EQ(replicas, 3);  // the embedding and both tables
  const fs::path from_four = ExportAt(spec, four, "t5-pp4", v1::FLOAT32);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(from_one)) {
    EXPECT_EQ(FileBytes(entry.path()), FileBytes(from_four / entry.path().filename()))
        << entry.path().filename();
    ++files;
  }
  EXPECT_EQ(files, 7);  // config.json, the index, one shard per layer

  // The config.json written maps back to the job's model.
  absl::StatusOr<v1::ModelConfig> model = ModelConfigFromHuggingFace(from_one.string());
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ(model->kind(), v1::T5);
  EXPECT_EQ(model->architecture(), v1::T5V11);
  EXPECT_EQ(model->num_decoder_layers(), 3u);
  EXPECT_EQ(model->relative_attention_num_buckets(), 8u);
  EXPECT_EQ(model->relative_attention_max_distance(), 20u);
  EXPECT_DOUBLE_EQ(model->norm_epsilon(), 1e-6);
  ModelSpec other = spec;
  other.num_decoder_layers = 4;
  EXPECT_THAT(CheckHuggingFaceConfig(*exported, other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config.json: num_decoder_layers is 3 but the job's "
                                 "model.num_decoder_layers is 4")));
  other = spec;
  other.relative_buckets = 32;
  EXPECT_THAT(CheckHuggingFaceConfig(*exported, other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("relative_attention_num_buckets is 8 but the job's "
                                 "model.relative_attention_num_buckets is 32")));
  EXPECT_THAT(CheckHuggingFaceConfig(*exported, TinyLlama(false)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model_type is t5 but the job's model.architecture is LLAMA")));
}

// tests/data/hf/flan-t5-tiny against transformers' own loss and gradient
// norms. transformers 5.17 saved that model with its head tied to the
// embedding and not rescaled (tie_word_embeddings true, scale_decoder_outputs
// false, no lm_head.weight), which computes what an untied head holding the
// embedding's values computes: the test gives such a checkpoint that
// lm_head.weight and an untied config, and compares the tied parameter's
// gradient with the sum of word_embedding's and head_weight's. (An untied
// golden, as FLAN-T5 is, compares as it is.) VARIPIPE_KEEP_T5_EXPORT=DIR
// keeps the pp = 2 export of these weights (tests/data/hf/varipipe-t5-export
// is one, which deploy/gpu/hf_goldens.py --check-export loads with
// transformers).
class HuggingFaceT5Golden : public ::testing::TestWithParam<int> {};

TEST_P(HuggingFaceT5Golden, LossAndGradientNormsMatchTransformers) {
  const int pipeline = GetParam();
  ModelSpec spec = TinyT5V11();
  spec.num_decoder_layers = 2;
  spec.relative_buckets = 32;
  spec.relative_max_distance = 128;
  const fs::path dir =
      varipipe::testing::PerTestDirectory("hf-flan-t5-" + std::to_string(pipeline));
  bool tied = false;  // the golden's head is its embedding
  {
    std::ifstream in(Golden("flan-t5-tiny") / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    std::vector<RawTensor> tensors = ReadAll(Golden("flan-t5-tiny") / "model.safetensors");
    if (config.value("tie_word_embeddings", true)) {
      ASSERT_FALSE(config.value("scale_decoder_outputs", true));
      config["tie_word_embeddings"] = false;
      for (const RawTensor& t : tensors) {
        if (t.name == "shared.weight") {
          RawTensor head = t;
          head.name = "lm_head.weight";
          tensors.push_back(head);
          break;
        }
      }
      tied = true;
    }
    std::ofstream(dir / "config.json") << config.dump(2);
    WriteSafetensors(dir / "model.safetensors", tensors);
  }
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(dir.string());
  ASSERT_THAT(ckpt, IsOk());
  ASSERT_THAT(CheckHuggingFaceConfig(*ckpt, spec), IsOk());
  Stages stages = BuildStages(spec, pipeline);
  ASSERT_THAT(LoadHuggingFaceWeights(*ckpt, spec, stages.pointers), IsOk());

  absl::StatusOr<SafetensorsFile> golden =
      SafetensorsFile::Open((Golden("flan-t5-tiny") / "golden.safetensors").string());
  ASSERT_THAT(golden, IsOk());
  StageBatch batch;
  batch.input_tokens = ReadGolden(*golden, "input_ids");
  batch.decoder_tokens = ReadGolden(*golden, "decoder_input_ids");
  batch.labels = ReadGolden(*golden, "labels");
  const int64_t rows = batch.input_tokens.size(0);
  batch.input_lengths = torch::full({rows}, batch.input_tokens.size(1), torch::kInt64);
  batch.target_lengths = torch::full({rows}, batch.labels.size(1), torch::kInt64);
  batch.loss_scale = 1.0 / static_cast<double>(batch.labels.numel());
  StageActivations acts;
  for (ModelStage* stage : stages.pointers) acts = stage->Forward(acts, batch);
  const double want_loss = ReadGolden(*golden, "loss").item<double>();
  const double got_loss = acts.loss.item<double>();
  EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss) << "loss";
  acts.loss.backward();

  // Gradients by Hugging Face name, every copy of a shared parameter summed
  // (what the interpreter's gradient sum gives each copy).
  std::map<std::string, torch::Tensor> grads;
  for (ModelStage* stage : stages.pointers) {
    for (const auto& item : stage->named_parameters(/*recurse=*/true)) {
      const std::string key = tied && item.key() == "head_weight" ? "word_embedding" : item.key();
      absl::StatusOr<std::string> hf = HuggingFaceName(spec, key);
      ASSERT_THAT(hf, IsOk());
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      auto [at, inserted] = grads.emplace(*hf, item.value().grad().clone());
      if (!inserted) at->second += item.value().grad();
    }
  }
  double worst = 0;
  std::string worst_name;
  for (const auto& [hf, grad] : grads) {
    const double want = ReadGolden(*golden, "grad_norm/" + hf).item<double>();
    const double got = grad.norm().item<double>();
    const double rel = std::abs(got - want) / std::max(want, 1e-12);
    if (rel > worst) {
      worst = rel;
      worst_name = hf;
    }
    EXPECT_NEAR(got, want, 1e-5 * want) << hf;
  }
  EXPECT_EQ(grads.size(), tied ? 51u : 52u);  // every parameter transformers has
  if (const char* keep = std::getenv("VARIPIPE_KEEP_T5_EXPORT");
      pipeline == 2 && keep != nullptr && *keep != '\0') {
    const fs::path exported = ExportAt(spec, stages, "flan-t5-pp2", v1::FLOAT32);
    fs::create_directories(keep);
    for (const auto& entry : fs::directory_iterator(exported)) {
      fs::copy_file(entry.path(), fs::path(keep) / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
    }
  }
  std::printf(
      "flan-t5-tiny at pp=%d: loss %.7f (transformers %.7f), worst relative gradient-norm "
      "difference %.3g (%s) over %zu parameters\n",
      pipeline, got_loss, want_loss, worst, worst_name.c_str(), grads.size());
}

INSTANTIATE_TEST_SUITE_P(Tiny, HuggingFaceT5Golden, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "pp" + std::to_string(info.param); });

// The original T5's relu MLP and tied, rescaled head (T5Config's defaults)
// are not T5V11, and say which field.
TEST(HuggingFaceT5, OriginalT5ConfigsAreRefusedNamingTheField) {
  const fs::path dir = varipipe::testing::PerTestDirectory("hf-t5-config");
  const auto config = [&](const std::string& extra) {
    std::ofstream(dir / "config.json")
        << R"({"model_type": "t5", "d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 64,
              "vocab_size": 96)"
        << extra << "}";
    return ModelConfigFromHuggingFace(dir.string());
  };
  EXPECT_THAT(config(R"(, "tie_word_embeddings": false)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("feed_forward_proj is missing (T5Config's default: relu)")));
  EXPECT_THAT(
      config(R"(, "feed_forward_proj": "relu", "tie_word_embeddings": false)"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("feed_forward_proj is \"relu\"")));
  EXPECT_THAT(config(R"(, "feed_forward_proj": "gated-gelu")"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tie_word_embeddings is missing (T5Config's default: true)")));
  absl::StatusOr<v1::ModelConfig> ok =
      config(R"(, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false)");
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->num_decoder_layers(), 2u);  // T5Config: num_layers
  EXPECT_EQ(ok->kv_channels(), 8u);         // d_model / num_heads
  EXPECT_EQ(ok->relative_attention_num_buckets(), 32u);
  EXPECT_EQ(ok->relative_attention_max_distance(), 128u);
}

TEST(HuggingFaceWeights, MegatronModelsAreRefused) {
  ModelSpec spec = TinyLlama(false);
  spec.llama = false;
  EXPECT_THAT(HuggingFaceName(spec, "word_embedding").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LLAMA")));
}

}  // namespace
}  // namespace varipipe::executor
