// Model stages: layer assignment, deterministic initialisation, and the
// mathematical core of the equivalence claim: running a mini-batch as
// micro-batches of different padded shapes through a chain of stages (with
// activations and gradients handed across stage boundaries as the executors
// hand them over the network) gives the same loss and the same gradients as
// one unpipelined pass over the whole mini-batch.
#include "executor/model/model_stage.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "executor/model/rotary.h"
#include "executor/runtime/counting_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/stage_chain.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

ModelSpec SmallGpt() {
  ModelSpec spec;
  spec.num_layers = 4;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = 50;
  spec.max_sequence_length = 40;
  spec.seed = 7;
  return spec;
}

// LLAMA (docs/models.md): grouped-query attention (2 key/value heads for 4)
// and Llama 3.1 rotary scaling with all three frequency bands (d = 8).
ModelSpec SmallLlama() {
  ModelSpec spec = SmallGpt();
  spec.llama = true;
  spec.num_key_value_heads = 2;
  spec.rope_factor = 8;
  spec.rope_original_max_positions = 64;
  return spec;
}

ModelSpec SmallT5() {
  ModelSpec spec = SmallGpt();
  spec.encoder_decoder = true;
  spec.num_layers = 2;
  spec.num_decoder_layers = 3;
  return spec;
}

// T5V11 (docs/models.md): 8 relative position buckets up to distance 12, so
// samples of up to 20 positions meet exact, log-spaced and clipped buckets.
ModelSpec SmallT5V11() {
  ModelSpec spec = SmallT5();
  spec.t5v11 = true;
  spec.norm_epsilon = 1e-6;
  spec.relative_buckets = 8;
  spec.relative_max_distance = 12;
  return spec;
}

TEST(PipelineStageRolesTest, GptPutsEmbeddingFirstAndHeadLast) {
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(SmallGpt(), 3);
  ASSERT_THAT(roles, IsOk());
  ASSERT_EQ(roles->size(), 3u);
  EXPECT_EQ((*roles)[0].DebugString(), "stage 0 embedding layers [0, 2)");
  EXPECT_EQ((*roles)[1].DebugString(), "stage 1 layers [2, 3)");
  EXPECT_EQ((*roles)[2].DebugString(), "stage 2 layers [3, 4) head");
}

TEST(PipelineStageRolesTest, T5PutsEncoderStagesFirst) {
  ModelSpec spec = SmallT5();
  spec.num_layers = 4;
  spec.num_decoder_layers = 4;
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(spec, 4);
  ASSERT_THAT(roles, IsOk());
  EXPECT_EQ((*roles)[0].DebugString(), "stage 0 embedding layers [0, 2)");
  EXPECT_EQ((*roles)[1].DebugString(), "stage 1 layers [2, 4) encoder-norm");
  EXPECT_EQ((*roles)[2].DebugString(), "stage 2 decoder-embedding decoder layers [0, 2)");
  EXPECT_EQ((*roles)[3].DebugString(), "stage 3 decoder layers [2, 4) head");
  absl::StatusOr<std::vector<StageRole>> single = PipelineStageRoles(spec, 1);
  ASSERT_THAT(single, IsOk());
  EXPECT_EQ((*single)[0].DebugString(),
            "stage 0 embedding layers [0, 4) encoder-norm decoder-embedding decoder layers "
            "[0, 4) head");
}

