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

// Tensor innermost: a pipeline rank's tensor group is consecutive global
// ranks, and every global rank has one (pipeline rank, tensor index).
TEST(RankLayout, TensorRanksAreInnermost) {
  v1::ParallelismConfig config;
  config.set_pipeline(2);
  config.set_data(3);
  config.set_tensor(4);
  const RankLayout layout = RankLayout::Of(config);
  EXPECT_EQ(layout.world_size(), 24);
  EXPECT_EQ(layout.pipeline_ranks(), 6);
  EXPECT_EQ(layout.TensorGroup(3), (std::vector<int>{12, 13, 14, 15}));
  std::set<int> seen;
  for (int p = 0; p < layout.pipeline_ranks(); ++p) {
    for (uint32_t i = 0; i < layout.tensor; ++i) {
      const int global = layout.GlobalRank(p, i);
      EXPECT_TRUE(seen.insert(global).second) << "rank " << global << " twice";
      EXPECT_EQ(layout.PipelineRankOf(global), p);
      EXPECT_EQ(layout.TensorIndex(global), i);
    }
  }
  EXPECT_EQ(*seen.rbegin(), layout.world_size() - 1);
  // Plans still name pipeline ranks: replica 1's pipeline is 2, 3.
  EXPECT_EQ(layout.PipelineGroup(1), (std::vector<int>{2, 3}));
}

// Context between tensor and pipeline: a context group's lanes are
// consecutive plan ranks, and the gradient group spans replicas and lanes.
TEST(RankLayout, ContextRanksSitBetweenTensorAndPipeline) {
  for (uint32_t pipeline : {1u, 2u, 3u}) {
    for (uint32_t data : {1u, 2u}) {
      for (uint32_t context : {1u, 2u, 4u}) {
        v1::ParallelismConfig config;
        config.set_pipeline(pipeline);
        config.set_data(data);
        config.set_context(context);
        config.set_tensor(2);
        const RankLayout layout = RankLayout::Of(config);
        ASSERT_EQ(layout.plan_ranks(), static_cast<int>(pipeline * data * context));
        ASSERT_EQ(layout.world_size(), 2 * layout.plan_ranks());
        std::set<int> seen;
        for (uint32_t d = 0; d < data; ++d) {
          for (uint32_t p = 0; p < pipeline; ++p) {
            for (uint32_t k = 0; k < context; ++k) {
              const int rank = layout.Rank(d, p, k);
              EXPECT_TRUE(seen.insert(rank).second) << "rank " << rank << " twice";
              EXPECT_EQ(layout.DpRank(rank), d);
              EXPECT_EQ(layout.PpRank(rank), p);
              EXPECT_EQ(layout.ContextRank(rank), k);
            }
          }
        }
        EXPECT_EQ(*seen.rbegin(), layout.plan_ranks() - 1);
      }
    }
  }
  const RankLayout layout{.pipeline = 2, .data = 2, .tensor = 1, .context = 2};
  EXPECT_EQ(layout.ContextGroup(1, 1), (std::vector<int>{6, 7}));
  EXPECT_EQ(layout.PipelineGroup(1, 1), (std::vector<int>{5, 7}));
  EXPECT_EQ(layout.DataParallelGroup(0), (std::vector<int>{0, 1, 4, 5}));
}

TEST(RankLayout, UnsetDegreesAreOne) {
  const RankLayout layout = RankLayout::Of(v1::ParallelismConfig());
  EXPECT_EQ(layout.world_size(), 1);
  EXPECT_EQ(layout.PipelineGroup(0), (std::vector<int>{0}));
}

}  // namespace
}  // namespace varipipe
