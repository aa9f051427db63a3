#include "planner/cost/analytic_model.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::Gpt67bDims;
using ::varipipe::testing::IsOk;

ModelDims T5Small() { return varipipe::testing::SmallT5Dims(); }

// With A = h and f = 4h the FLOPs are Megatron's 24 b s h^2 + 4 b s^2 h.
TEST(AnalyticModel, FlopsMatchMegatronsFormula) {
  const ModelDims d = Gpt67bDims();
  const double b = 4, s = 1024, h = 4096;
  EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, 1), 24 * b * s * h * h + 4 * b * s * s * h);
  EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, 2),
                   (24 * b * s * h * h + 4 * b * s * s * h) / 2);
}

// Korthikanti et al., section 4: s b h (34 + 5 a s / h) without
// recomputation, 34 s b h with selective, 2 s b h with full (16-bit).
TEST(AnalyticModel, ActivationMemoryMatchesKorthikanti) {
  const ModelDims d = Gpt67bDims();
  const double b = 2, s = 2048, h = 4096, a = 32;
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kNone, b, s, 1),
                   s * b * h * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kSelective, b, s, 1), 34 * s * b * h);
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kFull, b, s, 1), 2 * s * b * h);
  // Tensor parallel t: s b h (10 + 24 / t + 5 a s / (h t)).
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kNone, b, s, 4),
                   s * b * h * (10 + 24.0 / 4 + 5 * a * s / (h * 4)));
}

TEST(AnalyticModel, DecoderLayerAddsCrossAttention) {
  const ModelDims d = T5Small();
  EXPECT_GT(DecoderLayerForwardFlops(d, 4, 64, 512, 1), EncoderLayerForwardFlops(d, 4, 64, 1));
  EXPECT_GT(DecoderLayerForwardFlops(d, 4, 64, 1024, 1),
            DecoderLayerForwardFlops(d, 4, 64, 512, 1));
  EXPECT_GT(DecoderLayerStoredBytes(d, Recompute::kNone, 4, 64, 512, 1),
            EncoderLayerStoredBytes(d, Recompute::kNone, 4, 64, 1));
}

TEST(AnalyticModel, ParametersOfGpt67bAddUp) {
  const ModelDims d = Gpt67bDims();
  const double total = 32 * ComponentParameters(d, Component::kEncoderLayer, 1, 2048) +
                       ComponentParameters(d, Component::kEmbedding, 1, 2048);
  EXPECT_NEAR(total / 1e9, 6.65, 0.1);
}

TEST(AnalyticModel, RecomputationTradesTimeForMemory) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims d = Gpt67bDims();
  const CostValues none =
      AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kNone, 1, 4, 1024, 0);
  const CostValues selective =
      AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kSelective, 1, 4, 1024, 0);
  const CostValues full =
      AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kFull, 1, 4, 1024, 0);
  EXPECT_DOUBLE_EQ(none.forward_ms, full.forward_ms);
  EXPECT_LT(none.backward_ms, selective.backward_ms);
  EXPECT_LT(selective.backward_ms, full.backward_ms);
  EXPECT_GT(none.stored_bytes, selective.stored_bytes);
  EXPECT_GT(selective.stored_bytes, full.stored_bytes);
  EXPECT_GE(none.peak_bytes, none.stored_bytes);
  // Backward is about twice the forward without recomputation.
  EXPECT_NEAR(none.backward_ms / none.forward_ms, 2.0, 0.1);
}

TEST(AnalyticModel, PresetsAreOrderedBySpeed) {
  const ModelDims d = Gpt67bDims();
  double previous = 1e300;
  for (const char* name : {"a100-40gb", "a100-80gb", "h100-80gb", "h200"}) {
    absl::StatusOr<Hardware> hw = HardwarePreset(name);
    ASSERT_THAT(hw, IsOk()) << name;
    const double t =
        AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kNone, 1, 8, 2048, 0)
            .forward_ms;
    EXPECT_LE(t, previous) << name;
    previous = t;
  }
  EXPECT_FALSE(HardwarePreset("tpu").ok());
  EXPECT_TRUE(HardwarePreset("H100-80GB").ok());  // case-insensitive
}

// A layer's tensor collectives (two branches, forward and backward alike):
// a ring all-reduce each of fp32 values; under sequence parallelism a
// reduce-scatter of fp32 and an all-gather of the model's dtype, so a bf16
// model's pairs take half an fp32 all-reduce plus half a bf16 one, and an
// fp32 model's the same as the all-reduce. A decoder's encoder output
// enters the region whole: its backward all-reduces fp32 either way.
TEST(AnalyticModel, SequenceParallelGathersTheModelsDtype) {
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  const double b = 2, s = 1024;
  for (const uint32_t dtype_bytes : {2u, 4u}) {
    ModelDims d = Gpt67bDims();
    d.dtype_bytes = dtype_bytes;
    SCOPED_TRACE(dtype_bytes);
    const double values = b * s * d.hidden;
    for (const bool sp : {false, true}) {
      const TensorLink link{.gbps = 100, .sequence_parallel = sp};
      const TensorLink free{.gbps = 0, .sequence_parallel = sp};
      const auto layer = [&](const TensorLink& l) {
        return AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kNone, 2, b, s, 0,
                                     l);
      };
      const double gathered = sp && dtype_bytes == 2 ? 2.0 : 4.0;
      const double branch = 0.5 * TensorAllReduceMs(link, 2, 4 * values) +
                            0.5 * TensorAllReduceMs(link, 2, gathered * values);
      EXPECT_NEAR(layer(link).forward_ms - layer(free).forward_ms, 2 * branch, 1e-9) << sp;
      EXPECT_NEAR(layer(link).backward_ms - layer(free).backward_ms, 2 * branch, 1e-9) << sp;
      // A decoder layer: three branches, and the backward's all-reduce of
      // the encoder output (fp32, sequence parallel or not).
      ModelDims t5 = T5Small();
      t5.dtype_bytes = dtype_bytes;
      const double t5_values = b * s * t5.hidden;
      const double encoder_s = 512;
      const double t5_branch = 0.5 * TensorAllReduceMs(link, 2, 4 * t5_values) +
                               0.5 * TensorAllReduceMs(link, 2, gathered * t5_values);
      const auto decoder = [&](const TensorLink& l) {
        return AnalyticComponentCost(t5, *hw, Component::kDecoderLayer, Recompute::kNone, 2, b, s,
                                     encoder_s, l);
      };
      EXPECT_NEAR(decoder(link).forward_ms - decoder(free).forward_ms, 3 * t5_branch, 1e-9) << sp;
      EXPECT_NEAR(decoder(link).backward_ms - decoder(free).backward_ms,
                  3 * t5_branch + TensorAllReduceMs(link, 2, 4 * b * encoder_s * t5.hidden), 1e-9)
          << sp;
    }
  }
}