TEST(PipelineStageRolesTest, FollowsTheJobsLayout) {
  ModelSpec gpt = SmallGpt();
  gpt.layers = {.encoder = {3, 1}, .decoder = {0, 0}};
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(gpt, 2);
  ASSERT_THAT(roles, IsOk());
  EXPECT_EQ((*roles)[0].DebugString(), "stage 0 embedding layers [0, 3)");
  EXPECT_EQ((*roles)[1].DebugString(), "stage 1 layers [3, 4) head");
  EXPECT_THAT(PipelineStageRoles(gpt, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the stage layout 3+1 has 2 stages but the pipeline has 4")));
  // An encoder over three stages, the decoder over one.
  ModelSpec t5 = SmallT5();
  t5.num_layers = 4;
  t5.num_decoder_layers = 2;
  t5.layers = {.encoder = {2, 1, 1, 0}, .decoder = {0, 0, 0, 2}};
  roles = PipelineStageRoles(t5, 4);
  ASSERT_THAT(roles, IsOk());
  EXPECT_EQ((*roles)[0].DebugString(), "stage 0 embedding layers [0, 2)");
  EXPECT_EQ((*roles)[1].DebugString(), "stage 1 layers [2, 3)");
  EXPECT_EQ((*roles)[2].DebugString(), "stage 2 layers [3, 4) encoder-norm");
  EXPECT_EQ((*roles)[3].DebugString(), "stage 3 decoder-embedding decoder layers [0, 2) head");
  ModelSpec unset = SmallGpt();
  unset.layout_auto = true;
  EXPECT_THAT(PipelineStageRoles(unset, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("AUTO")));
}

TEST(PipelineStageRolesTest, RejectsStagesWithoutLayers) {
  EXPECT_THAT(PipelineStageRoles(SmallGpt(), 5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 layers cannot fill 5")));
  ModelSpec t5 = SmallT5();
  t5.num_layers = 1;
  t5.num_decoder_layers = 1;
  EXPECT_THAT(PipelineStageRoles(t5, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot fill")));
}

// Every parameter of every stage, keyed by its stage-independent name: a
// shared parameter's owner (ModelStage::IsReplica), whose replicas must hold
// the same values.
std::map<std::string, torch::Tensor> Parameters(
    const std::vector<std::shared_ptr<ModelStage>>& stages) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      if (stage->IsReplica(item.key())) continue;
      EXPECT_TRUE(out.emplace(item.key(), item.value()).second) << "duplicate " << item.key();
    }
  }
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      if (!stage->IsReplica(item.key())) continue;
      EXPECT_TRUE(out.count(item.key())) << "replica of an unowned " << item.key();
      if (out.count(item.key())) EXPECT_TRUE(torch::equal(item.value(), out.at(item.key())));
    }
  }
  return out;
}

// Every parameter's gradient, a shared parameter's summed over its copies
// (what PlanInterpreter's SumSharedGradients gives each copy).
std::map<std::string, torch::Tensor> Gradients(
    const std::vector<std::shared_ptr<ModelStage>>& stages) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      const torch::Tensor g = item.value().grad();
      EXPECT_TRUE(g.defined()) << item.key();
      if (!g.defined()) continue;
      const auto [at, inserted] = out.emplace(item.key(), g.clone());
      if (!inserted) at->second += g;
    }
  }
  return out;
}

std::vector<std::shared_ptr<ModelStage>> BuildStages(const ModelSpec& spec, int64_t num_stages) {
  std::vector<std::shared_ptr<ModelStage>> stages;
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(spec, num_stages);
  EXPECT_THAT(roles, IsOk());
  if (!roles.ok()) return stages;
  for (const StageRole& role : *roles) stages.push_back(std::make_shared<ModelStage>(spec, role));
  return stages;
}

TEST(ModelStageTest, InitialisationDoesNotDependOnPartitioning) {
  for (const ModelSpec& spec : {SmallGpt(), SmallT5(), SmallLlama(), SmallT5V11()}) {
    const auto whole = Parameters(BuildStages(spec, 1));
    const auto split = Parameters(BuildStages(spec, 3));
    ASSERT_EQ(whole.size(), split.size());
    for (const auto& [name, tensor] : whole) {
      ASSERT_TRUE(split.count(name)) << name;
      EXPECT_TRUE(torch::equal(tensor, split.at(name))) << name;
    }
    // A different seed gives different weights.
    ModelSpec other = spec;
    other.seed = spec.seed + 1;
    const auto reseeded = Parameters(BuildStages(other, 1));
    const std::string weight =
        spec.llama || spec.t5v11 ? "encoder_layer_0.q_weight" : "encoder_layer_0.qkv_weight";
    EXPECT_FALSE(torch::equal(whole.at(weight), reseeded.at(weight)));
  }
}

// One training sample: token ids (GPT: the sequence; T5: input and target).
struct Sample {
  std::vector<int64_t> input;
  std::vector<int64_t> target;
};

