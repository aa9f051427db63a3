// Mixed precision as Megatron-LM runs it (docs/models.md, "Mixed
// precision"), proved on CPUs with a forced bf16 compute dtype
// (ScopedComputeDtype): each linear weight, bias and the LM head's weight is
// cast once per optimizer step and that copy serves every pass of the
// iteration (forwards, recomputations, whole and split backwards); the
// gradients of GPT, Llama, T5 and T5 v1.1 stage chains match the fp32
// model's within bf16 tolerances, also with full recomputation and split
// backwards; stage outputs, the residual stream and what layers keep for
// backward are in the compute dtype (the counting allocator sees half the
// fp32 bytes). Without a forced dtype the CPU path casts nothing.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "executor/model/cuda_autocast.h"
#include "executor/model/deferred_linear.h"
#include "executor/model/model_stage.h"
#include "executor/model/weight_cast_cache.h"
#include "executor/model/weight_grad_store.h"
#include "executor/runtime/counting_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/stage_chain.h"

namespace varipipe::executor {
namespace {

enum class Arch { kGpt, kLlama, kT5, kT5V11 };

const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kGpt:
      return "Gpt";
    case Arch::kLlama:
      return "Llama";
    case Arch::kT5:
      return "T5";
    case Arch::kT5V11:
      return "T5V11";
  }
  return "?";
}

ModelSpec TinyModel(Arch arch) {
  ModelSpec spec;
  const bool t5 = arch == Arch::kT5 || arch == Arch::kT5V11;
  spec.num_layers = t5 ? 2 : 4;
  spec.num_decoder_layers = t5 ? 3 : 0;
  spec.encoder_decoder = t5;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = 50;
  spec.max_sequence_length = 40;
  spec.seed = 11;
  if (arch == Arch::kLlama) {
    spec.llama = true;
    spec.num_key_value_heads = 2;
    spec.norm_epsilon = 1e-5;
    spec.rope_theta = 10000;
  }
  if (arch == Arch::kT5V11) {
    spec.t5v11 = true;
    spec.norm_epsilon = 1e-6;
    spec.relative_buckets = 8;
    spec.relative_max_distance = 20;
  }
  return spec;
}

// A padded micro-batch of `rows` random samples (lengths 2 to 16, padded to
// 18); GPT labels are the next tokens, T5's the targets.
StageBatch RandomBatch(const ModelSpec& spec, int64_t rows, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> token(1, spec.vocab_size - 1);
  std::uniform_int_distribution<int64_t> length(2, 16);
  const int64_t s = 18;
  StageBatch batch;
  batch.input_tokens = torch::zeros({rows, s}, torch::kInt64);
  batch.input_lengths = torch::zeros({rows}, torch::kInt64);
  batch.labels = torch::full({rows, s}, -1, torch::kInt64);
  if (spec.encoder_decoder) {
    batch.decoder_tokens = torch::zeros({rows, s}, torch::kInt64);
    batch.target_lengths = torch::zeros({rows}, torch::kInt64);
  }
  double loss_tokens = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = length(rng);
    batch.input_lengths[i] = n;
    for (int64_t j = 0; j < n; ++j) batch.input_tokens[i][j] = token(rng);
    if (!spec.encoder_decoder) {
      for (int64_t j = 0; j + 1 < n; ++j) batch.labels[i][j] = batch.input_tokens[i][j + 1];
      loss_tokens += static_cast<double>(n - 1);
      continue;
    }
    const int64_t m = length(rng);
    batch.target_lengths[i] = m;
    for (int64_t j = 0; j < m; ++j) {
      batch.labels[i][j] = token(rng);
      if (j + 1 < m) batch.decoder_tokens[i][j + 1] = batch.labels[i][j];
    }
    loss_tokens += static_cast<double>(m);
  }
  batch.loss_scale = 1.0 / loss_tokens;
  return batch;
}

// The parameters the cache casts: every linear layer's weight and bias and
// the LM head's weight (not norms, embeddings or bias tables).
bool IsCastParameter(const std::string& name) {
  for (const char* suffix :
       {"qkv_weight", "qkv_bias", "proj_weight", "proj_bias", "xq_weight", "xq_bias",
        "xkv_weight", "xkv_bias", "xproj_weight", "xproj_bias", "fc1_weight", "fc1_bias",
        "fc2_weight", "fc2_bias", "q_weight", "k_weight", "v_weight", "o_weight", "xk_weight",
        "xv_weight", "xo_weight", "gate_weight", "up_weight", "down_weight", "head_weight"}) {
    if (absl::EndsWith(name, absl::StrCat(".", suffix)) || name == suffix) return true;
  }
  return false;
}

