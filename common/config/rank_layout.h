// How a job's global ranks map to (data-parallel, pipeline) coordinates:
// rank = dp_rank * pipeline + pp_rank (tensor parallelism 1), so the stages
// of one pipeline replica are consecutive ranks (and share a node when
// devices_per_node is a multiple of the pipeline degree). The planner's
// plans and the executors' groups both come from this type.
#ifndef VARIPIPE_COMMON_CONFIG_RANK_LAYOUT_H_
#define VARIPIPE_COMMON_CONFIG_RANK_LAYOUT_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "varipipe/v1/config.pb.h"

namespace varipipe {

struct RankLayout {
  uint32_t pipeline = 1;
  uint32_t data = 1;

  static RankLayout Of(const v1::ParallelismConfig& parallelism) {
    return {.pipeline = std::max(1u, parallelism.pipeline()),
            .data = std::max(1u, parallelism.data())};
  }

  int world_size() const { return static_cast<int>(pipeline * data); }
  int Rank(uint32_t dp_rank, uint32_t pp_rank) const {
    return static_cast<int>(dp_rank * pipeline + pp_rank);
  }
  uint32_t DpRank(int rank) const { return static_cast<uint32_t>(rank) / pipeline; }
  uint32_t PpRank(int rank) const { return static_cast<uint32_t>(rank) % pipeline; }
  // The ranks of replica `dp_rank`'s pipeline, by pipeline rank.
  std::vector<int> PipelineGroup(uint32_t dp_rank) const {
    std::vector<int> ranks;
    for (uint32_t p = 0; p < pipeline; ++p) ranks.push_back(Rank(dp_rank, p));
    return ranks;
  }
  // The ranks holding pipeline rank `pp_rank`, by replica.
  std::vector<int> DataParallelGroup(uint32_t pp_rank) const {
    std::vector<int> ranks;
    for (uint32_t d = 0; d < data; ++d) ranks.push_back(Rank(d, pp_rank));
    return ranks;
  }
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CONFIG_RANK_LAYOUT_H_
