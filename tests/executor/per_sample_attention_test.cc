// Per-sample attention for packed rows (the variable-length kernel,
// attention_mask.h): the same values and gradients as the dense
// block-diagonal mask at every real position, for causal self-attention
// (GPT, T5 decoder), full self-attention (T5 encoder), cross-attention and
// a T5V11 score bias; and a smaller activation peak, measured by the
// counting allocator on a packed GPT stage.
#include <cstdio>
#include <random>
#include <vector>

#include "executor/model/attention_mask.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/counting_allocator.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace varipipe::executor {
namespace {

constexpr int64_t kHeads = 2;
constexpr int64_t kWidth = kHeads * 4;

// Rows of back-to-back samples of the given lengths, padded to `padded`:
// each position's sample (-1 for padding), as StageBatch's segments.
torch::Tensor Segments(const std::vector<std::vector<int64_t>>& rows, int64_t padded) {
  torch::Tensor segments = torch::full({static_cast<int64_t>(rows.size()), padded}, -1,
                                       torch::TensorOptions().dtype(torch::kInt64));
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t position = 0;
    for (size_t s = 0; s < rows[r].size(); ++s) {
      segments.index_put_(
          {static_cast<int64_t>(r), torch::indexing::Slice(position, position + rows[r][s])},
          static_cast<int64_t>(s));
      position += rows[r][s];
    }
  }
  return segments;
}

// Real-position outputs and the gradients of q, k, v (and the bias) of a
// loss over real queries only.
struct Result {
  torch::Tensor out, dq, dk, dv, dbias;
};

Result Attend(const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0,
              const torch::Tensor& bias0, const torch::Tensor& real_queries, bool per_sample,
              const torch::Tensor& query_segments, const torch::Tensor& key_segments, bool causal,
              bool self) {
  torch::Tensor q = q0.clone().requires_grad_(true);
  torch::Tensor k = k0.clone().requires_grad_(true);
  torch::Tensor v = v0.clone().requires_grad_(true);
  torch::Tensor bias = bias0.defined() ? bias0.clone().requires_grad_(true) : torch::Tensor();
  const bool scaled = !bias.defined();
  const AttentionCore core = [&](const torch::Tensor& cq, const torch::Tensor& ck,
                                 const torch::Tensor& cv, const AttentionInput& input) {
    return MaskedAttention(cq, ck, cv, input.is_causal() ? torch::Tensor() : input.mask(), kHeads,
                           input.bias(), scaled);
  };
  torch::Tensor out;
  if (per_sample) {
    out = PerSampleAttention(
        q, k, v, *VariableLengthLayout::FromSegments(query_segments, key_segments, causal), bias,
        core);
  } else {
    const torch::Tensor mask = self ? SegmentSelfAttentionMask(query_segments, causal)
                                    : SegmentCrossAttentionMask(query_segments, key_segments);
    out = core(q, k, v, AttentionInput::DenseMask(mask).WithBias(bias));
  }
  const torch::Tensor real = out * real_queries.unsqueeze(-1);
  torch::Tensor weights = torch::arange(real.numel(), torch::kFloat32).reshape(real.sizes());
  (real * torch::sin(weights)).sum().backward();
  return {real.detach(), q.grad(), k.grad(), v.grad(),
          bias.defined() ? bias.grad() : torch::Tensor()};
}

void ExpectSame(const Result& a, const Result& b, const char* what) {
  EXPECT_TRUE(torch::allclose(a.out, b.out, 1e-5, 1e-5)) << what << " outputs";
  EXPECT_TRUE(torch::allclose(a.dq, b.dq, 1e-5, 1e-5)) << what << " dq";
  EXPECT_TRUE(torch::allclose(a.dk, b.dk, 1e-5, 1e-5)) << what << " dk";
  EXPECT_TRUE(torch::allclose(a.dv, b.dv, 1e-5, 1e-5)) << what << " dv";
  if (a.dbias.defined()) {
    EXPECT_TRUE(torch::allclose(a.dbias, b.dbias, 1e-5, 1e-5)) << what << " dbias";
  }
}