double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kFloat64);
  const torch::Tensor y = b.to(torch::kFloat64);
  return (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30);
}

struct Chain {
  std::vector<std::shared_ptr<ModelStage>> stages;
  torch::Tensor loss;
  std::vector<torch::Tensor> input_grads;  // of stages 1.. (hidden, then memory)
  std::vector<StageActivations> outputs;
};

enum class Mode { kNone, kFull, kSplit, kSplitFull };

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kNone:
      return "RecomputeNone";
    case Mode::kFull:
      return "RecomputeFull";
    case Mode::kSplit:
      return "SplitBackward";
    case Mode::kSplitFull:
      return "SplitBackwardRecomputeFull";
  }
  return "?";
}

// Runs a chain of `num_stages` fresh stages of `spec` on `batch` (forward,
// backward; with a split mode B then W per stage), in the current compute
// dtype.
Chain RunChain(const ModelSpec& spec, int64_t num_stages, const StageBatch& batch, Mode mode) {
  Chain chain;
  const std::vector<StageRole> roles = *PipelineStageRoles(spec, num_stages);
  for (const StageRole& role : roles) {
    chain.stages.push_back(std::make_shared<ModelStage>(spec, role));
  }
  const bool split = mode == Mode::kSplit || mode == Mode::kSplitFull;
  std::vector<std::unique_ptr<WeightGradStore>> stores;
  std::vector<StageActivations> in(chain.stages.size());
  chain.outputs.resize(chain.stages.size());
  for (size_t i = 0; i < chain.stages.size(); ++i) {
    chain.stages[i]->SetFullRecompute(mode == Mode::kFull || mode == Mode::kSplitFull);
    if (i > 0) {
      in[i].hidden = chain.outputs[i - 1].hidden.detach().requires_grad_(true);
      if (chain.outputs[i - 1].memory.defined()) {
        in[i].memory = chain.outputs[i - 1].memory.detach().requires_grad_(true);
      }
    }
    stores.push_back(split ? std::make_unique<WeightGradStore>() : nullptr);
    const WeightGradScope scope(stores.back().get());
    chain.outputs[i] = chain.stages[i]->Forward(in[i], batch);
  }
  chain.loss = chain.outputs.back().loss.detach();
  ::varipipe::testing::BackwardAcrossStages(in, chain.outputs);
  for (const std::unique_ptr<WeightGradStore>& store : stores) {
    if (store == nullptr) continue;
    EXPECT_GT(store->size(), 0u);  // B left the linear weights' gradients to W
    store->Apply();
  }
  for (size_t i = 1; i < chain.stages.size(); ++i) {
    chain.input_grads.push_back(in[i].hidden.grad());
    if (in[i].memory.defined()) chain.input_grads.push_back(in[i].memory.grad());
  }
  return chain;
}

class MixedPrecisionGradients : public ::testing::TestWithParam<std::tuple<Arch, Mode>> {};