// A 4096-token forward pass of one GPT-6.7B layer on an A100 takes about
// 11 ms: 24 b s h^2 + 4 b s^2 h = 1.8 TFLOP at ~55% of 312 TFLOP/s.
TEST(AnalyticModel, MagnitudeIsPlausible) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  const CostValues v = AnalyticComponentCost(Gpt67bDims(), *hw, Component::kEncoderLayer,
                                             Recompute::kNone, 1, 2, 2048, 0);
  EXPECT_GT(v.forward_ms, 9.0);
  EXPECT_LT(v.forward_ms, 16.0);
}

TEST(AnalyticModel, GridReproducesTheFormulaAtGridPoints) {
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims d = T5Small();
  AnalyticGridOptions options{.max_micro_batch_size = 64, .max_seq_len = 512};
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(d, *hw, options);
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(model->CheckUsable(ModelKind::kT5, 1), IsOk());
  const ProfileGrid* dec = model->Grid(Component::kDecoderLayer, Recompute::kSelective, 1);
  ASSERT_NE(dec, nullptr);
  for (uint32_t b : {1u, 8u, 64u}) {
    for (uint32_t s : {8u, 128u, 512u}) {
      for (uint32_t e : {16u, 512u}) {
        CostValues v;
        ASSERT_TRUE(dec->Lookup(b, s, e, &v));
        EXPECT_EQ(v, AnalyticComponentCost(d, *hw, Component::kDecoderLayer, Recompute::kSelective,
                                           1, b, s, e));
      }
    }
  }
  CostValues v;
  EXPECT_FALSE(dec->Lookup(65, 8, 16, &v));  // beyond the grid
}

// ---------------------------------------------------------------------------
// LLAMA (docs/models.md, docs/cost-model.md "LLAMA")

// Llama-2-7B: 32 layers, h = 4,096, 32 heads of 128 (multi-head), SwiGLU
// 11,008 wide, vocabulary 32,000, untied head.
v1::ModelConfig Llama2_7bConfig() {
  v1::ModelConfig m;
  m.set_kind(v1::GPT);
  m.set_architecture(v1::LLAMA);
  m.set_num_layers(32);
  m.set_hidden_size(4096);
  m.set_num_attention_heads(32);
  m.set_num_key_value_heads(32);
  m.set_kv_channels(128);
  m.set_ffn_hidden_size(11008);
  m.set_vocab_size(32000);
  m.set_dtype(v1::BFLOAT16);
  return m;
}

// Llama-3-8B: as above with 8 key/value heads, SwiGLU 14,336 wide, vocabulary
// 128,256, rope_theta 500,000 (which changes no cost).
v1::ModelConfig Llama3_8bConfig() {
  v1::ModelConfig m = Llama2_7bConfig();
  m.set_num_key_value_heads(8);
  m.set_ffn_hidden_size(14336);
  m.set_vocab_size(128256);
  m.set_rope_theta(500000);
  return m;
}

// Embedding + layers + postprocess, as a pipeline's devices hold them all
// together. `positions` is what a MEGATRON job's longest sequence would be.
double TotalParameters(const ModelDims& d, uint32_t positions) {
  return ComponentParameters(d, Component::kEmbedding, 1, positions) +
         d.encoder_layers * ComponentParameters(d, Component::kEncoderLayer, 1, positions) +
         ComponentParameters(d, Component::kPostprocess, 1, positions);
}

TEST(AnalyticModelLlama, DimsFromConfig) {
  const ModelDims d = ModelDimsFromConfig(Llama3_8bConfig());
  EXPECT_TRUE(d.llama());
  EXPECT_EQ(d.key_value_heads(), 8u);
  EXPECT_EQ(d.attention_width(), 4096u);
  EXPECT_EQ(d.kv_width(), 1024u);
  EXPECT_TRUE(d.gated_mlp());
  EXPECT_FALSE(d.biases());
  EXPECT_FALSE(d.position_table());
  EXPECT_FALSE(d.tied_embeddings);
  const ModelDims g = Gpt67bDims();
  EXPECT_FALSE(g.llama());
  EXPECT_EQ(g.key_value_heads(), 32u);
  EXPECT_EQ(g.kv_width(), g.attention_width());
  EXPECT_TRUE(g.gated_mlp() == false && g.biases() && g.position_table());
}

