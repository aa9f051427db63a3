// The LM head on the labelled positions only, a chunk of tokens at a time
// (executor/model/chunked_loss_head.h, ModelStage's head; docs/models.md,
// "The loss head"):
// - ChunkedLinearCrossEntropy gives the loss and the gradients of the plain
//   head (all logits, then cross-entropy) for every chunk size, a chunk of
//   one token and one larger than the rows included, and none for no rows;
// - a last stage's loss and gradients (hidden input, final norm, head; tied
//   or not) equal those of the plain head over every position with -1
//   labels ignored, with the labelled positions given (as the loader builds
//   them) or derived, and whatever the chunk;
// - measured on the CPU's counting allocator, the head's peak memory grows
//   with the labelled tokens and hardly with the others, and a chunk
//   smaller than the labelled tokens bounds it.
// The vocabulary-parallel head under tensor parallelism is checked end to
// end by equivalence_test's LabelledHead Tp2 cells.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/loss_head_chunk.h"
#include "executor/model/chunked_loss_head.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/model/tensor_group.h"
#include "executor/model/transformer_layer.h"
#include "executor/runtime/counting_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace varipipe::executor {
namespace {

// max |a - b| / max |b| (0 when both vanish).
double RelativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const double diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// The plain head: every logit at once, cross-entropy summed, -1 ignored.
torch::Tensor PlainLoss(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      torch::linear(x, weight).to(torch::kFloat32), labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
}

TEST(ChunkedLinearCrossEntropyTest, MatchesThePlainHeadForEveryChunk) {
  const uint32_t seed = testing::TestSeed("ChunkedLinearCrossEntropyTest.MatchesThePlainHead");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  const TensorGroup alone;
  for (int round = 0; round < 4; ++round) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 60);
    const int64_t h = 8 + static_cast<int64_t>(rng() % 24);
    const int64_t vocab = 17 + static_cast<int64_t>(rng() % 80);
    const torch::Tensor x0 = torch::randn({n, h});
    const torch::Tensor w0 = torch::randn({vocab, h}) * 0.3;
    torch::Tensor labels = torch::randint(vocab, {n}, torch::kInt64);
    // About one label in five ignored.
    labels.masked_fill_(torch::rand({n}) < 0.2, -1);
    // The reference in fp64.
    const torch::Tensor xr = x0.to(torch::kFloat64).requires_grad_(true);
    const torch::Tensor wr = w0.to(torch::kFloat64).requires_grad_(true);
    const torch::Tensor want = torch::nn::functional::cross_entropy(
        torch::linear(xr, wr), labels,
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
    want.backward(torch::full({}, 0.5, torch::kFloat64));
    for (int64_t chunk : {int64_t{1}, int64_t{5}, std::max<int64_t>(1, n - 1), n, 3 * n}) {
      const torch::Tensor x = x0.clone().requires_grad_(true);
      const torch::Tensor w = w0.clone().requires_grad_(true);
      const torch::Tensor loss = ChunkedLinearCrossEntropy(x, w, labels, 0, alone, chunk);
      loss.backward(torch::full({}, 0.5));
      const std::string what = "seed " + std::to_string(seed) + " round " + std::to_string(round) +
                               " n " + std::to_string(n) + " chunk " + std::to_string(chunk);
      EXPECT_EQ(loss.scalar_type(), torch::kFloat32) << what;
      EXPECT_LE(RelativeDifference(loss, want), 1e-5) << what;
      EXPECT_LE(RelativeDifference(x.grad(), xr.grad()), 1e-5) << what;
      EXPECT_LE(RelativeDifference(w.grad(), wr.grad()), 1e-5) << what;
    }
  }
  // No labelled row: no loss, zero gradients.
  const torch::Tensor x = torch::randn({0, 8}).requires_grad_(true);
  const torch::Tensor w = torch::randn({11, 8}).requires_grad_(true);
  const torch::Tensor loss =
      ChunkedLinearCrossEntropy(x, w, torch::zeros({0}, torch::kInt64), 0, alone, 4);
  loss.backward();
  EXPECT_EQ(loss.item<float>(), 0.0f);
  EXPECT_EQ(w.grad().abs().max().item<float>(), 0.0f);
}

ModelSpec HeadSpec(bool llama, int64_t vocab) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = vocab;
  spec.max_sequence_length = 64;
  spec.seed = 11;
  if (llama) {
    spec.llama = true;
    spec.tie_word_embeddings = true;
  }
  return spec;
}

// A last stage holding the head only (no layer): Forward is the final norm,
// the head and the loss.
StageRole HeadOnly() {
  StageRole role;
  role.stage = 1;
  role.has_head = true;
  return role;
}

StageActivations Input(const torch::Tensor& hidden) {
  StageActivations in;
  in.hidden = hidden;
  return in;
}