// Three stages, one micro-batch of three rows: bf16 computation with fp32
// master weights against the fp32 model.
TEST_P(MixedPrecisionGradients, MatchTheFp32ModelWithinBf16Tolerance) {
  const auto [arch, mode] = GetParam();
  const ModelSpec spec = TinyModel(arch);
  std::mt19937 rng(::varipipe::testing::TestSeed("MixedPrecisionGradients"));
  const StageBatch batch = RandomBatch(spec, 3, rng);
  const Chain reference = RunChain(spec, 3, batch, Mode::kNone);
  ClearWeightCasts();
  Chain mixed;
  {
    const ScopedComputeDtype bf16(torch::kBFloat16);
    mixed = RunChain(spec, 3, batch, mode);
  }
  // Stage outputs (the next stage's inputs) and the encoder output that
  // travels with them are bf16; the loss is fp32.
  for (size_t i = 0; i + 1 < mixed.outputs.size(); ++i) {
    EXPECT_EQ(mixed.outputs[i].hidden.scalar_type(), torch::kBFloat16) << "stage " << i;
    if (mixed.outputs[i].memory.defined()) {
      EXPECT_EQ(mixed.outputs[i].memory.scalar_type(), torch::kBFloat16) << "stage " << i;
    }
  }
  EXPECT_EQ(mixed.loss.scalar_type(), torch::kFloat32);
  EXPECT_LE(RelativeDifference(mixed.loss, reference.loss), 1e-2);
  ASSERT_EQ(mixed.input_grads.size(), reference.input_grads.size());
  for (size_t k = 0; k < mixed.input_grads.size(); ++k) {
    EXPECT_EQ(mixed.input_grads[k].scalar_type(), torch::kBFloat16) << "input gradient " << k;
    EXPECT_LE(RelativeDifference(mixed.input_grads[k], reference.input_grads[k]), 5e-2)
        << "input gradient " << k;
  }
  double worst = 0;
  double total = 0;
  int64_t cast = 0;
  for (size_t i = 0; i < mixed.stages.size(); ++i) {
    const auto want = reference.stages[i]->named_parameters();
    for (const auto& item : mixed.stages[i]->named_parameters()) {
      const torch::Tensor& grad = item.value().grad();
      ASSERT_TRUE(grad.defined()) << item.key();
      // fp32 master weights and fp32 gradients.
      EXPECT_EQ(item.value().scalar_type(), torch::kFloat32) << item.key();
      EXPECT_EQ(grad.scalar_type(), torch::kFloat32) << item.key();
      const double d = RelativeDifference(grad, want[item.key()].grad());
      EXPECT_LE(d, 5e-2) << "stage " << i << " " << item.key();
      worst = std::max(worst, d);
      total += (grad - want[item.key()].grad()).abs().sum().item<double>();
      if (IsCastParameter(item.key())) cast += 1;
    }
  }
  std::printf("%s %s: loss %.6f (fp32 %.6f), worst relative gradient difference %.3g\n",
              ArchName(arch), ModeName(mode), mixed.loss.item<double>(),
              reference.loss.item<double>(), worst);
  // The computation did run in bf16 (an fp32 run would match to ~1e-7).
  EXPECT_GT(worst, 1e-4);
  EXPECT_GT(total, 0);
  // One copy per cast parameter, whatever the recomputation and the split.
  EXPECT_EQ(WeightCastCacheStats().casts, cast);
}

std::string GradientCaseName(const ::testing::TestParamInfo<std::tuple<Arch, Mode>>& info) {
  return absl::StrCat(ArchName(std::get<0>(info.param)), "_", ModeName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Bf16, MixedPrecisionGradients,
                         ::testing::Combine(::testing::Values(Arch::kGpt, Arch::kLlama, Arch::kT5,
                                                              Arch::kT5V11),
                                            ::testing::Values(Mode::kNone, Mode::kFull,
                                                              Mode::kSplit, Mode::kSplitFull)),
                         GradientCaseName);

// SGD on every parameter with a gradient, as the optimizer updates them (in
// place, under no grad, with foreach operators).
void Step(ModelStage& stage) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : stage.parameters()) {
    if (!p.grad().defined()) continue;
    params.push_back(p);
    grads.push_back(p.grad());
  }
  torch::_foreach_add_(params, grads, -0.1);
  for (torch::Tensor& g : grads) g.zero_();
}

