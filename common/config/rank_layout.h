// How a job's ranks map to (data-parallel, pipeline, tensor) coordinates,
// tensor innermost (Megatron-LM's order: a tensor group, which runs
// collectives in every layer, sits on consecutive ranks of one node):
//
//   pipeline rank = dp_rank * pipeline + pp_rank      (what plans name)
//   global rank   = pipeline rank * tensor + tensor index
//
// so the ranks of one pipeline replica are consecutive too (one node when
// devices_per_node is a multiple of pipeline x tensor). Plans, their
// transfers and their groups name pipeline ranks; every tensor rank of a
// pipeline rank runs the same plan, talking to the same tensor index of the
// other pipeline ranks (executor/comm/tensor_rank_transport.h). Without
// tensor parallelism the two numberings are one. The planner's plans and
// the executors' groups both come from this type.
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
  uint32_t tensor = 1;

  static RankLayout Of(const v1::ParallelismConfig& parallelism) {
    return {.pipeline = std::max(1u, parallelism.pipeline()),
            .data = std::max(1u, parallelism.data()),
            .tensor = std::max(1u, parallelism.tensor())};
  }

  // Global ranks, and pipeline ranks (one plan each).
  int world_size() const { return static_cast<int>(pipeline * data * tensor); }
  int pipeline_ranks() const { return static_cast<int>(pipeline * data); }

  // Global rank <-> (pipeline rank, tensor index).
  int GlobalRank(int pipeline_rank, uint32_t tensor_index) const {
    return pipeline_rank * static_cast<int>(tensor) + static_cast<int>(tensor_index);
  }
  int PipelineRankOf(int global_rank) const { return global_rank / static_cast<int>(tensor); }
  uint32_t TensorIndex(int global_rank) const {
    return static_cast<uint32_t>(global_rank) % tensor;
  }
  // The global ranks running pipeline rank `pipeline_rank`'s plan.
  std::vector<int> TensorGroup(int pipeline_rank) const {
    std::vector<int> ranks;
    for (uint32_t i = 0; i < tensor; ++i) ranks.push_back(GlobalRank(pipeline_rank, i));
    return ranks;
  }

  // Pipeline-rank coordinates (and groups of pipeline ranks).
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