std::vector<Sample> RandomSamples(const ModelSpec& spec, int count, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> token(1, spec.vocab_size - 1);
  std::uniform_int_distribution<int> length(2, static_cast<int>(spec.max_sequence_length / 2));
  std::vector<Sample> samples(count);
  for (Sample& sample : samples) {
    sample.input.resize(length(rng));
    for (int64_t& t : sample.input) t = token(rng);
    if (spec.encoder_decoder) {
      sample.target.resize(length(rng));
      for (int64_t& t : sample.target) t = token(rng);
    }
  }
  return samples;
}

// Pads `samples` into one micro-batch, `extra` positions beyond the longest.
StageBatch MakeBatch(const ModelSpec& spec, const std::vector<Sample>& samples, int64_t extra,
                     double loss_scale) {
  const int64_t b = static_cast<int64_t>(samples.size());
  int64_t s = 0;
  int64_t t = 0;
  for (const Sample& sample : samples) {
    s = std::max<int64_t>(s, sample.input.size());
    t = std::max<int64_t>(t, sample.target.size());
  }
  s += extra;
  if (spec.encoder_decoder) t += extra;
  StageBatch batch;
  batch.input_tokens = torch::zeros({b, s}, torch::kInt64);
  batch.input_lengths = torch::zeros({b}, torch::kInt64);
  batch.labels = torch::full({b, spec.encoder_decoder ? t : s}, -1, torch::kInt64);
  if (spec.encoder_decoder) {
    batch.decoder_tokens = torch::zeros({b, t}, torch::kInt64);
    batch.target_lengths = torch::zeros({b}, torch::kInt64);
  }
  for (int64_t i = 0; i < b; ++i) {
    const Sample& sample = samples[i];
    const int64_t n = static_cast<int64_t>(sample.input.size());
    batch.input_lengths[i] = n;
    for (int64_t j = 0; j < n; ++j) batch.input_tokens[i][j] = sample.input[j];
    if (!spec.encoder_decoder) {
      for (int64_t j = 0; j + 1 < n; ++j) batch.labels[i][j] = sample.input[j + 1];
      continue;
    }
    const int64_t m = static_cast<int64_t>(sample.target.size());
    batch.target_lengths[i] = m;
    for (int64_t j = 0; j < m; ++j) {
      batch.labels[i][j] = sample.target[j];
      if (j + 1 < m) batch.decoder_tokens[i][j + 1] = sample.target[j];  // shifted right
    }
  }
  batch.loss_scale = loss_scale;
  return batch;
}

double LossScale(const ModelSpec& spec, const std::vector<Sample>& samples) {
  double tokens = 0;
  for (const Sample& s : samples) {
    tokens += spec.encoder_decoder ? s.target.size() : s.input.size() - 1;
  }
  return 1.0 / tokens;
}

// Forward then backward of one micro-batch through `stages`, handing
// activations and gradients across each boundary as detached tensors (what
// a transfer does). Returns the micro-batch's loss.
double RunMicroBatch(const std::vector<std::shared_ptr<ModelStage>>& stages,
                     const StageBatch& batch) {
  std::vector<StageActivations> inputs(stages.size());
  std::vector<StageActivations> outputs(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    if (i > 0) {
      const StageActivations& prev = outputs[i - 1];
      inputs[i].hidden = prev.hidden.detach().requires_grad_(true);
      if (prev.memory.defined()) inputs[i].memory = prev.memory.detach().requires_grad_(true);
    }
    outputs[i] = stages[i]->Forward(inputs[i], batch);
  }
  const double loss = outputs.back().loss.item<double>();
  ::varipipe::testing::BackwardAcrossStages(inputs, outputs);
  return loss;
}

double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

enum class Architecture { kGpt, kT5, kLlama, kT5V11 };

ModelSpec SmallModel(Architecture a) {
  switch (a) {
    case Architecture::kT5:
      return SmallT5();
    case Architecture::kLlama:
      return SmallLlama();
    case Architecture::kT5V11:
      return SmallT5V11();
    default:
      return SmallGpt();
  }
}

class EquivalenceTest : public ::testing::TestWithParam<Architecture> {};