// The published counts (Hugging Face's num_parameters()): no position rows,
// an untied head with the final RMSNorm on the last stage.
TEST(AnalyticModelLlama, ParametersOfLlama2_7bAndLlama3_8bAreExact) {
  const ModelDims llama2 = ModelDimsFromConfig(Llama2_7bConfig());
  EXPECT_EQ(TotalParameters(llama2, 4096), 6'738'415'616.0);
  // Per layer: q, k, v, o 4 h^2, gate, up, down 3 h f, two RMSNorms 2h.
  EXPECT_EQ(ComponentParameters(llama2, Component::kEncoderLayer, 1, 4096),
            4.0 * 4096 * 4096 + 3.0 * 4096 * 11008 + 2 * 4096);
  EXPECT_EQ(ComponentParameters(llama2, Component::kEmbedding, 1, 4096), 32000.0 * 4096);
  EXPECT_EQ(ComponentParameters(llama2, Component::kPostprocess, 1, 4096), 32000.0 * 4096 + 4096);

  const ModelDims llama3 = ModelDimsFromConfig(Llama3_8bConfig());
  EXPECT_EQ(TotalParameters(llama3, 8192), 8'030'261'248.0);
  // The position count changes nothing: rotary positions have no table.
  EXPECT_EQ(TotalParameters(llama3, 1), TotalParameters(llama3, 8192));

  // The analytic cost model records the same counts.
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(llama3, *hw, {.max_micro_batch_size = 16, .max_seq_len = 8192});
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(model->description(), HasSubstr("LLAMA"));
  EXPECT_EQ(model->Parameters(Component::kEmbedding) +
                32 * model->Parameters(Component::kEncoderLayer) +
                model->Parameters(Component::kPostprocess),
            8'030'261'248.0);
}

// The presets in deploy/configs/ load, validate and count the same; the
// model state of their pp = 4 devices adds up to the whole model.
TEST(AnalyticModelLlama, PresetsCountThePublishedParameters) {
  for (const auto& [name, expected] :
       {std::pair<std::string, double>{"llama-2-7b", 6'738'415'616.0},
        {"llama-3-8b", 8'030'261'248.0}}) {
    SCOPED_TRACE(name);
    absl::StatusOr<v1::JobConfig> config =
        LoadJobConfigFile(absl::StrCat(VARIPIPE_SOURCE_DIR, "/deploy/configs/", name, ".json"));
    ASSERT_THAT(config, IsOk());
    const ModelDims d = ModelDimsFromConfig(config->model());
    EXPECT_TRUE(d.llama());
    EXPECT_EQ(TotalParameters(d, config->data().max_sequence_length()), expected);
    absl::StatusOr<Hardware> hw = HardwarePreset(config->cluster().hardware());
    ASSERT_THAT(hw, IsOk());
    absl::StatusOr<CostModel> model = BuildAnalyticCostModel(
        d, *hw, {.max_micro_batch_size = 16, .max_seq_len = config->data().max_sequence_length()});
    ASSERT_THAT(model, IsOk());
    absl::StatusOr<StageLayout> layout = MakeStageLayout(d, config->parallelism().pipeline(),
                                                         config->parallelism().virtual_chunks());
    ASSERT_THAT(layout, IsOk());
    double sum = 0;
    for (double p : ParametersPerDevice(*model, *layout)) sum += p;
    EXPECT_EQ(sum, expected);
  }
}

// A tied head is the embedding's tensor (one stage, pipeline 1): counted
// once, with the embedding; the last stage adds only the final RMSNorm.
TEST(AnalyticModelLlama, TiedHeadIsCountedOnce) {
  v1::ModelConfig config = Llama3_8bConfig();
  config.set_tie_word_embeddings(true);
  const ModelDims tied = ModelDimsFromConfig(config);
  const ModelDims untied = ModelDimsFromConfig(Llama3_8bConfig());
  EXPECT_TRUE(tied.tied_embeddings);
  EXPECT_EQ(ComponentParameters(tied, Component::kPostprocess, 1, 0), 4096.0);
  EXPECT_EQ(TotalParameters(untied, 0) - TotalParameters(tied, 0), 128256.0 * 4096);
  // The head's GEMM runs either way.
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  EXPECT_EQ(
      AnalyticComponentCost(tied, *hw, Component::kPostprocess, Recompute::kNone, 1, 2, 512, 0),
      AnalyticComponentCost(untied, *hw, Component::kPostprocess, Recompute::kNone, 1, 2, 512, 0));
}

// Today's model is untouched by the new fields: GPT-6.7B's exact counts
// (LayerNorms and biases, 2,048 learned positions, the head as a copy).
TEST(AnalyticModelLlama, MegatronCountsAreUnchanged) {
  const ModelDims d = Gpt67bDims();
  EXPECT_EQ(ComponentParameters(d, Component::kEncoderLayer, 1, 2048), 201'379'840.0);
  EXPECT_EQ(ComponentParameters(d, Component::kEmbedding, 1, 2048), 214'958'080.0);
  EXPECT_EQ(ComponentParameters(d, Component::kPostprocess, 1, 2048), 206'577'664.0);
  EXPECT_EQ(TotalParameters(d, 2048), 6'865'690'624.0);
}

// One LLAMA layer's forward FLOPs: Q 2bshA, K and V 2 * 2bshK, output
// projection 2bsAh, gate, up and down 3 * 2bshf, core 4bs^2A; all / t.
// Equivalently 2 * tokens * (the layer's matrix parameters) + the core.
TEST(AnalyticModelLlama, LayerFlopsMatchTheHandFormula) {
  const ModelDims d = ModelDimsFromConfig(Llama3_8bConfig());
  const double b = 2, s = 4096, h = 4096, A = 4096, K = 1024, f = 14336;
  for (const uint32_t t : {1u, 2u, 8u}) {
    SCOPED_TRACE(t);
    const double expected = (2 * b * s * h * A + 2 * 2 * b * s * h * K + 2 * b * s * A * h +
                             3 * 2 * b * s * h * f + 4 * b * s * s * A) /
                            t;
    EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, t), expected);
  }
  const double matrix_parameters =
      ComponentParameters(d, Component::kEncoderLayer, 1, 0) - 2 * h;  // less the norms
  EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, 1),
                   2 * b * s * matrix_parameters + 4 * b * s * s * A);
}

// One LLAMA layer's stored bytes (B = 2): RMSNorm inputs and projection
// inputs 4B sbh, Q and the output projection input 2B sbA/t, K and V
// 2B sbK/t, the SwiGLU tensors (gate, silu, up, product) 4B sbf/t, the
// softmax output B a s^2 b/t (explicit, no selective recomputation); no
// dropout masks. Fused: the logsumexp 4 a s b/t instead. Full: the input.
TEST(AnalyticModelLlama, LayerStoredBytesMatchTheHandFormula) {
  v1::ModelConfig config = Llama3_8bConfig();
  const double b = 2, s = 2048, h = 4096, A = 4096, K = 1024, f = 14336, a = 32, B = 2;
  for (const double t : {1.0, 4.0}) {
    SCOPED_TRACE(t);
    const double linear = s * b * (4 * B * h + 2 * B * (A + K) / t + 4 * B * f / t);
    const double scores = B * a * s * s * b / t;
    const double lse = 4 * a * s * b / t;
    config.set_attention_kernel(v1::EXPLICIT);
    const ModelDims ex = ModelDimsFromConfig(config);
    const uint32_t tp = static_cast<uint32_t>(t);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(ex, Recompute::kNone, b, s, tp), linear + scores);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(ex, Recompute::kSelective, b, s, tp), linear);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(ex, Recompute::kFull, b, s, tp), B * s * b * h);
    config.set_attention_kernel(v1::FUSED);
    const ModelDims fu = ModelDimsFromConfig(config);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(fu, Recompute::kNone, b, s, tp), linear + lse);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(fu, Recompute::kSelective, b, s, tp), linear + lse);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(fu, Recompute::kFull, b, s, tp), B * s * b * h);
  }
  // The grid's stored value is the formula; peak adds the larger of the
  // score gradient and the gate and up gradients (2B sbf).
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  config.set_attention_kernel(v1::FUSED);
  const ModelDims fu = ModelDimsFromConfig(config);
  const CostValues v =
      AnalyticComponentCost(fu, *hw, Component::kEncoderLayer, Recompute::kNone, 1, b, s, 0);
  EXPECT_DOUBLE_EQ(v.stored_bytes, EncoderLayerStoredBytes(fu, Recompute::kNone, b, s, 1));
  EXPECT_DOUBLE_EQ(v.peak_bytes - v.stored_bytes, 2 * B * s * b * f);
  // The embedding keeps the token ids only (no dropout mask).
  EXPECT_DOUBLE_EQ(
      AnalyticComponentCost(fu, *hw, Component::kEmbedding, Recompute::kNone, 1, b, s, 0)
          .stored_bytes,
      8 * b * s);
}

