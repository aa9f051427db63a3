// Context-parallel attention over a real group: c ranks as threads, each
// with its own Gloo transport over loopback TCP, all-gathering their local
// keys and values (AllGatherContext) and reduce-scattering their gradients;
// together they must equal each sample's whole causal attention, outputs
// and gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "executor/model/context_parallel_attention.h"
#include "tests/testing/whole_sample_attention.h"
#include "executor/model/tensor_group.h"
#include "tests/testing/gloo_rank.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::varipipe::testing::WholeSampleAttention;

using ::varipipe::testing::IsOk;


class ContextParallelGatherTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  std::unique_ptr<RedisServer> redis_;
};

TEST_P(ContextParallelGatherTest, RanksOverGlooEqualWholeSamples) {
  const int c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", c " << c);
  std::mt19937 rng(seed);
  std::vector<int64_t> lengths(2 + rng() % 3);
  for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 37);
  const int64_t heads = 2;
  const int64_t d = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  int64_t total = 0;
  for (const int64_t l : lengths) total += l;
  torch::manual_seed(seed);
  // fp32: the transports' collectives move fp32.
  const torch::Tensor q = torch::randn({total, heads, d});
  const torch::Tensor k = torch::randn({total, heads, d});
  const torch::Tensor v = torch::randn({total, heads, d});
  const torch::Tensor weight = torch::randn({total, heads, d});

  struct RankResult {
    torch::Tensor out, grad_q, grad_k, grad_v;  // packed, zero where not this rank's
    std::string error;
  };
  std::vector<RankResult> results(c);
  std::vector<std::thread> threads;
  for (int r = 0; r < c; ++r) {
    threads.emplace_back([&, r] {
      RankResult& result = results[r];
      absl::StatusOr<std::unique_ptr<GlooTransport>> transport =
          ::varipipe::testing::ConnectGlooRank(*redis_, absl::StrCat("cp/", c), r, c);
      if (!transport.ok()) {
        result.error = transport.status().ToString();
        return;
      }
      TensorGroup group(r, c, /*sequence_parallel=*/false);
      group.set_transport(transport->get());
      try {
        const ContextParallelSplit split = *ContextParallelSplit::Of(lengths, c, r);
        const ContextParallelIndex index = ContextParallelIndex::Of(split, torch::kCPU);
        // This rank's tokens only: its leaves.
        const torch::Tensor q_local = q.index_select(0, index.local_tokens).requires_grad_();
        const torch::Tensor k_local = k.index_select(0, index.local_tokens).requires_grad_();
        const torch::Tensor v_local = v.index_select(0, index.local_tokens).requires_grad_();
        const torch::Tensor k_all = AllGatherContext(k_local, split, &group);
        const torch::Tensor v_all = AllGatherContext(v_local, split, &group);
        const torch::Tensor out = ReferenceContextParallelAttention(
            q_local, GatherKeyPrefixes(k_all, index), GatherKeyPrefixes(v_all, index), split,
            scale);
        (out * weight.index_select(0, index.local_tokens)).sum().backward();
        const auto packed = [&](const torch::Tensor& x) {
          return torch::zeros({total, heads, d}).index_copy(0, index.local_tokens, x.detach());
        };
        result.out = packed(out);
        result.grad_q = packed(q_local.grad());
        result.grad_k = packed(k_local.grad());
        result.grad_v = packed(v_local.grad());
      } catch (const std::exception& e) {
        result.error = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  torch::Tensor out = torch::zeros({total, heads, d});
  torch::Tensor grads[3] = {torch::zeros_like(out), torch::zeros_like(out), torch::zeros_like(out)};
  for (int r = 0; r < c; ++r) {
    ASSERT_EQ(results[r].error, "") << "rank " << r;
    out += results[r].out;
    grads[0] += results[r].grad_q;
    grads[1] += results[r].grad_k;
    grads[2] += results[r].grad_v;
  }
  const torch::Tensor q_leaf = q.clone().requires_grad_();
  const torch::Tensor k_leaf = k.clone().requires_grad_();
  const torch::Tensor v_leaf = v.clone().requires_grad_();
  std::vector<int64_t> offsets{0};
  for (const int64_t l : lengths) offsets.push_back(offsets.back() + l);
  const torch::Tensor whole = WholeSampleAttention(q_leaf, k_leaf, v_leaf, offsets, scale);
  const auto expected = torch::autograd::grad({(whole * weight).sum()}, {q_leaf, k_leaf, v_leaf});
  EXPECT_TRUE(torch::allclose(out, whole.detach(), 1e-5, 1e-5))
      << (out - whole).abs().max().item<double>();
  const char* names[] = {"q", "k", "v"};
  for (int g = 0; g < 3; ++g) {
    EXPECT_TRUE(torch::allclose(grads[g], expected[g], 1e-4, 1e-5))
        << names[g] << " gradient differs by "
        << (grads[g] - expected[g]).abs().max().item<double>();
  }
}

// TensorGroup::AllGather sends 2-byte elements as they are, two per word of
// the transport's fp32 collective: every bit pattern (NaNs with payloads,
// subnormals, -0) arrives unchanged, whatever the other element of its word
// holds; a slot of an odd number of elements goes as an fp32 copy.
TEST_P(ContextParallelGatherTest, TwoByteElementsArriveBitForBit) {
  const int c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", c " << c);
  torch::manual_seed(seed);
  std::vector<torch::Tensor> pairs(c), odd(c);
  for (int r = 0; r < c; ++r) {
    // Random 16-bit patterns: every kind of bf16 and fp16 value.
    pairs[r] = torch::randint(-32768, 32768, {6, 3}, torch::kInt16);
    odd[r] = torch::randn({3}).to(torch::kBFloat16);
  }
  std::vector<std::string> errors(c);
  std::vector<std::vector<torch::Tensor>> gathered(c);
  std::vector<std::thread> threads;
  for (int r = 0; r < c; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<GlooTransport>> transport =
          ::varipipe::testing::ConnectGlooRank(*redis_, absl::StrCat("bits/", c), r, c);
      if (!transport.ok()) {
        errors[r] = transport.status().ToString();
        return;
      }
      TensorGroup group(r, c, /*sequence_parallel=*/false);
      group.set_transport(transport->get());
      try {
        for (const auto dtype : {torch::kBFloat16, torch::kFloat16}) {
          gathered[r].push_back(group.AllGather(pairs[r].view(dtype), 0).view(torch::kInt16));
        }
        gathered[r].push_back(group.AllGather(odd[r], 0));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const torch::Tensor expected_bits = torch::cat(pairs, 0);
  const torch::Tensor expected_odd = torch::cat(odd, 0);
  for (int r = 0; r < c; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(gathered[r].size(), 3u);
    EXPECT_TRUE(torch::equal(gathered[r][0], expected_bits)) << "bf16 on rank " << r;
    EXPECT_TRUE(torch::equal(gathered[r][1], expected_bits)) << "fp16 on rank " << r;
    EXPECT_EQ(gathered[r][2].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(gathered[r][2], expected_odd)) << "odd slot on rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, ContextParallelGatherTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("cp", info.param);
                         });

}  // namespace
}  // namespace varipipe::executor