// One stage holding the whole GPT model (embedding, layers, head), several
// micro-batches in flight in a 1F1B-like order, under every recomputation
// and a split backward: one cast per linear weight, bias and the head's
// weight per optimizer step; the copies are dtype bytes x those parameters;
// a step makes the next pass cast again, and the copies are then those of
// the updated weights.
TEST(WeightCastCache, OneCastPerParameterPerOptimizerStep) {
  for (Arch arch : {Arch::kGpt, Arch::kLlama}) {
    const ModelSpec spec = TinyModel(arch);
    const StageRole role = (*PipelineStageRoles(spec, 1))[0];
    ModelStage stage(spec, role);
    int64_t cast_parameters = 0;
    int64_t cast_values = 0;
    for (const auto& item : stage.named_parameters()) {
      if (!IsCastParameter(item.key())) continue;
      ++cast_parameters;
      cast_values += item.value().numel();
    }
    std::mt19937 rng(::varipipe::testing::TestSeed("OneCastPerParameterPerOptimizerStep"));
    std::vector<StageBatch> batches;
    for (int k = 0; k < 4; ++k) batches.push_back(RandomBatch(spec, 2, rng));

    // Without a forced dtype (CPUs, fp32) nothing is cast.
    ClearWeightCasts();
    stage.Forward({}, batches[0]).loss.backward();
    EXPECT_EQ(WeightCastCacheStats().casts, 0);
    EXPECT_EQ(WeightCastCacheStats().held_bytes, 0);

    const ScopedComputeDtype bf16(torch::kBFloat16);
    for (int step = 1; step <= 2; ++step) {
      // F0 (no recomputation), F1 (full), B0, F2 (selective), B1, F3 (split:
      // full recomputation with a store), B2, B3, W3.
      stage.SetFullRecompute(false);
      StageActivations out0 = stage.Forward({}, batches[0]);
      stage.SetFullRecompute(true);
      StageActivations out1 = stage.Forward({}, batches[1]);
      out0.loss.backward();
      stage.SetFullRecompute(false);
      stage.SetSelectiveRecompute(true);
      StageActivations out2 = stage.Forward({}, batches[2]);
      out1.loss.backward();
      stage.SetSelectiveRecompute(false);
      stage.SetFullRecompute(true);
      WeightGradStore store;
      StageActivations out3;
      {
        const WeightGradScope scope(&store);
        out3 = stage.Forward({}, batches[3]);
      }
      out2.loss.backward();
      out3.loss.backward();
      store.Apply();
      const WeightCastStats stats = WeightCastCacheStats();
      std::printf("%s step %d: %lld casts of %lld parameters, %lld bytes held\n", ArchName(arch),
                  step, static_cast<long long>(stats.casts),
                  static_cast<long long>(cast_parameters),
                  static_cast<long long>(stats.held_bytes));
      EXPECT_EQ(stats.casts, step * cast_parameters) << ArchName(arch) << " step " << step;
      EXPECT_EQ(stats.held_bytes, 2 * cast_values) << ArchName(arch) << " step " << step;
      // The copies are those of the current weights (a look-up, no cast).
      for (const auto& item : stage.named_parameters()) {
        if (!IsCastParameter(item.key())) continue;
        EXPECT_TRUE(torch::equal(CachedCast(item.value(), torch::kBFloat16),
                                 item.value().detach().to(torch::kBFloat16)))
            << item.key();
      }
      EXPECT_EQ(WeightCastCacheStats().casts, stats.casts);
      Step(stage);
    }
  }
}

// The linear layer under mixed precision: output, input and bias gradients
// in bf16 from the cached copies; grad_W = grad_y^T x in bf16 accumulated
// into the fp32 grad(); the split backward (B, then W) gives the same
// gradients from the same copy, and what B keeps is bf16.
TEST(WeightCastCache, DeferredLinearUsesTheCopyInBothBackwards) {
  torch::manual_seed(::varipipe::testing::TestSeed("DeferredLinearUsesTheCopy"));
  const torch::Tensor x = torch::randn({3, 5, 8});
  const torch::Tensor w = torch::randn({6, 8}).requires_grad_(true);
  const torch::Tensor b = torch::randn({6}).requires_grad_(true);
  const torch::Tensor r = torch::randn({3, 5, 6});
  ClearWeightCasts();
  const ScopedComputeDtype bf16(torch::kBFloat16);
  // The bf16 computation by hand.
  const torch::Tensor x16 = x.to(torch::kBFloat16);
  const torch::Tensor w16 = w.detach().to(torch::kBFloat16);
  const torch::Tensor b16 = b.detach().to(torch::kBFloat16);
  const torch::Tensor g16 = r.to(torch::kBFloat16);
  const torch::Tensor want_grad_w =
      g16.reshape({-1, 6}).t().mm(x16.reshape({-1, 8})).to(torch::kFloat32);

  const torch::Tensor xa = x.clone().requires_grad_(true);
  const torch::Tensor y = DeferredLinear(xa, w, b);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y, torch::linear(x16, w16, b16)));
  y.backward(g16);
  EXPECT_EQ(xa.grad().scalar_type(), torch::kFloat32);  // x's own dtype
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
  EXPECT_LE(RelativeDifference(w.grad(), want_grad_w), 1e-2);
  EXPECT_LE(RelativeDifference(xa.grad(), g16.matmul(w16).to(torch::kFloat32)), 1e-2);
  EXPECT_EQ(WeightCastCacheStats().casts, 2);  // w and b

  // Split: B leaves grad_W to W, which accumulates the same product.
  const torch::Tensor whole_grad_w = w.grad().clone();
  const torch::Tensor whole_grad_b = b.grad().clone();
  WeightGradStore store;
  torch::Tensor ys;
  {
    const WeightGradScope scope(&store);
    ys = DeferredLinear(x.clone().requires_grad_(true), w, b);
  }
  EXPECT_TRUE(torch::equal(ys, y));
  ys.backward(g16);
  EXPECT_EQ(store.stored_bytes(), (3 * 5 * 8 + 3 * 5 * 6) * 2);  // bf16 x and grad_y
  EXPECT_TRUE(torch::equal(w.grad(), whole_grad_w));             // not yet
  EXPECT_LE(RelativeDifference(b.grad(), 2 * whole_grad_b), 1e-2);
  store.Apply();
  EXPECT_LE(RelativeDifference(w.grad(), 2 * whole_grad_w), 1e-2);
  EXPECT_EQ(WeightCastCacheStats().casts, 2);  // the same copies
  // An in-place update (the optimizer's) makes the next use cast again.
  {
    torch::NoGradGuard no_grad;
    w.add_(w.grad(), -0.1);
  }
  DeferredLinear(x, w, b);
  EXPECT_EQ(WeightCastCacheStats().casts, 3);
  EXPECT_TRUE(torch::equal(CachedCast(w, torch::kBFloat16), w.detach().to(torch::kBFloat16)));
}