// Grouped-query attention shrinks the K and V terms only: parameters
// 2h(A - K), FLOPs 4bsh(A - K)/t, stored bytes 2B sb(A - K)/t; the
// attention core (over the query heads) is unchanged.
TEST(AnalyticModelLlama, GroupedQueryAttentionReducesTheKeyValueTerms) {
  v1::ModelConfig config = Llama3_8bConfig();
  const ModelDims gqa = ModelDimsFromConfig(config);
  config.set_num_key_value_heads(32);
  const ModelDims mha = ModelDimsFromConfig(config);
  const double b = 4, s = 1024, h = 4096, A = 4096, K = 1024, B = 2;
  EXPECT_EQ(ComponentParameters(mha, Component::kEncoderLayer, 1, 0) -
                ComponentParameters(gqa, Component::kEncoderLayer, 1, 0),
            2 * h * (A - K));
  for (const uint32_t t : {1u, 2u}) {
    SCOPED_TRACE(t);
    EXPECT_DOUBLE_EQ(
        EncoderLayerForwardFlops(mha, b, s, t) - EncoderLayerForwardFlops(gqa, b, s, t),
        4 * b * s * h * (A - K) / t);
    for (const Recompute mode : {Recompute::kNone, Recompute::kSelective}) {
      EXPECT_DOUBLE_EQ(
          EncoderLayerStoredBytes(mha, mode, b, s, t) - EncoderLayerStoredBytes(gqa, mode, b, s, t),
          2 * B * s * b * (A - K) / t);
    }
    EXPECT_EQ(EncoderLayerStoredBytes(mha, Recompute::kFull, b, s, t),
              EncoderLayerStoredBytes(gqa, Recompute::kFull, b, s, t));
  }
}

// Against MEGATRON at the same widths: no biases, no position rows, the
// third MLP matrix; a Megatron layer with f = 4h costs what a LLAMA layer
// with two thirds of it does in FLOPs (the reason for LLAMA's default).
TEST(AnalyticModelLlama, DiffersFromMegatronWhereTheLayersDo) {
  ModelDims megatron = Gpt67bDims();
  ModelDims llama = megatron;
  llama.architecture = Architecture::kLlama;
  llama.ffn = 16384 * 2 / 3;  // 10,922 (not rounded: an exact two thirds)
  const double b = 1, s = 2048;
  EXPECT_NEAR(
      EncoderLayerForwardFlops(llama, b, s, 1) / EncoderLayerForwardFlops(megatron, b, s, 1), 1.0,
      1e-4);
  EXPECT_LT(ComponentParameters(llama, Component::kEmbedding, 1, 2048),
            ComponentParameters(megatron, Component::kEmbedding, 1, 2048));
  // Dropout masks gone: a LLAMA layer with MEGATRON's widths stores less
  // except for the SwiGLU tensors.
  llama.ffn = megatron.ffn;
  EXPECT_GT(EncoderLayerStoredBytes(llama, Recompute::kSelective, b, s, 1),
            EncoderLayerStoredBytes(megatron, Recompute::kSelective, b, s, 1));
  EXPECT_LT(EncoderLayerStoredBytes(llama, Recompute::kNone, b, s, 1) -
                EncoderLayerStoredBytes(llama, Recompute::kSelective, b, s, 1),
            EncoderLayerStoredBytes(megatron, Recompute::kNone, b, s, 1) -
                EncoderLayerStoredBytes(megatron, Recompute::kSelective, b, s, 1));
}

TEST(AnalyticModelLlama, GridReproducesTheFormulaAndRefusesBadDims) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims d = ModelDimsFromConfig(Llama3_8bConfig());
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(d, *hw, {.max_micro_batch_size = 8, .max_seq_len = 1024});
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(model->CheckUsable(ModelKind::kGpt, 1), IsOk());
  for (const Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const ProfileGrid* grid = model->Grid(Component::kEncoderLayer, mode, 1);
    ASSERT_NE(grid, nullptr);
    CostValues v;
    ASSERT_TRUE(grid->Lookup(4, 512, 0, &v));
    EXPECT_EQ(v, AnalyticComponentCost(d, *hw, Component::kEncoderLayer, mode, 1, 4, 512, 0));
  }
  ModelDims odd = d;
  odd.kv_heads = 5;
  EXPECT_FALSE(BuildAnalyticCostModel(odd, *hw, {}).ok());
  ModelDims t5 = d;
  t5.kind = ModelKind::kT5;
  t5.decoder_layers = 2;
  EXPECT_FALSE(BuildAnalyticCostModel(t5, *hw, {}).ok());
}

