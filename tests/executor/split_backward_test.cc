// Split backward (zero-bubble schedules) at the model level: B computes the
// input gradients and keeps every linear layer's input and output gradient
// in a WeightGradStore; W (WeightGradStore::Apply) computes the weight
// gradients from them. Here: DeferredLinear against torch::linear; a chain
// of GPT and T5 stages under every recomputation mode, split, against the
// same chain with whole backwards (every parameter and input gradient); what
// B keeps is exactly the linear layers' inputs and output gradients, and the
// counting allocator sees those bytes until W releases them.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "executor/model/deferred_linear.h"
#include "executor/model/model_stage.h"
#include "executor/model/weight_grad_store.h"
#include "executor/runtime/counting_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/stage_chain.h"

namespace varipipe::executor {
namespace {

double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

TEST(ZeroBubbleEquivalence, DeferredLinearMatchesTorchLinear) {
  torch::manual_seed(static_cast<uint64_t>(::varipipe::testing::TestSeed("DeferredLinear")));
  for (bool bias : {true, false}) {
    const torch::Tensor x = torch::randn({3, 5, 8});
    const torch::Tensor w = torch::randn({6, 8});
    const torch::Tensor b = torch::randn({6});
    const torch::Tensor r = torch::randn({3, 5, 6});  // weights the outputs in the loss
    const auto leaves = [&] {
      return std::vector<torch::Tensor>{x.clone().requires_grad_(true),
                                        w.clone().requires_grad_(true),
                                        b.clone().requires_grad_(true)};
    };
    const std::vector<torch::Tensor> whole = leaves();
    (torch::linear(whole[0], whole[1], bias ? whole[2] : torch::Tensor()) * r).sum().backward();

    // Without a store: torch::linear itself.
    const std::vector<torch::Tensor> plain = leaves();
    (DeferredLinear(plain[0], plain[1], bias ? plain[2] : torch::Tensor()) * r).sum().backward();
    ASSERT_TRUE(plain[1].grad().defined());
    EXPECT_TRUE(torch::equal(plain[1].grad(), whole[1].grad()));

    const std::vector<torch::Tensor> split = leaves();
    WeightGradStore store;
    torch::Tensor y;
    {
      const WeightGradScope scope(&store);
      y = DeferredLinear(split[0], split[1], bias ? split[2] : torch::Tensor());
    }
    EXPECT_TRUE(torch::equal(y, torch::linear(x, w, bias ? b : torch::Tensor())));
    (y * r).sum().backward();
    // B: the input and bias gradients, no weight gradient yet.
    EXPECT_FALSE(split[1].grad().defined());
    EXPECT_EQ(store.size(), 1u);
    EXPECT_EQ(store.stored_bytes(), (3 * 5 * 8 + 3 * 5 * 6) * 4);
    EXPECT_LE(RelativeDifference(split[0].grad(), whole[0].grad()), 1e-6);
    if (bias) {
      EXPECT_LE(RelativeDifference(split[2].grad(), whole[2].grad()), 1e-6);
    }
    // W, twice into an accumulating gradient.
    store.Apply();
    EXPECT_EQ(store.size(), 0u);
    EXPECT_EQ(store.stored_bytes(), 0);
    ASSERT_TRUE(split[1].grad().defined());
    EXPECT_LE(RelativeDifference(split[1].grad(), whole[1].grad()), 1e-6);
    {
      const WeightGradScope scope(&store);
      y = DeferredLinear(split[0], split[1], bias ? split[2] : torch::Tensor());
    }
    (y * r).sum().backward();
    store.Apply();
    EXPECT_LE(RelativeDifference(split[1].grad(), 2 * whole[1].grad()), 1e-6);
  }
}

ModelSpec SmallModel(bool t5) {
  ModelSpec spec;
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

// The layers' linear weights, whose gradients W computes. The LM head's is
// B's (chunked_loss_head.h).
bool IsLinearWeight(const std::string& name) {
  for (const char* suffix : {"qkv_weight", "proj_weight", "xq_weight", "xkv_weight", "xproj_weight",
                             "fc1_weight", "fc2_weight"}) {
    if (absl::EndsWith(name, absl::StrCat(".", suffix)) || name == suffix) return true;
  }
  return false;
}

// What B keeps for W on `role`'s stage, in fp32 values: every linear layer's
// input and output gradient (the encoder output, input of every
// cross-attention key/value projection, once); nothing for the LM head.
int64_t KeptValues(const ModelSpec& spec, const StageRole& role, int64_t rows, int64_t s) {
  const int64_t h = spec.hidden_size;
  const int64_t inner = spec.num_attention_heads * spec.kv_channels;
  const int64_t f = spec.ffn_hidden_size;
  const int64_t tokens = rows * s;
  // qkv, proj, fc1, fc2: (input + output gradient) per token.
  const int64_t layer = (h + 3 * inner) + (inner + h) + (h + f) + (f + h);
  int64_t values = tokens * layer * (role.encoder_layers.size() + role.decoder_layers.size());
  if (role.decoder_layers.size() > 0) {
    // xq and xproj per decoder token; xkv's output gradient per encoder
    // token and layer; the encoder output once.
    values +=
        role.decoder_layers.size() * (tokens * ((h + inner) + (inner + h)) + rows * s * 2 * inner);
    values += rows * s * h;
  }
  return values;
}

struct Recompute {
  bool selective = false;
  bool full = false;
};

class StageSplitBackward : public ::testing::TestWithParam<std::tuple<bool, int>> {};

// Three stages, one micro-batch: split backwards (each stage's B recording
// into its own store, W applied stage by stage with everything else already
// released) against whole backwards on identical stages.
TEST_P(StageSplitBackward, GradientsMatchTheWholeBackwardAndTheStoreIsCounted) {
  InstallCountingCpuAllocator();
  MemoryAccount account;  // declared first: outlives the tensors it pays for
  const auto [t5, mode] = GetParam();
  const Recompute recompute{.selective = mode == 1, .full = mode == 2};
  const ModelSpec spec = SmallModel(t5);
  const std::vector<StageRole> roles = *PipelineStageRoles(spec, 3);
  std::mt19937 rng(::varipipe::testing::TestSeed("StageSplitBackward"));
  const int64_t rows = 3;
  const StageBatch batch = RandomBatch(spec, rows, rng);
  const int64_t s = batch.input_tokens.size(1);

  // Runs the chain; with `split`, every stage's forward records into its
  // own store. Returns the stages' input gradients.
  const auto run = [&](std::vector<std::shared_ptr<ModelStage>>& stages,
                       std::vector<std::unique_ptr<WeightGradStore>>* stores) {
    std::vector<StageActivations> in(stages.size());
    std::vector<StageActivations> out(stages.size());
    for (size_t i = 0; i < stages.size(); ++i) {
      stages[i]->SetSelectiveRecompute(recompute.selective);
      stages[i]->SetFullRecompute(recompute.full);
      if (i > 0) {
        in[i].hidden = out[i - 1].hidden.detach().requires_grad_(true);
        if (out[i - 1].memory.defined()) {
          in[i].memory = out[i - 1].memory.detach().requires_grad_(true);
        }
      }
      const WeightGradScope scope(stores != nullptr ? (*stores)[i].get() : nullptr);
      out[i] = stages[i]->Forward(in[i], batch);
    }
    ::varipipe::testing::BackwardAcrossStages(in, out);
    std::vector<torch::Tensor> input_grads;
    for (size_t i = 1; i < stages.size(); ++i) {
      input_grads.push_back(in[i].hidden.grad().clone());
      if (in[i].memory.defined()) input_grads.push_back(in[i].memory.grad().clone());
    }
    return input_grads;
  };

  std::vector<std::shared_ptr<ModelStage>> whole_stages;
  std::vector<std::shared_ptr<ModelStage>> split_stages;
  for (const StageRole& role : roles) {
    whole_stages.push_back(std::make_shared<ModelStage>(spec, role));
    split_stages.push_back(std::make_shared<ModelStage>(spec, role));
  }
  const std::vector<torch::Tensor> whole_inputs = run(whole_stages, nullptr);

  const ScopedAccount scope(&account);
  std::vector<std::unique_ptr<WeightGradStore>> stores;
  for (size_t i = 0; i < roles.size(); ++i) stores.push_back(std::make_unique<WeightGradStore>());
  const std::vector<torch::Tensor> split_inputs = run(split_stages, &stores);
  // The chain's graphs and activations are gone; only the stores hold what
  // B kept.
  ASSERT_EQ(split_inputs.size(), whole_inputs.size());
  for (size_t k = 0; k < split_inputs.size(); ++k) {
    EXPECT_LE(RelativeDifference(split_inputs[k], whole_inputs[k]), 1e-6) << "input gradient " << k;
  }
  for (size_t i = 0; i < roles.size(); ++i) {
    for (const auto& item : split_stages[i]->named_parameters()) {
      // B leaves the linear weights without gradients and computes the rest.
      EXPECT_EQ(item.value().grad().defined(), !IsLinearWeight(item.key())) << item.key();
    }
    const int64_t expected = KeptValues(spec, roles[i], rows, s) * 4;
    EXPECT_EQ(stores[i]->stored_bytes(), expected) << roles[i].DebugString();
    int64_t weight_grad_bytes = 0;
    for (const auto& item : split_stages[i]->named_parameters()) {
      if (IsLinearWeight(item.key())) weight_grad_bytes += item.value().numel() * 4;
    }
    // The encoder output passes through every decoder stage: the first
    // decoder stage's store shares it with the next one's, which releases it.
    const int64_t shared =
        roles[i].embeds_decoder && i + 1 < roles.size() ? rows * s * spec.hidden_size * 4 : 0;
    const int64_t before = account.current_bytes();
    stores[i]->Apply();
    // W releases exactly what B kept and allocates the weight gradients.
    const int64_t released = before - account.current_bytes() + shared;
    std::printf("%s: B kept %.1f KiB for W (the allocator saw %.1f KiB released)\n",
                roles[i].DebugString().c_str(), expected / 1024.0,
                (released + weight_grad_bytes) / 1024.0);
    EXPECT_EQ(released + weight_grad_bytes, expected) << roles[i].DebugString();
  }
  double worst = 0;
  for (size_t i = 0; i < roles.size(); ++i) {
    const auto whole = whole_stages[i]->named_parameters();
    for (const auto& item : split_stages[i]->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      const double d = RelativeDifference(item.value().grad(), whole[item.key()].grad());
      EXPECT_LE(d, 1e-6) << item.key();
      worst = std::max(worst, d);
    }
  }
  std::printf("worst relative gradient difference, split against whole: %.3g\n", worst);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<bool, int>>& info) {
  static const char* const kModes[] = {"RecomputeNone", "RecomputeSelective", "RecomputeFull"};
  return absl::StrCat(std::get<0>(info.param) ? "T5" : "Gpt", "_", kModes[std::get<1>(info.param)]);
}

INSTANTIATE_TEST_SUITE_P(ZeroBubbleEquivalence, StageSplitBackward,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2)),
                         CaseName);

}  // namespace
}  // namespace varipipe::executor