// What a layer keeps for backward is in the compute dtype: a middle GPT
// stage (layers only) keeps, after its forward, half the fp32 model's bytes
// with full recomputation (each layer's input and the stage output: exactly
// (layers) x b s h x 2 bytes plus the attention mask) and about half
// without recomputation (the norms keep their bf16 inputs, not fp32 copies).
TEST(MixedPrecisionMemory, SavedActivationsAreInTheComputeDtype) {
  InstallCountingCpuAllocator();
  ModelSpec spec = TinyModel(Arch::kGpt);
  spec.num_layers = 6;  // two a stage
  spec.hidden_size = 64;
  spec.kv_channels = 16;
  spec.ffn_hidden_size = 128;
  const StageRole role = (*PipelineStageRoles(spec, 3))[1];
  ASSERT_FALSE(role.embeds_input);
  ASSERT_FALSE(role.has_head);
  const int64_t layers = role.encoder_layers.size();
  ModelStage stage(spec, role);
  std::mt19937 rng(::varipipe::testing::TestSeed("SavedActivationsAreInTheComputeDtype"));
  const int64_t rows = 2;
  const StageBatch batch = RandomBatch(spec, rows, rng);
  const int64_t s = batch.input_tokens.size(1);
  const int64_t h = spec.hidden_size;
  torch::manual_seed(::varipipe::testing::TestSeed("SavedActivationsInput"));
  const torch::Tensor hidden = torch::randn({rows, s, h});

  // The bytes the stage's forward leaves allocated (its graph and output).
  const auto kept = [&](torch::ScalarType dtype, bool full) {
    stage.SetFullRecompute(full);
    StageActivations in;
    in.hidden = hidden.to(dtype).clone().requires_grad_(true);
    MemoryAccount account;  // outlives what it pays for
    StageActivations out;
    int64_t bytes = 0;
    {
      const ScopedAccount scope(&account);
      out = stage.Forward(in, batch);
      bytes = account.current_bytes();
    }
    EXPECT_EQ(out.hidden.scalar_type(), dtype);
    out.hidden.backward(torch::ones_like(out.hidden));
    out = StageActivations();
    return bytes;
  };
  const int64_t mask = rows * s * s;  // the bool self-attention mask, shared by the layers
  const int64_t full32 = kept(torch::kFloat32, true);
  const int64_t none32 = kept(torch::kFloat32, false);
  ClearWeightCasts();
  int64_t full16 = 0;
  int64_t none16 = 0;
  {
    const ScopedComputeDtype bf16(torch::kBFloat16);
    {
      // The iteration's weight copies are made by the first pass: make them
      // outside the account.
      torch::NoGradGuard no_grad;
      StageActivations in;
      in.hidden = hidden.to(torch::kBFloat16);
      stage.Forward(in, batch);
    }
    full16 = kept(torch::kBFloat16, true);
    none16 = kept(torch::kBFloat16, false);
  }
  std::printf(
      "kept after the forward of %lld layers: full recomputation fp32 %lld, bf16 %lld bytes; "
      "none fp32 %lld, bf16 %lld bytes (mask %lld)\n",
      static_cast<long long>(layers), static_cast<long long>(full32),
      static_cast<long long>(full16), static_cast<long long>(none32),
      static_cast<long long>(none16), static_cast<long long>(mask));
  // Full recomputation: the inputs of layers 1.. and the output, in bf16.
  const int64_t activation = rows * s * h;
  EXPECT_EQ(full16 - mask, layers * activation * 2);
  EXPECT_EQ(full32 - mask, layers * activation * 4);
  EXPECT_LE(none16, none32 * 6 / 10);
}

}  // namespace
}  // namespace varipipe::executor