TEST_P(EquivalenceTest, MicroBatchedPipelineMatchesOnePass) {
  const ModelSpec spec = SmallModel(GetParam());
  std::mt19937 rng(::varipipe::testing::TestSeed("MicroBatchedPipelineMatchesOnePass"));
  const std::vector<Sample> samples = RandomSamples(spec, 7, rng);
  const double scale = LossScale(spec, samples);

  // Reference: the whole mini-batch in one pass through one stage.
  const auto whole = BuildStages(spec, 1);
  const double reference_loss = RunMicroBatch(whole, MakeBatch(spec, samples, 0, scale));

  // Pipelined: 3 stages, micro-batches of 3, 1 and 3 samples, each padded
  // differently (to its own longest plus 0, 5 and 2 positions).
  const auto stages = BuildStages(spec, 3);
  double loss = 0;
  const std::vector<std::pair<int, int>> micro_batches{{0, 3}, {3, 4}, {4, 7}};
  const std::vector<int64_t> extra{0, 5, 2};
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const std::vector<Sample> part(samples.begin() + micro_batches[m].first,
                                   samples.begin() + micro_batches[m].second);
    loss += RunMicroBatch(stages, MakeBatch(spec, part, extra[m], scale));
  }
  EXPECT_NEAR(loss, reference_loss, 1e-5 * reference_loss);
  // The loss is a mean over tokens of a near-uniform prediction.
  EXPECT_NEAR(reference_loss, std::log(static_cast<double>(spec.vocab_size)), 0.5);

  // Shared parameters' copies summed, as the interpreter sums them.
  const auto expected = Gradients(whole);
  const auto actual = Gradients(stages);
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, gradient] : expected) {
    ASSERT_TRUE(actual.count(name)) << name;
    EXPECT_LE(RelativeDifference(actual.at(name), gradient), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(GptT5LlamaAndT5V11, EquivalenceTest,
                         ::testing::Values(Architecture::kGpt, Architecture::kT5,
                                           Architecture::kLlama, Architecture::kT5V11),
                         [](const auto& info) {
                           return info.param == Architecture::kT5      ? "T5"
                                  : info.param == Architecture::kLlama ? "Llama"
                                  : info.param == Architecture::kT5V11 ? "T5V11"
                                                                       : "Gpt";
                         });

TEST(ModelStageTest, T5V11HasTheDocumentedParametersAndSharesThemAcrossStages) {
  ModelSpec spec = SmallT5V11();
  spec.num_layers = 4;
  spec.num_decoder_layers = 4;
  const int64_t h = spec.hidden_size;
  const std::vector<std::shared_ptr<ModelStage>> stages = BuildStages(spec, 4);
  ASSERT_EQ(stages.size(), 4u);
  std::map<std::string, std::vector<int64_t>> expected_layer = {
      {"attn_norm_weight", {h}}, {"q_weight", {32, h}},  {"k_weight", {32, h}},
      {"v_weight", {32, h}},     {"o_weight", {h, 32}},  {"mlp_norm_weight", {h}},
      {"gate_weight", {64, h}},  {"up_weight", {64, h}}, {"down_weight", {h, 64}}};
  std::map<std::string, std::vector<int64_t>> expected_decoder = expected_layer;
  expected_decoder.insert({{"cross_norm_weight", {h}},
                           {"xq_weight", {32, h}},
                           {"xk_weight", {32, h}},
                           {"xv_weight", {32, h}},
                           {"xo_weight", {h, 32}}});
  // Stage by stage: encoder stages 0 and 1, decoder stages 2 and 3.
  const std::vector<std::map<std::string, std::vector<int64_t>>> stage_extras = {
      {{"word_embedding", {50, h}}, {"encoder_relative_bias", {8, 4}}},
      {{"encoder_relative_bias", {8, 4}}, {"encoder_norm_weight", {h}}},
      {{"word_embedding", {50, h}}, {"decoder_relative_bias", {8, 4}}},
      {{"decoder_relative_bias", {8, 4}}, {"final_norm_weight", {h}}, {"head_weight", {50, h}}}};
  for (size_t s = 0; s < stages.size(); ++s) {
    std::map<std::string, std::vector<int64_t>> expected = stage_extras[s];
    const bool decoder = s >= 2;
    const int64_t first = decoder ? 2 * (s - 2) : 2 * s;
    for (int64_t i = first; i < first + 2; ++i) {
      for (const auto& [name, shape] : decoder ? expected_decoder : expected_layer) {
        expected[(decoder ? "decoder_layer_" : "encoder_layer_") + std::to_string(i) + "." + name] =
            shape;
      }
    }
    std::map<std::string, std::vector<int64_t>> actual;
    for (const auto& item : stages[s]->named_parameters()) {
      actual[item.key()] = item.value().sizes().vec();
    }
    EXPECT_EQ(actual, expected) << "stage " << s;
  }
  // The first holder owns a shared parameter; the others hold replicas.
  EXPECT_FALSE(stages[0]->IsReplica("word_embedding"));
  EXPECT_FALSE(stages[0]->IsReplica("encoder_relative_bias"));
  EXPECT_TRUE(stages[1]->IsReplica("encoder_relative_bias"));
  EXPECT_TRUE(stages[2]->IsReplica("word_embedding"));
  EXPECT_FALSE(stages[2]->IsReplica("decoder_relative_bias"));
  EXPECT_TRUE(stages[3]->IsReplica("decoder_relative_bias"));
  EXPECT_FALSE(stages[3]->IsReplica("head_weight"));
  // The gradient sums, in one order on every rank (replica 1: ranks 4-7).
  const std::vector<StageRole> roles = *PipelineStageRoles(spec, 4);
  const std::vector<SharedParameter> shared = SharedParameters(spec, roles);
  ASSERT_EQ(shared.size(), 3u);
  EXPECT_EQ(shared[0].name, "word_embedding");
  EXPECT_EQ(shared[0].stages, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(shared[1].name, "encoder_relative_bias");
  EXPECT_EQ(shared[1].stages, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(shared[2].name, "decoder_relative_bias");
  EXPECT_EQ(shared[2].stages, (std::vector<int64_t>{2, 3}));
  const std::vector<SharedParameterGroup> groups = SharedParameterGroups(spec, roles, 2, 4);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].name, "word_embedding");
  EXPECT_EQ(groups[0].ranks, (std::vector<int>{4, 6}));
  EXPECT_EQ(groups[1].name, "decoder_relative_bias");
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{6, 7}));
  // One stage holds one copy of everything: nothing to sum.
  EXPECT_TRUE(SharedParameters(spec, *PipelineStageRoles(spec, 1)).empty());
}

