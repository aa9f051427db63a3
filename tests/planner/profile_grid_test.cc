#include "planner/cost/profile_grid.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A value that is monotone in every coordinate and not multilinear.
CostValues Formula(double b, double s, double e) {
  return {b * s * 0.01 + e * 0.001 + 1, 2 * b * s * 0.01 + 2, b * s * s * 3 + e, b * s * s * 5 + e};
}

ProfileGrid MakeGrid(bool three_d) {
  std::vector<uint32_t> b = {1, 2, 4, 8};
  std::vector<uint32_t> s = {16, 32, 64, 128};
  std::vector<uint32_t> e = three_d ? std::vector<uint32_t>{16, 64} : std::vector<uint32_t>{};
  std::vector<CostValues> values;
  for (uint32_t bb : b) {
    for (uint32_t ee : three_d ? e : std::vector<uint32_t>{0}) {
      for (uint32_t ss : s) values.push_back(Formula(bb, ss, ee));
    }
  }
  absl::StatusOr<ProfileGrid> grid = ProfileGrid::Create(b, s, e, values, "test grid");
  EXPECT_THAT(grid, IsOk());
  return *std::move(grid);
}

TEST(ProfileGrid, ReproducesGridPointsExactly) {
  for (bool three_d : {false, true}) {
    const ProfileGrid grid = MakeGrid(three_d);
    for (uint32_t b : grid.micro_batch_sizes()) {
      for (uint32_t s : grid.seq_lens()) {
        for (uint32_t e : three_d ? grid.encoder_seq_lens() : std::vector<uint32_t>{0}) {
          CostValues v;
          ASSERT_TRUE(grid.Lookup(b, s, e, &v));
          EXPECT_EQ(v, Formula(b, s, e)) << b << " " << s << " " << e;
        }
      }
    }
  }
}

TEST(ProfileGrid, InterpolatesLinearlyBetweenPoints) {
  const ProfileGrid grid = MakeGrid(false);
  CostValues v;
  ASSERT_TRUE(grid.Lookup(3, 16, &v));  // halfway between b = 2 and 4
  const CostValues lo = Formula(2, 16, 0);
  const CostValues hi = Formula(4, 16, 0);
  EXPECT_DOUBLE_EQ(v.forward_ms, (lo.forward_ms + hi.forward_ms) / 2);
  EXPECT_DOUBLE_EQ(v.stored_bytes, (lo.stored_bytes + hi.stored_bytes) / 2);
}

TEST(ProfileGrid, BeyondTheLargestPointIsInfeasible) {
  const ProfileGrid grid = MakeGrid(true);
  CostValues v;
  EXPECT_FALSE(grid.Lookup(9, 16, 16, &v));
  EXPECT_FALSE(grid.Lookup(1, 129, 16, &v));
  EXPECT_FALSE(grid.Lookup(1, 16, 65, &v));
  EXPECT_TRUE(grid.Lookup(8, 128, 64, &v));
}

TEST(ProfileGrid, BelowTheSmallestPointClampsUpwards) {
  const ProfileGrid grid = MakeGrid(false);
  CostValues at_min;
  CostValues below;
  ASSERT_TRUE(grid.Lookup(1, 16, &at_min));
  ASSERT_TRUE(grid.Lookup(1, 8, &below));
  EXPECT_EQ(below, at_min);
}

// Interpolation keeps the order of a monotone grid (randomized).
TEST(ProfileGrid, MonotoneWhereTheGridIs) {
  const ProfileGrid grid = MakeGrid(true);
  std::mt19937 rng(varipipe::testing::TestSeed("ProfileGrid.MonotoneWhereTheGridIs"));
  std::uniform_real_distribution<double> b(1, 8), s(16, 128), e(16, 64), step(0, 10);
  for (int i = 0; i < 10000; ++i) {
    const double b0 = b(rng), s0 = s(rng), e0 = e(rng);
    const double b1 = std::min(8.0, b0 + step(rng)), s1 = std::min(128.0, s0 + step(rng));
    const double e1 = std::min(64.0, e0 + step(rng));
    CostValues lo, hi;
    ASSERT_TRUE(grid.Lookup(b0, s0, e0, &lo));
    ASSERT_TRUE(grid.Lookup(b1, s1, e1, &hi));
    EXPECT_LE(lo.forward_ms, hi.forward_ms + 1e-9);
    EXPECT_LE(lo.backward_ms, hi.backward_ms + 1e-9);
    EXPECT_LE(lo.stored_bytes, hi.stored_bytes + 1e-6);
    EXPECT_LE(lo.peak_bytes, hi.peak_bytes + 1e-6);
  }
}

TEST(ProfileGrid, BatchRowMatchesLookup) {
  const ProfileGrid grid = MakeGrid(true);
  ProfileGrid::BatchRow row;
  ASSERT_TRUE(grid.Row(40, 30, &row));
  for (double b : {1.0, 1.5, 3.0, 7.9, 8.0}) {
    CostValues direct, via_row;
    ASSERT_TRUE(grid.Lookup(b, 40, 30, &direct));
    ASSERT_TRUE(row.Lookup(b, &via_row));
    EXPECT_NEAR(direct.forward_ms, via_row.forward_ms, 1e-9 * direct.forward_ms);
    EXPECT_NEAR(direct.peak_bytes, via_row.peak_bytes, 1e-9 * direct.peak_bytes);
  }
  EXPECT_FALSE(grid.Row(200, 30, &row));
}

TEST(ProfileGrid, InfeasiblePointsBlockOnlyWhatNeedsThem) {
  std::vector<CostValues> values(4, CostValues{1, 2, 3, 4});
  values[3] = {kInf, kInf, kInf, kInf};  // b = 2, s = 32 ran out of memory
  absl::StatusOr<ProfileGrid> grid = ProfileGrid::Create({1, 2}, {16, 32}, {}, values, "oom");
  ASSERT_THAT(grid, IsOk());
  CostValues v;
  EXPECT_TRUE(grid->Lookup(2, 16, &v));
  EXPECT_TRUE(grid->Lookup(1, 32, &v));
  EXPECT_FALSE(grid->Lookup(2, 32, &v));
  EXPECT_FALSE(grid->Lookup(1.5, 24, &v));
  ProfileGrid::BatchRow row;
  ASSERT_TRUE(grid->Row(32, 0, &row));
  EXPECT_TRUE(row.Lookup(1, &v));
  EXPECT_FALSE(row.Lookup(1.5, &v));
}

TEST(ProfileGrid, RejectsBadInput) {
  const CostValues ok{1, 1, 1, 1};
  EXPECT_THAT(ProfileGrid::Create({2, 1}, {16}, {}, {ok, ok}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("strictly increasing")));
  EXPECT_THAT(ProfileGrid::Create({1}, {16}, {}, {ok, ok}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 values for a grid of 1")));
  EXPECT_THAT(ProfileGrid::Create({1}, {16}, {}, {{std::nan(""), 1, 1, 1}}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zero or positive")));
  EXPECT_THAT(ProfileGrid::Create({1}, {16}, {}, {{-1, 1, 1, 1}}, "my grid"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("my grid")));
  EXPECT_THAT(ProfileGrid::Create({1}, {16}, {}, {{1, 1, 5, 4}}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds peak")));
  EXPECT_THAT(ProfileGrid::Create({0}, {16}, {}, {ok}, "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
}

}  // namespace
}  // namespace varipipe::planner