// ---------------------------------------------------------------------------
// T5V11 (docs/models.md "The T5V11 layers", docs/cost-model.md "T5V11")

// FLAN-T5-XL: d_model 2,048, 32 heads of 64, gated-GELU d_ff 5,120, 24
// encoder and 24 decoder layers, vocabulary 32,128, 32 buckets.
v1::ModelConfig FlanT5XlConfig() {
  v1::ModelConfig m;
  m.set_kind(v1::T5);
  m.set_architecture(v1::T5V11);
  m.set_num_layers(24);
  m.set_num_decoder_layers(24);
  m.set_hidden_size(2048);
  m.set_num_attention_heads(32);
  m.set_num_key_value_heads(32);
  m.set_kv_channels(64);
  m.set_ffn_hidden_size(5120);
  m.set_vocab_size(32128);
  m.set_relative_attention_num_buckets(32);
  m.set_relative_attention_max_distance(128);
  m.set_dtype(v1::BFLOAT16);
  return m;
}

// A small T5V11 model with widths off every shortcut: A = 6 * 80 != h,
// f != 4h.
ModelDims SmallT5V11(AttentionKernel kernel = AttentionKernel::kExplicit) {
  return {.kind = ModelKind::kT5,
          .encoder_layers = 3,
          .decoder_layers = 2,
          .hidden = 256,
          .heads = 6,
          .kv_channels = 80,
          .ffn = 700,
          .vocab = 1000,
          .dtype_bytes = 2,
          .attention_kernel = kernel,
          .architecture = Architecture::kT5V11,
          .relative_attention_buckets = 16};
}

absl::StatusOr<CostModel> AnalyticModelOf(const ModelDims& d, uint32_t max_seq_len = 2048) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  if (!hw.ok()) return hw.status();
  return BuildAnalyticCostModel(d, *hw, {.max_micro_batch_size = 16, .max_seq_len = max_seq_len});
}

TEST(AnalyticModelT5V11, DimsFromConfig) {
  v1::ModelConfig config = FlanT5XlConfig();
  const ModelDims d = ModelDimsFromConfig(config);
  EXPECT_TRUE(d.t5v11());
  EXPECT_FALSE(d.llama() || d.megatron());
  EXPECT_TRUE(d.encoder_decoder());
  EXPECT_EQ(d.decoder_layers, 24u);
  EXPECT_TRUE(d.gated_mlp());
  EXPECT_FALSE(d.biases());
  EXPECT_FALSE(d.position_table());
  EXPECT_FALSE(d.dropout());
  EXPECT_FALSE(d.tied_embeddings);
  EXPECT_EQ(d.key_value_heads(), 32u);
  EXPECT_EQ(d.relative_attention_buckets, 32u);
  EXPECT_EQ(d.relative_bias_parameters(), 32u * 32u);
  EXPECT_STREQ(ArchitectureName(d.architecture), "T5V11");
  // A file's model section without buckets takes the default.
  config.clear_relative_attention_num_buckets();
  EXPECT_EQ(ModelDimsFromConfig(config).relative_attention_buckets, 32u);
  // MEGATRON and LLAMA hold no bias tables.
  EXPECT_EQ(Gpt67bDims().relative_bias_parameters(), 0u);
  EXPECT_EQ(T5Small().relative_bias_parameters(), 0u);
}

// Per layer: encoder q, k, v, o 4hA, gate, up, down 3hf, two RMSNorms 2h;
// decoder also xq, xk, xv, xo 4hA and a third RMSNorm. Embedding V h (no
// position rows, whatever the longest sequence), head V h + final RMSNorm h.
TEST(AnalyticModelT5V11, ComponentParametersMatchTheLayers) {
  const ModelDims d = ModelDimsFromConfig(FlanT5XlConfig());
  const double h = 2048, A = 2048, f = 5120, V = 32128;
  EXPECT_EQ(ComponentParameters(d, Component::kEncoderLayer, 1, 2048),
            4 * h * A + 3 * h * f + 2 * h);
  EXPECT_EQ(ComponentParameters(d, Component::kEncoderLayer, 1, 2048), 48'238'592.0);
  EXPECT_EQ(ComponentParameters(d, Component::kDecoderLayer, 1, 2048),
            8 * h * A + 3 * h * f + 3 * h);
  EXPECT_EQ(ComponentParameters(d, Component::kDecoderLayer, 1, 2048), 65'017'856.0);
  EXPECT_EQ(ComponentParameters(d, Component::kEmbedding, 1, 2048), V * h);
  EXPECT_EQ(ComponentParameters(d, Component::kEmbedding, 1, 1), V * h);
  EXPECT_EQ(ComponentParameters(d, Component::kPostprocess, 1, 2048), V * h + h);
  // Tensor parallelism splits the matrices, not the norms.
  EXPECT_EQ(ComponentParameters(d, Component::kEncoderLayer, 2, 0),
            (4 * h * A + 3 * h * f) / 2 + 2 * h);
}