TEST(ModelStageTest, LlamaHasTheDocumentedParameters) {
  ModelSpec spec = SmallLlama();
  const auto parameters = Parameters(BuildStages(spec, 2));
  const int64_t h = spec.hidden_size;
  const std::map<std::string, std::vector<int64_t>> expected_layer = {
      {"attn_norm_weight", {h}},   {"q_weight", {32, h}},   {"k_weight", {16, h}},
      {"v_weight", {16, h}},       {"o_weight", {h, 32}},   {"mlp_norm_weight", {h}},
      {"gate_weight", {64, h}},    {"up_weight", {64, h}},  {"down_weight", {h, 64}}};
  size_t expected_count = 3;  // word_embedding, final_norm_weight, head_weight
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    for (const auto& [name, shape] : expected_layer) {
      const std::string full = "encoder_layer_" + std::to_string(i) + "." + name;
      ASSERT_TRUE(parameters.count(full)) << full;
      EXPECT_EQ(parameters.at(full).sizes().vec(), shape) << full;
      ++expected_count;
    }
  }
  EXPECT_EQ(parameters.at("word_embedding").sizes().vec(), (std::vector<int64_t>{50, h}));
  EXPECT_EQ(parameters.at("head_weight").sizes().vec(), (std::vector<int64_t>{50, h}));
  EXPECT_TRUE(parameters.count("final_norm_weight"));
  EXPECT_FALSE(parameters.count("position_embedding"));  // rotary positions
  EXPECT_EQ(parameters.size(), expected_count);

  // Tied: one stage, and the head is the embedding.
  spec.tie_word_embeddings = true;
  const auto stages = BuildStages(spec, 1);
  const auto tied = Parameters(stages);
  EXPECT_FALSE(tied.count("head_weight"));
  EXPECT_EQ(tied.size(), expected_count - 1);
}

