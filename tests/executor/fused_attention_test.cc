// The executor's attention kernels (model.attention_kernel): a causal layer
// under FUSED runs without an s x s mask (an undefined mask means causal),
// which must give the masked result at every real position in every
// recompute mode; FUSED needs torch's scaled_dot_product_attention and is
// refused, naming the field, by a build without it (LibTorch before 2.0).
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "executor/model/attention_mask.h"
#include "executor/model/model_spec.h"
#include "executor/model/recomputed_attention.h"
#include "executor/model/transformer_layer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr int64_t kHeads = 4;

ModelSpec SmallGpt(v1::AttentionKernel kernel) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.hidden_size = 32;
  spec.num_attention_heads = kHeads;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = 50;
  spec.max_sequence_length = 40;
  spec.seed = 11;
  spec.attention_kernel = kernel;
  return spec;
}

double MaxDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(AttentionKernelMask, FusedCausalLayersGetNoMask) {
  const torch::Tensor lengths = torch::tensor({3, 5}, torch::kInt64);
  EXPECT_TRUE(SelfAttentionMaskFor(v1::FUSED, lengths, 5, /*causal=*/true).is_causal());
  // Non-causal (T5 encoder) layers still need the key-padding mask.
  EXPECT_EQ(SelfAttentionMaskFor(v1::FUSED, lengths, 5, /*causal=*/false).kind(),
            AttentionInput::Kind::kDenseMask);
  EXPECT_TRUE(torch::equal(SelfAttentionMaskFor(v1::EXPLICIT, lengths, 5, /*causal=*/true).mask(),
                           SelfAttentionMask(lengths, 5, /*causal=*/true)));
}

// An undefined mask is causal: identical to the padding-and-causal mask at
// every real query position of padded samples.
TEST(AttentionKernelMask, UndefinedMaskIsCausalAtRealPositions) {
  std::mt19937 rng(::varipipe::testing::TestSeed("AttentionKernelMask.UndefinedMaskIsCausal"));
  torch::manual_seed(rng());
  const int64_t b = 3, s = 9, width = kHeads * 8;
  const torch::Tensor q = torch::randn({b, s, width});
  const torch::Tensor k = torch::randn({b, s, width});
  const torch::Tensor v = torch::randn({b, s, width});
  const torch::Tensor lengths = torch::tensor({9, 4, 1}, torch::kInt64);
  const torch::Tensor masked =
      MaskedAttention(q, k, v, SelfAttentionMask(lengths, s, /*causal=*/true), kHeads);
  const torch::Tensor causal = MaskedAttention(q, k, v, torch::Tensor(), kHeads);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = lengths[i].item<int64_t>();
    EXPECT_EQ(MaxDifference(masked[i].slice(0, 0, n), causal[i].slice(0, 0, n)), 0) << i;
  }
}

struct LayerRun {
  torch::Tensor out, input_grad;
  std::vector<torch::Tensor> grads;
};

LayerRun RunLayer(TransformerLayer& layer, const torch::Tensor& x0, const AttentionInput& mask) {
  layer.zero_grad();
  for (torch::Tensor& p : layer.parameters()) p.mutable_grad() = torch::Tensor();
  torch::Tensor x = x0.clone().requires_grad_(true);
  LayerRun r;
  r.out = layer.Forward(x, mask);
  (r.out * r.out).sum().backward();
  r.input_grad = x.grad();
  for (const torch::Tensor& p : layer.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

// The layer (its selective and full recomputation included) runs with an
// undefined self-attention mask as with the causal one.
TEST(AttentionKernelLayer, NoMaskMatchesTheCausalMaskInEveryRecomputeMode) {
  std::mt19937 rng(::varipipe::testing::TestSeed("AttentionKernelLayer.NoMaskMatchesCausal"));
  torch::manual_seed(rng());
  const ModelSpec spec = SmallGpt(v1::EXPLICIT);
  TransformerLayer layer(spec, ModelComponent::kEncoderLayer, 0, spec.num_layers);
  const int64_t b = 2, s = 7;
  const torch::Tensor x = torch::randn({b, s, spec.hidden_size});
  const torch::Tensor mask =
      SelfAttentionMask(torch::full({b}, s, torch::kInt64), s, /*causal=*/true);
  const std::vector<std::pair<bool, bool>> modes = {{false, false}, {true, false}, {false, true}};
  for (const auto& [selective, full] : modes) {
    SCOPED_TRACE(absl::StrCat("selective ", selective, " full ", full));
    layer.set_recompute_attention(selective);
    layer.set_recompute_full(full);
    const LayerRun with_mask = RunLayer(layer, x, AttentionInput::DenseMask(mask));
    const LayerRun without = RunLayer(layer, x, AttentionInput::Causal());
    EXPECT_EQ(MaxDifference(with_mask.out, without.out), 0);
    EXPECT_EQ(MaxDifference(with_mask.input_grad, without.input_grad), 0);
    ASSERT_EQ(with_mask.grads.size(), without.grads.size());
    for (size_t i = 0; i < with_mask.grads.size(); ++i) {
      EXPECT_EQ(MaxDifference(with_mask.grads[i], without.grads[i]), 0) << i;
    }
  }
}

v1::JobConfig FusedJob() {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(
      R"({"job_id": "fused", "model": {"kind": "GPT", "num_layers": 2, "hidden_size": 32,
          "num_attention_heads": 4, "vocab_size": 50, "attention_kernel": "FUSED"},
          "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 256,
          "max_sequence_length": 32}})",
      "fused.json");
  EXPECT_THAT(config, IsOk());
  return *config;
}