// Hugging Face's num_parameters() of google/flan-t5-xl: the shared
// embedding once, the untied lm_head, both relative bias tables (32 x 32),
// the encoder's and the decoder's final RMSNorms.
TEST(AnalyticModelT5V11, ParametersOfFlanT5XlAreExact) {
  const ModelDims d = ModelDimsFromConfig(FlanT5XlConfig());
  absl::StatusOr<CostModel> model = AnalyticModelOf(d);
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(model->description(), HasSubstr("T5V11 layers"));
  for (const uint32_t pp : {1u, 2u, 4u, 8u}) {
    SCOPED_TRACE(pp);
    absl::StatusOr<StageLayout> layout = MakeStageLayout(d, pp, 1);
    ASSERT_THAT(layout, IsOk());
    EXPECT_EQ(ModelParameters(*model, *layout), 2'849'757'184.0);
  }
  absl::StatusOr<StageLayout> one = MakeStageLayout(d, 1, 1);
  ASSERT_THAT(one, IsOk());
  EXPECT_TRUE(one->shared_word_embedding);
  EXPECT_EQ(one->encoder_device_parameters, 1024.0);
  EXPECT_EQ(one->decoder_device_parameters, 1024.0);
  EXPECT_EQ(one->last_encoder_device_parameters, 2048.0);
  // One device holds every parameter once: one embedding (MEGATRON T5
  // would count two), one table per stack.
  const std::vector<double> single = ParametersPerDevice(*model, *one);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0], 2'849'757'184.0);
  EXPECT_EQ(MaxParametersPerDevice(*model, *one), 2'849'757'184.0);
}

// pp = 4: two encoder and two decoder devices of 12 layers each. Device 0
// holds word_embedding and the encoder's table, device 1 the table's
// replica and the encoder's final RMSNorm, device 2 the embedding's replica
// and the decoder's table, device 3 the table's replica, the final RMSNorm
// and the head. The devices add up to the model plus the three replicas.
TEST(AnalyticModelT5V11, StageParametersCountTheReplicas) {
  const ModelDims d = ModelDimsFromConfig(FlanT5XlConfig());
  absl::StatusOr<CostModel> model = AnalyticModelOf(d);
  ASSERT_THAT(model, IsOk());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(d, 4, 1);
  ASSERT_THAT(layout, IsOk());
  ASSERT_EQ(layout->encoder_devices, 2u);
  const double enc = 48'238'592, dec = 65'017'856, emb = 32128.0 * 2048, table = 32 * 32, h = 2048;
  const std::vector<double> params = ParametersPerDevice(*model, *layout);
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0], 12 * enc + emb + table);
  EXPECT_EQ(params[1], 12 * enc + table + h);
  EXPECT_EQ(params[2], 12 * dec + emb + table);
  EXPECT_EQ(params[3], 12 * dec + table + emb + h);
  EXPECT_EQ(params[0], 644'662'272.0);
  EXPECT_EQ(params[1], 578'866'176.0);
  EXPECT_EQ(params[2], 846'013'440.0);
  EXPECT_EQ(params[3], 846'015'488.0);
  double sum = 0;
  for (double p : params) sum += p;
  EXPECT_EQ(sum, 2'849'757'184.0 + emb + 2 * table);
  EXPECT_EQ(MaxParametersPerDevice(*model, *layout), params[3]);
  // The room for activations is each device's own.
  absl::StatusOr<std::vector<double>> room =
      AvailableActivationBytesPerDevice(*model, *layout, ZeroStage::k0, 1, 80.0 * (1 << 30));
  ASSERT_THAT(room, IsOk());
  EXPECT_DOUBLE_EQ((*room)[1] - (*room)[0], 16 * (params[0] - params[1]));
}

// The preset loads, validates and counts the published size; its devices
// add up to it plus the replicas; varipipe-plan's path (CostModelForJob)
// builds an analytic T5V11 model for it.
TEST(AnalyticModelT5V11, PresetCountsThePublishedParameters) {
  absl::StatusOr<v1::JobConfig> config =
      LoadJobConfigFile(absl::StrCat(VARIPIPE_SOURCE_DIR, "/deploy/configs/flan-t5-xl.json"));
  ASSERT_THAT(config, IsOk());
  const ModelDims d = ModelDimsFromConfig(config->model());
  EXPECT_TRUE(d.t5v11());
  EXPECT_EQ(d.encoder_layers, 24u);
  EXPECT_EQ(d.decoder_layers, 24u);
  EXPECT_EQ(d.attention_width(), 2048u);
  absl::StatusOr<Hardware> hw = HardwarePreset(config->cluster().hardware());
  ASSERT_THAT(hw, IsOk());
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(
      d, *hw, {.max_micro_batch_size = 16, .max_seq_len = config->data().max_sequence_length()});
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(model->CheckUsable(ModelKind::kT5, 1), IsOk());
  absl::StatusOr<StageLayout> layout =
      MakeStageLayout(d, config->parallelism().pipeline(), config->parallelism().virtual_chunks());
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(ModelParameters(*model, *layout), 2'849'757'184.0);
  double sum = 0;
  for (double p : ParametersPerDevice(*model, *layout)) sum += p;
  EXPECT_EQ(sum, 2'849'757'184.0 + 32128.0 * 2048 + 2 * 32 * 32);
}

// MEGATRON T5 on one device keeps its two embeddings (each stack's own,
// with position rows) and no bias tables: unchanged.
TEST(AnalyticModelT5V11, MegatronT5CountsAreUnchanged) {
  const ModelDims d = T5Small();
  absl::StatusOr<CostModel> model = AnalyticModelOf(d, 512);
  ASSERT_THAT(model, IsOk());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(d, 1, 1);
  ASSERT_THAT(layout, IsOk());
  EXPECT_FALSE(layout->shared_word_embedding);
  EXPECT_EQ(layout->encoder_device_parameters + layout->decoder_device_parameters +
                layout->last_encoder_device_parameters,
            0.0);
  const double expected = 4 * model->Parameters(Component::kEncoderLayer) +
                          4 * model->Parameters(Component::kDecoderLayer) +
                          2 * model->Parameters(Component::kEmbedding) +
                          model->Parameters(Component::kPostprocess);
  EXPECT_EQ(ParametersPerDevice(*model, *layout)[0], expected);
  EXPECT_EQ(ModelParameters(*model, *layout), expected);
  EXPECT_EQ(layout->PositionBiasBytes(512, 1, Recompute::kFull), 0.0);
}

// Forward FLOPs: 2 * tokens * the layer's matrix parameters plus the
// attention cores. Encoder: q, k, v, o 8bshA, gate, up and down 6bshf, core
// 4bs^2A. Decoder: that over the target tokens, plus xq and xo 4bshA over
// the target tokens, xk and xv 4behA over the encoder tokens, core 4bseA.
// All / t. The MLP's third matrix is the only difference from MEGATRON.
TEST(AnalyticModelT5V11, LayerFlopsMatchTheHandFormula) {
  const ModelDims d = SmallT5V11();
  const double b = 3, s = 96, e = 160, h = 256, A = 480, f = 700;
  for (const uint32_t t : {1u, 2u}) {
    SCOPED_TRACE(t);
    const double encoder = (8 * b * s * h * A + 6 * b * s * h * f) / t + 4 * b * s * s * A / t;
    EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, t), encoder);
    EXPECT_DOUBLE_EQ(DecoderLayerForwardFlops(d, b, s, e, t),
                     encoder + (4 * b * s * h * A + 4 * b * e * h * A + 4 * b * s * e * A) / t);
  }
  const double layer_matrices = ComponentParameters(d, Component::kEncoderLayer, 1, 0) - 2 * h;
  EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, 1),
                   2 * b * s * layer_matrices + 4 * b * s * s * A);
  ModelDims megatron = d;
  megatron.architecture = Architecture::kMegatron;
  EXPECT_DOUBLE_EQ(
      EncoderLayerForwardFlops(d, b, s, 1) - EncoderLayerForwardFlops(megatron, b, s, 1),
      2 * b * s * h * f);
  EXPECT_DOUBLE_EQ(
      DecoderLayerForwardFlops(d, b, s, e, 1) - DecoderLayerForwardFlops(megatron, b, s, e, 1),
      2 * b * s * h * f);
}