TEST(RotaryTest, Llama31ScalingKeepsShortWavelengthsSlowsLongOnesBlendsBetween) {
  // d = 8, theta 10^4: inverse frequencies 1, 0.1, 0.01, 0.001, wavelengths
  // 2 pi / f = 6.3, 63, 628, 6283; with 64 original positions the bands are
  // below 64 / 4 = 16 (kept) and above 64 / 1 = 64 (divided by 8).
  const std::vector<double> inv = RotaryInverseFrequencies(SmallLlama());
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  const double wavelength = 2 * std::numbers::pi / 0.1;
  const double smooth = (64 / wavelength - 1) / (4 - 1);
  EXPECT_NEAR(inv[1], (1 - smooth) * 0.1 / 8 + smooth * 0.1, 1e-15);
  EXPECT_NEAR(inv[2], 0.01 / 8, 1e-15);
  EXPECT_NEAR(inv[3], 0.001 / 8, 1e-15);
  ModelSpec plain = SmallLlama();
  plain.rope_factor = 0;
  EXPECT_NEAR(RotaryInverseFrequencies(plain)[3], 0.001, 1e-15);
}

TEST(RotaryTest, ScoresDependOnlyOnRelativePositionAndNormsAreKept) {
  const ModelSpec spec = SmallLlama();
  torch::manual_seed(::varipipe::testing::TestSeed("ScoresDependOnlyOnRelativePosition"));
  const torch::Tensor q = torch::randn({1, 1, 8});
  const torch::Tensor k = torch::randn({1, 1, 8});
  const auto at = [&](const torch::Tensor& x, int64_t p) {
    return ApplyRotary(x, RotaryTable(spec, torch::full({1, 1}, p, torch::kInt64)), 1);
  };
  const double near = (at(q, 9) * at(k, 4)).sum().item<double>();
  const double shifted = (at(q, 39) * at(k, 34)).sum().item<double>();
  EXPECT_NEAR(near, shifted, 1e-4 * std::abs(near) + 1e-6);
  EXPECT_NEAR(at(q, 17).norm().item<double>(), q.norm().item<double>(), 1e-5);
  EXPECT_TRUE(torch::allclose(at(q, 0), q));  // position 0 is the identity
}

TEST(ModelStageTest, PaddingDoesNotChangeRealPositions) {
  const ModelSpec spec = SmallGpt();
  std::mt19937 rng(::varipipe::testing::TestSeed("PaddingDoesNotChangeRealPositions"));
  const std::vector<Sample> samples = RandomSamples(spec, 2, rng);
  const auto stages = BuildStages(spec, 1);
  torch::NoGradGuard no_grad;
  const StageBatch tight = MakeBatch(spec, samples, 0, 1.0);
  const StageBatch loose = MakeBatch(spec, samples, 9, 1.0);
  const StageActivations a = stages[0]->Forward({}, tight);
  const StageActivations b = stages[0]->Forward({}, loose);
  EXPECT_NEAR(a.loss.item<double>(), b.loss.item<double>(), 1e-5 * a.loss.item<double>());
  const int64_t n = static_cast<int64_t>(samples[0].input.size());
  EXPECT_TRUE(torch::allclose(a.hidden[0].slice(0, 0, n), b.hidden[0].slice(0, 0, n), 1e-5, 1e-6));
}

}  // namespace
}  // namespace varipipe::executor

