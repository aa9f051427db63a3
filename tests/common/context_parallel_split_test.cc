#include "common/plan_contract/context_parallel_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace varipipe {
namespace {

TEST(ContextParallelSplitTest, EachRankHoldsOneEarlyAndOneLateChunk) {
  // One sample of 8 over 2 ranks: chunks of 2; rank 0 holds chunks 0 and 3,
  // rank 1 chunks 1 and 2.
  const ContextParallelSplit r0 = *ContextParallelSplit::Of({8}, 2, 0);
  const ContextParallelSplit r1 = *ContextParallelSplit::Of({8}, 2, 1);
  EXPECT_EQ(r0.local_positions(), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(r1.local_positions(), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(r0.query_offsets(), (std::vector<int64_t>{0, 2, 4}));
  // Key prefixes [0, 2) and [0, 8); rank 1: [0, 4) and [0, 6).
  EXPECT_EQ(r0.key_offsets(), (std::vector<int64_t>{0, 2, 10}));
  EXPECT_EQ(r1.key_offsets(), (std::vector<int64_t>{0, 4, 10}));
  EXPECT_EQ(r0.all_gather_count(), 4);
  // Gathered: rank 0's positions 0,1,6,7 then rank 1's 2,3,4,5.
  EXPECT_EQ(r0.gathered_index(), (std::vector<int64_t>{0, 1, 4, 5, 6, 7, 2, 3}));
  EXPECT_EQ(r0.key_index(), (std::vector<int64_t>{0, 1, 0, 1, 4, 5, 6, 7, 2, 3}));
  // Causal score pairs: rank 0 (1 + 2) + (7 + 8), rank 1 (3 + 4) + (5 + 6).
  EXPECT_EQ(r0.causal_pairs(), 18);
  EXPECT_EQ(r1.causal_pairs(), 18);
}

TEST(ContextParallelSplitTest, RefusesBadInputNamingIt) {
  const auto zero = ContextParallelSplit::Of({4, 0}, 2, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("sample 1"), std::string::npos) << zero.status();
  EXPECT_FALSE(ContextParallelSplit::Of({4}, 0, 0).ok());
  const auto outside = ContextParallelSplit::Of({4}, 2, 2);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("index 2"), std::string::npos) << outside.status();
}

// Over random micro-batches and group sizes: the ranks' local tokens
// partition the packed tokens; positions, the all-gather's placement and
// the key prefixes agree; causal work is balanced (equal when 2c divides
// every length).
TEST(ContextParallelSplitTest, RandomSplitsPartitionAndBalance) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  for (int round = 0; round < 300; ++round) {
    const int c = 1 + static_cast<int>(rng() % 4);
    const bool divisible = rng() % 3 == 0;
    std::vector<int64_t> lengths(1 + rng() % 6);
    for (int64_t& l : lengths) {
      l = divisible ? 2 * c * (1 + static_cast<int64_t>(rng() % 20))
                    : 1 + static_cast<int64_t>(rng() % 150);
    }
    SCOPED_TRACE(testing::Message() << "round " << round << ", c " << c);
    std::vector<ContextParallelSplit> ranks;
    for (int i = 0; i < c; ++i) ranks.push_back(*ContextParallelSplit::Of(lengths, c, i));
    const int64_t total = ranks[0].total_tokens();
    const int64_t count = ranks[0].all_gather_count();
    std::vector<int> seen(total, 0);
    int64_t most = 0;
    for (int i = 0; i < c; ++i) {
      const ContextParallelSplit& r = ranks[i];
      EXPECT_EQ(r.all_gather_count(), count);
      EXPECT_EQ(r.gathered_index(), ranks[0].gathered_index());
      most = std::max(most, r.local_count());
      for (int64_t u = 0; u < r.local_count(); ++u) {
        const int64_t t = r.local_tokens()[u];
        ++seen[t];
        // Its place in the gathered buffer, and its position in its sample.
        EXPECT_EQ(r.gathered_index()[t], i * count + u);
        const int64_t s = std::upper_bound(r.sample_offsets().begin(), r.sample_offsets().end(), t) -
                          r.sample_offsets().begin() - 1;
        EXPECT_EQ(r.local_positions()[u], t - r.sample_offsets()[s]);
      }
      // Each query chunk's keys: its sample's positions [0, end), gathered.
      ASSERT_EQ(r.query_offsets().size(), r.chunks().size() + 1);
      for (size_t k = 0; k < r.chunks().size(); ++k) {
        const ContextParallelSplit::Chunk& chunk = r.chunks()[k];
        EXPECT_EQ(r.query_offsets()[k + 1] - r.query_offsets()[k], chunk.end - chunk.begin);
        ASSERT_EQ(r.key_offsets()[k + 1] - r.key_offsets()[k], chunk.end);
        for (int64_t p = 0; p < chunk.end; ++p) {
          EXPECT_EQ(r.key_index()[r.key_offsets()[k] + p],
                    r.gathered_index()[r.sample_offsets()[chunk.sample] + p]);
        }
      }
    }
    EXPECT_EQ(most, count);
    for (int64_t t = 0; t < total; ++t) ASSERT_EQ(seen[t], 1) << "packed token " << t;
    int64_t low = ranks[0].causal_pairs();
    int64_t high = low;
    int64_t all_pairs = 0;
    for (const ContextParallelSplit& r : ranks) {
      low = std::min(low, r.causal_pairs());
      high = std::max(high, r.causal_pairs());
      all_pairs += r.causal_pairs();
    }
    int64_t expected_pairs = 0;
    for (const int64_t l : lengths) expected_pairs += l * (l + 1) / 2;
    EXPECT_EQ(all_pairs, expected_pairs);
    if (divisible) {
      EXPECT_EQ(low, high);
    } else {
      // Chunks differ by at most one position: a rank's work by at most
      // two of its sample's rows per chunk pair.
      int64_t slack = 0;
      for (const int64_t l : lengths) slack += 2 * l;
      EXPECT_LE(high - low, slack);
    }
  }
}

}  // namespace
}  // namespace varipipe
