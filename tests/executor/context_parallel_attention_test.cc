#include "executor/model/context_parallel_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/testing/whole_sample_attention.h"

namespace varipipe::executor {
namespace {

using ::varipipe::testing::WholeSampleAttention;


// The group's ranks in one process: each rank's local keys padded to the
// all-gather count and laid rank after rank, as the all-gather returns them
// (its backward, a reduce-scatter, sums each slot's gradients over the
// ranks, as autograd does here).
torch::Tensor Gathered(const torch::Tensor& x, const std::vector<ContextParallelSplit>& ranks,
                       const std::vector<ContextParallelIndex>& index) {
  std::vector<torch::Tensor> parts;
  const int64_t count = ranks[0].all_gather_count();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const torch::Tensor local = x.index_select(0, index[r].local_tokens);
    parts.push_back(torch::constant_pad_nd(local, {0, 0, 0, 0, 0, count - local.size(0)}));
  }
  return torch::cat(parts, 0);
}

// One group of c ranks over samples of `lengths`: q [tokens, heads, d],
// k and v [tokens, kv_heads, d]. The ranks' outputs together equal whole
// samples' attention over the key/value heads repeated for their query
// heads (query head i reads key/value head i / (heads / kv_heads)), and so
// do the gradients of q, k and v. The lanes gather the kv_heads heads.
void ExpectRanksEqualWholeSamples(const std::vector<int64_t>& lengths, int c, int64_t heads,
                                  int64_t kv_heads) {
  const int64_t d = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<ContextParallelSplit> ranks;
  std::vector<ContextParallelIndex> index;
  for (int i = 0; i < c; ++i) {
    ranks.push_back(*ContextParallelSplit::Of(lengths, c, i));
    index.push_back(ContextParallelIndex::Of(ranks.back(), torch::kCPU));
  }
  const int64_t total = ranks[0].total_tokens();
  const auto options = torch::TensorOptions().dtype(torch::kDouble);
  const torch::Tensor q = torch::randn({total, heads, d}, options).requires_grad_();
  const torch::Tensor k = torch::randn({total, kv_heads, d}, options).requires_grad_();
  const torch::Tensor v = torch::randn({total, kv_heads, d}, options).requires_grad_();
  const torch::Tensor weight = torch::randn({total, heads, d}, options);
  const int64_t group = heads / kv_heads;
  const torch::Tensor whole =
      WholeSampleAttention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                           ranks[0].sample_offsets(), scale);
  const auto whole_grads = torch::autograd::grad({(whole * weight).sum()}, {q, k, v});

  const torch::Tensor k_gathered = Gathered(k, ranks, index);
  const torch::Tensor v_gathered = Gathered(v, ranks, index);
  // The gathered buffer holds every packed token where gathered_index says,
  // with the key/value heads alone.
  EXPECT_TRUE(torch::equal(k_gathered.index_select(0, index[0].gathered_index), k));
  EXPECT_EQ(k_gathered.size(1), kv_heads);
  torch::Tensor split_out = torch::zeros({total, heads, d}, options);
  for (int i = 0; i < c; ++i) {
    const torch::Tensor out = ReferenceContextParallelAttention(
        q.index_select(0, index[i].local_tokens), GatherKeyPrefixes(k_gathered, index[i]),
        GatherKeyPrefixes(v_gathered, index[i]), ranks[i], scale);
    split_out = split_out.index_add(0, index[i].local_tokens, out);
  }
  const auto split_grads = torch::autograd::grad({(split_out * weight).sum()}, {q, k, v});
  // fp32 inside the attention: fp32 tolerances.
  EXPECT_TRUE(torch::allclose(split_out, whole, 1e-5, 1e-5))
      << (split_out - whole).abs().max().item<double>();
  const char* names[] = {"q", "k", "v"};
  for (int g = 0; g < 3; ++g) {
    EXPECT_TRUE(torch::allclose(split_grads[g], whole_grads[g], 1e-4, 1e-5))
        << names[g] << " gradient differs by "
        << (split_grads[g] - whole_grads[g]).abs().max().item<double>();
  }
}

TEST(ContextParallelAttentionTest, RanksTogetherEqualWholeSamplesWithGradients) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  for (int round = 0; round < 12; ++round) {
    const int c = round % 2 == 0 ? 2 : 4;
    std::vector<int64_t> lengths(1 + rng() % 4);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 40);
    SCOPED_TRACE(::testing::Message() << "round " << round << ", c " << c);
    ExpectRanksEqualWholeSamples(lengths, c, /*heads=*/2, /*kv_heads=*/2);
  }
}

// Grouped-query attention: the lanes gather the key/value heads
// themselves ([tokens, kv_heads, d], not their repeats), and the core
// repeats each for its query heads.
TEST(ContextParallelAttentionTest, GroupedQueryHeadsAreGatheredOnceAndRepeatedInTheCore) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  for (int round = 0; round < 6; ++round) {
    const int c = round % 2 == 0 ? 2 : 4;
    const int64_t kv_heads = round % 3 == 0 ? 1 : 2;
    std::vector<int64_t> lengths(1 + rng() % 3);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 30);
    SCOPED_TRACE(::testing::Message() << "round " << round << ", c " << c << ", kv heads "
                                      << kv_heads);
    ExpectRanksEqualWholeSamples(lengths, c, /*heads=*/4, kv_heads);
  }
}

}  // namespace
}  // namespace varipipe::executor