// Labels [b, s] of `labelled` positions (-1 elsewhere), spread over the rows.
torch::Tensor SparseLabels(int64_t b, int64_t s, int64_t labelled, int64_t vocab,
                           std::mt19937& rng) {
  torch::Tensor labels = torch::full({b * s}, -1, torch::kInt64);
  std::vector<int64_t> order(static_cast<size_t>(b * s));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t i = 0; i < labelled; ++i) {
    labels[order[static_cast<size_t>(i)]] = static_cast<int64_t>(rng() % vocab);
  }
  return labels.reshape({b, s});
}

// The plain head of a stage over every position (the head before it ran on
// labelled positions only): the final norm, all logits, the loss.
torch::Tensor PlainStageLoss(ModelStage& stage, const ModelSpec& spec, const torch::Tensor& hidden,
                             const torch::Tensor& labels) {
  std::map<std::string, torch::Tensor> p;
  for (const auto& item : stage.named_parameters()) p[item.key()] = item.value();
  const torch::Tensor normed =
      spec.llama ? RmsNorm(hidden, p.at("final_norm_weight"), spec.norm_epsilon)
                 : torch::layer_norm(hidden, {spec.hidden_size}, p.at("final_ln_weight"),
                                     p.at("final_ln_bias"), 1e-5);
  const torch::Tensor weight = spec.llama ? p.at("word_embedding") : p.at("head_weight");
  return PlainLoss(normed.reshape({-1, spec.hidden_size}), weight, labels.reshape({-1}));
}

std::map<std::string, torch::Tensor> TakeGradients(ModelStage& stage, const torch::Tensor& hidden) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : stage.named_parameters()) {
    out[item.key()] = item.value().grad().clone();
    item.value().mutable_grad() = torch::Tensor();
  }
  out["hidden"] = hidden.grad().clone();
  hidden.mutable_grad() = torch::Tensor();
  return out;
}

TEST(LabelledHeadTest, StageLossAndGradientsEqualThePlainHeadOverEveryPosition) {
  const uint32_t seed = testing::TestSeed("LabelledHeadTest.StageLossAndGradients");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  for (bool llama : {false, true}) {
    const ModelSpec spec = HeadSpec(llama, 97);
    ModelStage stage(spec, HeadOnly());
    const int64_t b = 3, s = 13;
    const torch::Tensor hidden = torch::randn({b, s, spec.hidden_size}).requires_grad_(true);
    StageBatch batch;
    batch.labels = SparseLabels(b, s, 17, spec.vocab_size, rng);
    batch.loss_scale = 0.25;
    PlainStageLoss(stage, spec, hidden, batch.labels).mul(0.25).backward();
    const std::map<std::string, torch::Tensor> want = TakeGradients(stage, hidden);
    const double want_loss = PlainStageLoss(stage, spec, hidden, batch.labels).item<double>() / 4;
    for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{4}}) {
      for (bool given : {false, true}) {
        stage.set_loss_chunk_tokens(chunk);
        StageBatch run = batch;
        if (given) run.labelled_positions = LabelledPositionsOf(batch.labels);
        const StageActivations out = stage.Forward(Input(hidden), run);
        const std::string what = std::string(llama ? "LLAMA tied" : "GPT") + " chunk " +
                                 std::to_string(chunk) + (given ? " given" : " derived") +
                                 " seed " + std::to_string(seed);
        EXPECT_NEAR(out.loss.item<double>(), want_loss, 1e-5 * want_loss) << what;
        out.loss.backward();
        const std::map<std::string, torch::Tensor> got = TakeGradients(stage, hidden);
        ASSERT_EQ(got.size(), want.size()) << what;
        for (const auto& [name, g] : want) {
          EXPECT_LE(RelativeDifference(got.at(name), g), 1e-5) << what << ": " << name;
        }
        // Unlabelled positions get no gradient.
        const torch::Tensor unlabelled = (batch.labels < 0).unsqueeze(-1);
        EXPECT_EQ(got.at("hidden").masked_select(unlabelled).abs().max().item<float>(), 0.0f)
            << what;
      }
    }
    EXPECT_EQ(stage.loss_chunk_tokens(), 4);
    stage.set_loss_chunk_tokens(0);
    EXPECT_EQ(stage.loss_chunk_tokens(), DefaultLossChunkTokens(spec.vocab_size));
  }
}

TEST(LabelledHeadTest, DefaultChunkKeepsOneChunksLogitsNearTheirBudget) {
  EXPECT_EQ(DefaultLossChunkTokens(50257), 1335);   // GPT-2: 256 MiB of fp32 logits
  EXPECT_EQ(DefaultLossChunkTokens(25129), 2670);   // the same over 2 tensor ranks
  EXPECT_EQ(DefaultLossChunkTokens(128256), 1024);  // Llama 3: the minimum chunk
  EXPECT_EQ(DefaultLossChunkTokens(16), int64_t{1} << 22);
  for (int64_t rows : {1000, 32128, 50257, 65536}) {
    const int64_t chunk = DefaultLossChunkTokens(rows);
    EXPECT_LE(4 * chunk * rows, kLossChunkLogitBytes) << rows;
    EXPECT_GT(4 * (chunk + 1) * rows, kLossChunkLogitBytes) << rows;
  }
}

