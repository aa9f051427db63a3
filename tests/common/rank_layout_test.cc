// The rank layout every planner plan and executor group follows.
#include "common/config/rank_layout.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace varipipe {
namespace {

TEST(RankLayout, EveryRankHasOneCoordinatePairAndBack) {
  for (uint32_t pipeline : {1u, 2u, 3u, 8u}) {
    for (uint32_t data : {1u, 2u, 5u}) {
      v1::ParallelismConfig config;
      config.set_pipeline(pipeline);
      config.set_data(data);
      const RankLayout layout = RankLayout::Of(config);
      ASSERT_EQ(layout.world_size(), static_cast<int>(pipeline * data));
      std::set<int> seen;
      for (uint32_t d = 0; d < data; ++d) {
        for (uint32_t p = 0; p < pipeline; ++p) {
          const int rank = layout.Rank(d, p);
          EXPECT_TRUE(seen.insert(rank).second) << "rank " << rank << " twice";
          EXPECT_EQ(layout.DpRank(rank), d);
          EXPECT_EQ(layout.PpRank(rank), p);
        }
      }
      EXPECT_EQ(*seen.rbegin(), layout.world_size() - 1);
    }
  }
}

TEST(RankLayout, GroupsAreAReplicasPipelineAndAStagesReplicas) {
  const RankLayout layout{.pipeline = 4, .data = 3};
  // One replica's stages are consecutive ranks (one node when
  // devices_per_node is a multiple of the pipeline degree).
  EXPECT_EQ(layout.PipelineGroup(1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(layout.DataParallelGroup(2), (std::vector<int>{2, 6, 10}));
}

TEST(RankLayout, UnsetDegreesAreOne) {
  const RankLayout layout = RankLayout::Of(v1::ParallelismConfig());
  EXPECT_EQ(layout.world_size(), 1);
  EXPECT_EQ(layout.PipelineGroup(0), (std::vector<int>{0}));
}

}  // namespace
}  // namespace varipipe