namespace varipipe::executor {
namespace {

TEST(CountingAllocatorTest, CountsLiveStoragesAndThePeakPerAccount) {
  InstallCountingCpuAllocator();
  ASSERT_TRUE(CountingCpuAllocatorInstalled());
  MemoryAccount account;
  ScopedAccount scope(&account);
  const int64_t before = account.current_bytes();
  {
    torch::Tensor a = torch::empty({1000}, torch::kFloat32);  // 4000 bytes
    EXPECT_EQ(account.current_bytes() - before, 4000);
    torch::Tensor b = torch::empty({250}, torch::kFloat64);  // 2000 bytes
    EXPECT_EQ(account.current_bytes() - before, 6000);
  }
  EXPECT_EQ(account.current_bytes(), before);
  EXPECT_EQ(account.peak_bytes() - before, 6000);
  account.ResetPeak();
  EXPECT_EQ(account.peak_bytes(), account.current_bytes());
  // Another thread's allocations go to its own account (or the process's).
  MemoryAccount other;
  torch::Tensor kept;
  std::thread([&] {
    ScopedAccount other_scope(&other);
    kept = torch::empty({100}, torch::kFloat32);
  }).join();
  EXPECT_EQ(other.current_bytes(), 400);
  EXPECT_EQ(account.current_bytes(), before);
  kept = torch::Tensor();  // freed here, credited to the account that paid
  EXPECT_EQ(other.current_bytes(), 0);
}

// Selective recomputation (Korthikanti et al. section 4.2): the same loss and
// gradients as no recomputation, while the forward keeps less: at least one
// [b, heads, s, s] fp32 tensor per attention core fewer.
class SelectiveRecomputeTest : public ::testing::TestWithParam<bool> {};

TEST_P(SelectiveRecomputeTest, SameGradientsLessStoredMemory) {
  InstallCountingCpuAllocator();
  // Declared first: it must outlive every tensor charged to it.
  MemoryAccount account;
  const bool t5 = GetParam();
  const ModelSpec spec = t5 ? SmallT5() : SmallGpt();
  std::mt19937 rng(::varipipe::testing::TestSeed("SelectiveRecomputeSameGradients"));
  const std::vector<Sample> samples = RandomSamples(spec, 6, rng);
  const StageBatch batch = MakeBatch(spec, samples, 12, LossScale(spec, samples));
  const auto stages = BuildStages(spec, 1);
  ModelStage& stage = *stages[0];
  ScopedAccount scope(&account);

  struct Run {
    double loss = 0;
    int64_t stored_bytes = 0;  // what the forward keeps for the backward
    std::map<std::string, torch::Tensor> grads;
  };
  const auto run = [&](bool selective) {
    Run r;
    stage.SetSelectiveRecompute(selective);
    for (auto& p : stage.parameters()) p.mutable_grad() = torch::Tensor();
    const int64_t before = account.current_bytes();
    StageActivations out = stage.Forward({}, batch);
    r.stored_bytes = account.current_bytes() - before;
    r.loss = out.loss.item<double>();
    out.loss.backward();
    for (const auto& item : stage.named_parameters()) {
      r.grads[item.key()] = item.value().grad().clone();
    }
    return r;
  };
  const Run none = run(false);
  const Run selective = run(true);
  EXPECT_DOUBLE_EQ(selective.loss, none.loss);
  for (const auto& [name, grad] : none.grads) {
    EXPECT_LE(RelativeDifference(selective.grads.at(name), grad), 1e-6) << name;
  }
  const int64_t b = batch.input_tokens.size(0);
  const int64_t s = batch.input_tokens.size(1);
  const int64_t t = t5 ? batch.decoder_tokens.size(1) : 0;
  // One [b, heads, q, k] fp32 tensor per attention core: encoder/GPT self
  // attention s x s; T5 decoder self t x t and cross t x s.
  const int64_t cores = spec.num_layers * s * s + spec.num_decoder_layers * (t * t + t * s);
  const int64_t one_tensor_per_core = b * spec.num_attention_heads * cores * 4;
  std::printf(
      "stored by the forward: none %.1f KiB, selective %.1f KiB (saved %.1f KiB; "
      "one score tensor per attention core is %.1f KiB)\n",
      none.stored_bytes / 1024.0, selective.stored_bytes / 1024.0,
      (none.stored_bytes - selective.stored_bytes) / 1024.0, one_tensor_per_core / 1024.0);
  EXPECT_GE(none.stored_bytes - selective.stored_bytes, one_tensor_per_core);
}

INSTANTIATE_TEST_SUITE_P(GptAndT5, SelectiveRecomputeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "T5" : "Gpt"; });

}  // namespace
}  // namespace varipipe::executor