// Without torch's scaled_dot_product_attention (LibTorch before 2.0) FUSED
// is refused naming the field; with it, the fused kernel gives the explicit
// kernel's values and gradients.
TEST(AttentionKernelFused, RefusedWithoutTheKernelOtherwiseMatchesExplicit) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(FusedJob());
  if (!FusedAttentionAvailable()) {
    EXPECT_THAT(spec, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("model.attention_kernel: FUSED needs"),
                                     HasSubstr("LibTorch 2.0"), HasSubstr("use EXPLICIT"))));
    const torch::Tensor q = torch::randn({1, 4, kHeads * 8});
    EXPECT_THROW(FusedAttention(q, q, q, torch::Tensor(), kHeads), c10::Error);
    return;
  }
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->attention_kernel, v1::FUSED);
  std::mt19937 rng(::varipipe::testing::TestSeed("AttentionKernelFused.MatchesExplicit"));
  torch::manual_seed(rng());
  const int64_t b = 2, s = 9, width = kHeads * 8;
  const torch::Tensor lengths = torch::tensor({9, 5}, torch::kInt64);
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "padding mask");
    const torch::Tensor q = torch::randn({b, s, width}).requires_grad_(true);
    const torch::Tensor k = torch::randn({b, s, width}).requires_grad_(true);
    const torch::Tensor v = torch::randn({b, s, width}).requires_grad_(true);
    const torch::Tensor mask = causal ? torch::Tensor() : SelfAttentionMask(lengths, s, false);
    const torch::Tensor fused = FusedAttention(q, k, v, mask, kHeads);
    const torch::Tensor reference = MaskedAttention(q, k, v, mask, kHeads);
    EXPECT_LE(MaxDifference(fused, reference), 1e-5);
    const auto fused_grads = torch::autograd::grad({fused.sum()}, {q, k, v});
    const auto reference_grads = torch::autograd::grad({reference.sum()}, {q, k, v});
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(MaxDifference(fused_grads[i], reference_grads[i]), 1e-4) << i;
    }
  }
}

// T5V11's attention: unscaled scores plus a position bias [1, heads, s, s]
// whose gradient reaches the bias table. The recomputed core (selective
// recomputation) and, where the build has it, the fused kernel give the
// explicit kernel's values and gradients, the bias's included.
TEST(AttentionKernelBias, RecomputedAndFusedMatchExplicitWithUnscaledBiasedScores) {
  std::mt19937 rng(::varipipe::testing::TestSeed("AttentionKernelBias"));
  torch::manual_seed(rng());
  const int64_t b = 2, s = 9, width = kHeads * 8;
  const torch::Tensor lengths = torch::tensor({9, 5}, torch::kInt64);
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "padding mask");
    const torch::Tensor q = torch::randn({b, s, width}).requires_grad_(true);
    const torch::Tensor k = torch::randn({b, s, width}).requires_grad_(true);
    const torch::Tensor v = torch::randn({b, s, width}).requires_grad_(true);
    const torch::Tensor bias = torch::randn({1, kHeads, s, s}).requires_grad_(true);
    const torch::Tensor mask = causal ? torch::Tensor() : SelfAttentionMask(lengths, s, false);
    const torch::Tensor reference = MaskedAttention(q, k, v, mask, kHeads, bias, /*scaled=*/false);
    // Unscaled differs from scaled: the flag is honoured.
    EXPECT_GT(MaxDifference(reference, MaskedAttention(q, k, v, mask, kHeads, bias)), 1e-3);
    const auto reference_grads = torch::autograd::grad({reference.sum()}, {q, k, v, bias});
    std::vector<std::pair<std::string, torch::Tensor>> kernels = {
        {"recomputed", RecomputedMaskedAttention(q, k, v, mask, kHeads, bias, false)}};
    if (FusedAttentionAvailable()) {
      kernels.emplace_back("fused", FusedAttention(q, k, v, mask, kHeads, bias, false));
    }
    for (const auto& [name, out] : kernels) {
      SCOPED_TRACE(name);
      // With a bias the fused kernel gets the same mask (causal spelled
      // out), so every row compares.
      EXPECT_LE(MaxDifference(out, reference), 1e-5);
      const auto grads = torch::autograd::grad({out.sum()}, {q, k, v, bias});
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_LE(MaxDifference(grads[i], reference_grads[i]), 1e-4) << "gradient " << i;
      }
    }
  }
}

}  // namespace
}  // namespace varipipe::executor