// Peak bytes above the level before, over a head stage's forward and
// backward on `hidden` [b, s, h] with `labels`.
int64_t HeadPeakBytes(ModelStage& stage, const torch::Tensor& hidden, const torch::Tensor& labels) {
  MemoryAccount account;
  ScopedAccount scope(&account);
  StageBatch batch;
  batch.labels = labels;
  batch.labelled_positions = LabelledPositionsOf(labels);
  const torch::Tensor leaf = hidden.detach().clone().requires_grad_(true);
  const int64_t before = account.current_bytes();
  account.ResetPeak();
  {
    const StageActivations out = stage.Forward(Input(leaf), batch);
    out.loss.backward();
  }
  for (const torch::Tensor& p : stage.parameters()) p.mutable_grad() = torch::Tensor();
  return account.peak_bytes() - before;
}

// The plain head's peak on the same input: every position's logits.
int64_t PlainPeakBytes(ModelStage& stage, const ModelSpec& spec, const torch::Tensor& hidden,
                       const torch::Tensor& labels) {
  MemoryAccount account;
  ScopedAccount scope(&account);
  const torch::Tensor leaf = hidden.detach().clone().requires_grad_(true);
  const int64_t before = account.current_bytes();
  account.ResetPeak();
  PlainStageLoss(stage, spec, leaf, labels).backward();
  for (const torch::Tensor& p : stage.parameters()) p.mutable_grad() = torch::Tensor();
  return account.peak_bytes() - before;
}

TEST(LabelledHeadTest, PeakMemoryGrowsWithLabelledTokensNotAllTokens) {
  InstallCountingCpuAllocator();
  const uint32_t seed = testing::TestSeed("LabelledHeadTest.PeakMemoryGrows");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  const int64_t vocab = 16384;
  const ModelSpec spec = HeadSpec(false, vocab);
  ModelStage stage(spec, HeadOnly());
  const int64_t h = spec.hidden_size;
  const double row = 4.0 * vocab;  // one token's fp32 logits
  const auto peak = [&](int64_t b, int64_t labelled, int64_t chunk) {
    stage.set_loss_chunk_tokens(chunk);
    const torch::Tensor hidden = torch::randn({b, 512, h});
    const torch::Tensor labels = SparseLabels(b, 512, labelled, vocab, rng);
    return HeadPeakBytes(stage, hidden, labels);
  };
  constexpr double kMiB = 1 << 20;
  // The default chunk (4096 tokens here) holds every labelled token at once.
  const int64_t base = peak(4, 64, 0);          // 2048 tokens, 64 labelled
  const int64_t more_tokens = peak(8, 64, 0);   // 4096 tokens, 64 labelled
  const int64_t more_labels = peak(4, 512, 0);  // 2048 tokens, 512 labelled
  // A chunk of 64 tokens: the logits of 64 tokens at a time.
  const int64_t chunked = peak(4, 512, 64);
  const torch::Tensor hidden = torch::randn({4, 512, h});
  const torch::Tensor all_labels = SparseLabels(4, 512, 64, vocab, rng);
  const int64_t plain = PlainPeakBytes(stage, spec, hidden, all_labels);
  std::printf(
      "head peak (vocabulary %lld, hidden %lld): 2048 tokens, 64 labelled: %.2f MiB (the plain "
      "head over all 2048: %.2f MiB); 4096 tokens, 64 labelled: %.2f MiB; 2048 tokens, 512 "
      "labelled: %.2f MiB, in chunks of 64: %.2f MiB\n",
      static_cast<long long>(vocab), static_cast<long long>(h), base / kMiB, plain / kMiB,
      more_tokens / kMiB, more_labels / kMiB, chunked / kMiB);
  // 2048 more unlabelled tokens cost their hidden-sized gradient rows, not
  // logits: far less than a sixteenth of a logit row each.
  EXPECT_LT(more_tokens - base, 2048 * row / 16);
  // 448 more labelled tokens hold their logits, at least once in fp32.
  EXPECT_GE(more_labels - base, 0.9 * 448 * row);
  // In chunks of 64 they do not: the peak stays within a few chunks'
  // logits of the base.
  EXPECT_LT(chunked - base, 4 * 64 * row);
  // The plain head held every position's logits (several fp32 copies).
  EXPECT_GE(plain, 2048 * row);
  EXPECT_LT(base, plain / 8);
}

}  // namespace
}  // namespace varipipe::executor