TEST(PerSampleAttention, MatchesTheBlockDiagonalMaskAtRealPositions) {
  const uint32_t seed =
      varipipe::testing::TestSeed("PerSampleAttention.MatchesTheBlockDiagonalMaskAtRealPositions");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  for (int trial = 0; trial < 6; ++trial) {
    // Two rows of 1-4 samples each, padded to 24 positions (targets: to 10).
    std::vector<std::vector<int64_t>> inputs(2), targets(2);
    for (int r = 0; r < 2; ++r) {
      int64_t used = 0;
      int64_t used_targets = 0;
      const int samples = 1 + static_cast<int>(rng() % 4);
      for (int s = 0; s < samples; ++s) {
        const int64_t length = 1 + static_cast<int64_t>(rng() % 6);
        const int64_t target = 1 + static_cast<int64_t>(rng() % 2);
        inputs[r].push_back(length);
        targets[r].push_back(target);
        used += length;
        used_targets += target;
      }
      ASSERT_LE(used, 24);
      ASSERT_LE(used_targets, 10);
    }
    const torch::Tensor in_segments = Segments(inputs, 24);
    const torch::Tensor out_segments = Segments(targets, 10);
    const torch::Tensor q = torch::randn({2, 24, kWidth});
    const torch::Tensor k = torch::randn({2, 24, kWidth});
    const torch::Tensor v = torch::randn({2, 24, kWidth});
    const torch::Tensor real = (in_segments >= 0).to(torch::kFloat32);
    for (bool causal : {true, false}) {
      ExpectSame(Attend(q, k, v, {}, real, true, in_segments, in_segments, causal, true),
                 Attend(q, k, v, {}, real, false, in_segments, in_segments, causal, true),
                 causal ? "causal self-attention" : "self-attention");
    }
    // A T5V11 bias, one per row or one shared, unscaled scores.
    for (int64_t rows : {2, 1}) {
      const torch::Tensor bias = torch::randn({rows, kHeads, 24, 24});
      ExpectSame(Attend(q, k, v, bias, real, true, in_segments, in_segments, false, true),
                 Attend(q, k, v, bias, real, false, in_segments, in_segments, false, true),
                 "biased self-attention");
    }
    // Cross-attention: 10 decoder queries to the 24 encoder positions.
    const torch::Tensor dq = torch::randn({2, 10, kWidth});
    const torch::Tensor real_targets = (out_segments >= 0).to(torch::kFloat32);
    ExpectSame(Attend(dq, k, v, {}, real_targets, true, out_segments, in_segments, false, false),
               Attend(dq, k, v, {}, real_targets, false, out_segments, in_segments, false, false),
               "cross-attention");
  }
}

TEST(PerSampleAttention, RefusesSamplesThatAreNotContiguous) {
  torch::Tensor segments = torch::tensor({0, 0, 1, 0, -1}, torch::kInt64).unsqueeze(0);
  const torch::Tensor x = torch::randn({1, 5, kWidth});
  const AttentionCore core = [](const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const AttentionInput& input) {
    return MaskedAttention(q, k, v, {}, kHeads, input.bias());
  };
  EXPECT_THROW(
      PerSampleAttention(x, x, x, *VariableLengthLayout::FromSegments(segments, segments, true), {},
                         core),
      c10::Error);
}

// A packed GPT stage (one row of 512 positions holding samples of 16 to 160
// tokens): the activation peak of its forward, graph kept for backward,
// under per-sample attention and under the block-diagonal mask.
int64_t PackedForwardPeak(bool per_sample) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = 50;
  spec.max_sequence_length = 512;
  spec.seed = 3;
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(spec, 1);
  EXPECT_TRUE(roles.ok()) << roles.status();
  ModelStage stage(spec, roles->front());
  const std::vector<int64_t> lengths = {160, 16, 96, 40, 120, 64, 16};  // 512 in all
  StageBatch batch;
  batch.input_tokens = torch::randint(0, 50, {1, 512}, torch::kInt64);
  batch.input_lengths = torch::tensor({int64_t{512}});
  batch.input_segments = Segments({lengths}, 512);
  batch.per_sample_attention = per_sample;
  std::vector<int64_t> positions;
  for (int64_t length : lengths) {
    for (int64_t i = 0; i < length; ++i) positions.push_back(i);
  }
  batch.input_positions = torch::tensor(positions).unsqueeze(0);
  batch.labels = torch::randint(0, 50, {1, 512}, torch::kInt64);
  MemoryAccount account;
  int64_t peak = 0;
  {
    ScopedAccount scope(&account);
    account.ResetPeak();
    const int64_t before = account.current_bytes();
    StageActivations out = stage.Forward({}, batch);
    peak = account.peak_bytes() - before;
    out.loss.backward();
  }
  return peak;
}

TEST(PerSampleAttention, PackedStageNeedsLessActivationMemoryThanTheMask) {
  InstallCountingCpuAllocator();
  const int64_t per_sample = PackedForwardPeak(true);
  const int64_t mask = PackedForwardPeak(false);
  std::printf(
      "packed GPT stage, one 512-token row of 7 samples: activation peak %.2f MiB "
      "per sample, %.2f MiB under the block-diagonal mask\n",
      per_sample / 1048576.0, mask / 1048576.0);
  EXPECT_LT(per_sample, mask);
}

}  // namespace
}  // namespace varipipe::executor
