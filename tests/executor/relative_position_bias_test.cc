// T5's relative position buckets and bias (executor/model/relative_position_bias.h):
// the buckets Hugging Face's _relative_position_bucket gives for T5 v1.1's
// 32 buckets and distance 128 (values away from rounding boundaries, worked
// out by hand from the formula in docs/models.md), the invariants over every
// distance, and the bias's layout.
#include "executor/model/relative_position_bias.h"

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace varipipe::executor {
namespace {

// Bucket of key position `key` for query position 0.
int64_t Bucket(int64_t key, bool bidirectional, int64_t buckets = 32, int64_t distance = 128) {
  const torch::Tensor query = torch::zeros({1, 1}, torch::kInt64);
  const torch::Tensor keys = torch::full({1, 1}, key, torch::kInt64);
  return RelativePositionBuckets(query, keys, bidirectional, buckets, distance).item<int64_t>();
}

TEST(RelativePositionBucketsTest, MatchHuggingFaceForT5V11) {
  // Encoder (bidirectional): 16 buckets per direction, exact below 8.
  const std::vector<std::pair<int64_t, int64_t>> encoder = {
      {0, 0},   {-1, 1},    {-7, 7},   {1, 17},    {7, 23},   {-20, 10},
      {20, 26}, {-100, 15}, {100, 31}, {-500, 15}, {500, 31}, {-60, 13}};
  for (const auto& [relative, bucket] : encoder) {
    EXPECT_EQ(Bucket(relative, true), bucket) << "relative position " << relative;
  }
  // Decoder (causal): later keys share bucket 0, exact below 16.
  const std::vector<std::pair<int64_t, int64_t>> decoder = {{5, 0},     {0, 0},     {-5, 5},
                                                            {-15, 15},  {-16, 16},  {-40, 23},
                                                            {-100, 30}, {-127, 31}, {-1000, 31}};
  for (const auto& [relative, bucket] : decoder) {
    EXPECT_EQ(Bucket(relative, false), bucket) << "relative position " << relative;
  }
}

TEST(RelativePositionBucketsTest, ExactNearLogFarClippedBeyondTheDistance) {
  for (const auto& [buckets, distance] : {std::pair<int64_t, int64_t>{32, 128}, {8, 20}, {4, 3}}) {
    for (bool bidirectional : {true, false}) {
      const int64_t half = bidirectional ? buckets / 2 : buckets;
      const int64_t exact = half / 2;
      // Query at position 300 of 601, every key.
      const torch::Tensor query = torch::full({1, 1}, 300, torch::kInt64);
      const torch::Tensor keys = torch::arange(601, torch::kInt64).unsqueeze(0);
      const torch::Tensor b =
          RelativePositionBuckets(query, keys, bidirectional, buckets, distance).reshape({-1});
      int64_t previous_before = -1;
      int64_t previous_after = -1;
      for (int64_t u = 0; u <= 300; ++u) {
        const int64_t before = b[300 - u].item<int64_t>();  // key u positions earlier
        const int64_t after = b[300 + u].item<int64_t>();   // key u positions later
        SCOPED_TRACE(::testing::Message()
                     << buckets << " buckets, distance " << distance
                     << (bidirectional ? ", bidirectional" : ", causal") << ", |r| = " << u);
        ASSERT_GE(before, 0);
        ASSERT_LT(before, half);
        if (u < exact) EXPECT_EQ(before, u);
        if (u >= distance) EXPECT_EQ(before, half - 1);
        EXPECT_GE(before, previous_before);  // non-decreasing with the distance
        previous_before = before;
        if (bidirectional) {
          ASSERT_LT(after, buckets);
          EXPECT_EQ(after, u == 0 ? 0 : half + before);  // the mirror image, upper half
          EXPECT_GE(after, previous_after);
          previous_after = after;
        } else {
          EXPECT_EQ(after, 0);  // the decoder cannot see later keys
        }
      }
    }
  }
}

TEST(RelativePositionBiasTest, EachHeadReadsItsColumnForThePairsBucket) {
  const int64_t buckets = 8;
  const int64_t heads = 3;
  const torch::Tensor table = torch::randn({buckets, heads});
  // Two packed rows: positions restart per sample.
  const torch::Tensor positions = torch::tensor({0, 1, 2, 0, 1, 0, 1, 2, 3, 4}).reshape({2, 5});
  const torch::Tensor b = RelativePositionBuckets(positions, positions, true, buckets, 20);
  ASSERT_EQ(b.sizes().vec(), (std::vector<int64_t>{2, 5, 5}));
  const torch::Tensor bias = RelativePositionBias(table, b);
  ASSERT_EQ(bias.sizes().vec(), (std::vector<int64_t>{2, heads, 5, 5}));
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < 5; ++i) {
        for (int64_t j = 0; j < 5; ++j) {
          const int64_t expected_bucket =
              Bucket(positions[row][j].item<int64_t>() - positions[row][i].item<int64_t>(), true,
                     buckets, 20);
          EXPECT_EQ(b[row][i][j].item<int64_t>(), expected_bucket);
          EXPECT_EQ(bias[row][h][i][j].item<float>(), table[expected_bucket][h].item<float>());
        }
      }
    }
  }
}

}  // namespace
}  // namespace varipipe::executor