// Stored bytes (B = 2) per layer. Encoder: RMSNorm inputs and projection
// inputs 4B sbh, Q, K, V and the output-projection input 4B sbA/t, the
// gated MLP's four f-wide tensors 4B sbf/t, the softmax output B a s^2 b/t
// (explicit, no selective recomputation; the position bias is the stage's,
// not the layer's); no dropout masks. Decoder: plus RMSNorm and xq inputs
// 2B sbh, the encoder output B ebh, Q and the xo input 2B sbA/t, K and V
// 2B ebA/t, the cross softmax output B a s e b/t. Fused: the logsumexp
// 4 a s b/t per attention block instead of the scores, and the masked bias
// B a s^2 b/t. Full: the inputs.
TEST(AnalyticModelT5V11, LayerStoredBytesMatchTheHandFormula) {
  const double b = 3, s = 96, e = 160, h = 256, A = 480, f = 700, a = 6, B = 2;
  for (const double t : {1.0, 2.0}) {
    SCOPED_TRACE(t);
    const uint32_t tp = static_cast<uint32_t>(t);
    const double encoder_linear = s * b * (4 * B * h + 4 * B * A / t + 4 * B * f / t);
    const double cross_linear =
        2 * B * s * b * h + B * e * b * h + 2 * B * s * b * A / t + 2 * B * e * b * A / t;
    const double self_scores = B * a * s * s * b / t;
    const double cross_scores = B * a * s * e * b / t;
    const double lse = 4 * a * s * b / t;
    const ModelDims ex = SmallT5V11(AttentionKernel::kExplicit);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(ex, Recompute::kNone, b, s, tp),
                     encoder_linear + self_scores);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(ex, Recompute::kSelective, b, s, tp), encoder_linear);
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(ex, Recompute::kFull, b, s, tp), B * s * b * h);
    EXPECT_DOUBLE_EQ(DecoderLayerStoredBytes(ex, Recompute::kNone, b, s, e, tp),
                     encoder_linear + self_scores + cross_linear + cross_scores);
    EXPECT_DOUBLE_EQ(DecoderLayerStoredBytes(ex, Recompute::kSelective, b, s, e, tp),
                     encoder_linear + cross_linear);
    EXPECT_DOUBLE_EQ(DecoderLayerStoredBytes(ex, Recompute::kFull, b, s, e, tp),
                     B * b * (s + e) * h);
    // Fused: the kernel also keeps its masked copy of the self-attention
    // position bias, [b, a, s, s] in the compute dtype.
    const ModelDims fu = SmallT5V11(AttentionKernel::kFused);
    const double masked_bias = B * a * s * s * b / t;
    for (const Recompute mode : {Recompute::kNone, Recompute::kSelective}) {
      EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(fu, mode, b, s, tp),
                       encoder_linear + lse + masked_bias);
      EXPECT_DOUBLE_EQ(DecoderLayerStoredBytes(fu, mode, b, s, e, tp),
                       encoder_linear + cross_linear + 2 * lse + masked_bias);
    }
    EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(fu, Recompute::kFull, b, s, tp), B * s * b * h);
  }
  // The grid holds the formula; peak adds the larger of the score gradient
  // and the gate and up gradients (2B sbf).
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims fu = SmallT5V11(AttentionKernel::kFused);
  const CostValues v =
      AnalyticComponentCost(fu, *hw, Component::kDecoderLayer, Recompute::kNone, 1, b, s, e);
  EXPECT_DOUBLE_EQ(v.stored_bytes, DecoderLayerStoredBytes(fu, Recompute::kNone, b, s, e, 1));
  EXPECT_DOUBLE_EQ(v.peak_bytes - v.stored_bytes, 2 * B * s * b * f);
  // The embedding keeps the token ids only (no dropout mask, no positions).
  EXPECT_DOUBLE_EQ(
      AnalyticComponentCost(fu, *hw, Component::kEmbedding, Recompute::kNone, 1, b, s, 0)
          .stored_bytes,
      8 * b * s);
  // Against MEGATRON at the same widths: the dropout masks and the score
  // path's mask and dropout output are gone, the gated MLP keeps 2 more
  // f-wide tensors.
  ModelDims megatron = SmallT5V11(AttentionKernel::kExplicit);
  megatron.architecture = Architecture::kMegatron;
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(megatron, Recompute::kNone, b, s, 1) -
                       EncoderLayerStoredBytes(SmallT5V11(), Recompute::kNone, b, s, 1),
                   2 * s * b * h - 2 * B * s * b * f + (B + 1) * a * s * s * b);
}

// The position bias: kept once per micro-batch by every stage holding a
// stack's layers, whatever its layer count: (4 a / t + 8) bytes per
// query-key pair where the layers keep the fp32 [1, a, s, s] bias (full
// recomputation; selective with the explicit kernel), 8 otherwise (its int64
// bucket ids), s = the stack's sequence (encoder input, decoder target). It
// comes from the job's model (the layout), whatever the cost model: a
// measured profile's layers do not hold it either.
TEST(AnalyticModelT5V11, StagesKeepTheirStacksPositionBiasOnce) {
  const ModelDims d = SmallT5V11();
  absl::StatusOr<CostModel> model = AnalyticModelOf(d, 512);
  ASSERT_THAT(model, IsOk());
  const uint32_t b = 4, s = 256, tgt = 64;
  const double encoder_bias = (4.0 * 6 + 8) * s * s;
  const double decoder_bias = (4.0 * 6 + 8) * tgt * tgt;
  for (const uint32_t pp : {1u, 2u, 4u}) {
    SCOPED_TRACE(pp);
    absl::StatusOr<StageLayout> layout = MakeStageLayout(d, pp, 1);
    ASSERT_THAT(layout, IsOk());
    EXPECT_EQ(layout->position_bias_split_bytes, 4.0 * 6);
    EXPECT_EQ(layout->position_bias_replicated_bytes, 8.0);
    EXPECT_DOUBLE_EQ(layout->PositionBiasBytes(s, 1, Recompute::kSelective), encoder_bias);
    EXPECT_DOUBLE_EQ(layout->PositionBiasBytes(s, 1, Recompute::kFull), encoder_bias);
    EXPECT_DOUBLE_EQ(layout->PositionBiasBytes(s, 2, Recompute::kSelective),
                     (4.0 * 6 / 2 + 8) * s * s);
    // Without recomputation only the bucket ids stay.
    EXPECT_DOUBLE_EQ(layout->PositionBiasBytes(s, 1, Recompute::kNone), 8.0 * s * s);
    // The fused kernel's layers keep their own masked copies, not this one.
    StageLayout fused = *layout;
    fused.position_bias_fused = true;
    EXPECT_DOUBLE_EQ(fused.PositionBiasBytes(s, 1, Recompute::kSelective), 8.0 * s * s);
    EXPECT_DOUBLE_EQ(fused.PositionBiasBytes(s, 1, Recompute::kFull), encoder_bias);
    StageLayout without = *layout;
    without.position_bias_split_bytes = 0;
    without.position_bias_replicated_bytes = 0;
    absl::StatusOr<MicroBatchCostModel> with_bias =
        MicroBatchCostModel::Create(*model, *layout, Recompute::kSelective, 1);
    absl::StatusOr<MicroBatchCostModel> no_bias =
        MicroBatchCostModel::Create(*model, without, Recompute::kSelective, 1);
    ASSERT_THAT(with_bias, IsOk());
    ASSERT_THAT(no_bias, IsOk());
    MicroBatchCost with_cost, no_cost;
    ASSERT_TRUE(with_bias->Evaluate(b, s, tgt, &with_cost));
    ASSERT_TRUE(no_bias->Evaluate(b, s, tgt, &no_cost));
    EXPECT_EQ(with_cost.time_ms, no_cost.time_ms);
    std::vector<StageOpCost> with_stages, no_stages;
    ASSERT_TRUE(with_bias->EvaluateStages(b, s, tgt, 1, d.hidden, d.dtype_bytes, &with_stages));
    ASSERT_TRUE(no_bias->EvaluateStages(b, s, tgt, 1, d.hidden, d.dtype_bytes, &no_stages));
    ASSERT_EQ(with_stages.size(), pp);
    for (uint32_t st = 0; st < pp; ++st) {
      SCOPED_TRACE(st);
      const bool encoder_stage = pp == 1 || st < layout->encoder_devices;
      const bool decoder_stage = pp == 1 || st >= layout->encoder_devices;
      EXPECT_DOUBLE_EQ(with_stages[st].stored_bytes - no_stages[st].stored_bytes,
                       (encoder_stage ? encoder_bias : 0) + (decoder_stage ? decoder_bias : 0));
      // The peak adds the bias's fp32 gradient, alive through the stage's
      // backward beside each layer's transient.
      EXPECT_DOUBLE_EQ(with_stages[st].peak_bytes - no_stages[st].peak_bytes,
                       with_stages[st].stored_bytes - no_stages[st].stored_bytes +
                           (encoder_stage ? 4.0 * 6 * s * s : 0) +
                           (decoder_stage ? 4.0 * 6 * tgt * tgt : 0));
    }
    if (pp == 1) {
      EXPECT_DOUBLE_EQ(with_cost.transient_bytes - no_cost.transient_bytes,
                       4.0 * 6 * (s * s + tgt * tgt));
    }
    if (pp == 1) {
      EXPECT_DOUBLE_EQ(
          with_cost.class_stored_bytes[kFirstDevice] - no_cost.class_stored_bytes[kFirstDevice],
          encoder_bias + decoder_bias);
    } else {
      EXPECT_DOUBLE_EQ(
          with_cost.class_stored_bytes[kFirstDevice] - no_cost.class_stored_bytes[kFirstDevice],
          encoder_bias);
      EXPECT_DOUBLE_EQ(with_cost.class_stored_bytes[kFirstDecoderDevice] -
                           no_cost.class_stored_bytes[kFirstDecoderDevice],
                       decoder_bias);
    }
  }
}

TEST(AnalyticModelT5V11, GridReproducesTheFormulaAndRefusesBadDims) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims d = SmallT5V11();
  absl::StatusOr<CostModel> model = AnalyticModelOf(d, 512);
  ASSERT_THAT(model, IsOk());
  for (const Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const ProfileGrid* grid = model->Grid(Component::kDecoderLayer, mode, 1);
    ASSERT_NE(grid, nullptr);
    CostValues v;
    ASSERT_TRUE(grid->Lookup(4, 64, 256, &v));
    EXPECT_EQ(v, AnalyticComponentCost(d, *hw, Component::kDecoderLayer, mode, 1, 4, 64, 256));
  }
  EXPECT_EQ(model->Parameters(Component::kDecoderLayer),
            ComponentParameters(d, Component::kDecoderLayer, 1, 512));
  ModelDims gpt = d;
  gpt.kind = ModelKind::kGpt;
  gpt.decoder_layers = 0;
  EXPECT_THAT(BuildAnalyticCostModel(gpt, *hw, {}).status().message(),
              HasSubstr("T5V11 models are encoder-decoder"));
  ModelDims no_buckets = d;
  no_buckets.relative_attention_buckets = 0;
  EXPECT_FALSE(BuildAnalyticCostModel(no_buckets, *hw, {}).ok());
}

}  // namespace
}  // namespace varipipe::planner
