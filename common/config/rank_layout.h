// How a job's ranks map to (data-parallel, pipeline, context, tensor)
// coordinates, tensor innermost, then context (Megatron-LM's order for the
// two groups that talk in every layer: a tensor group and then a context
// group sit on consecutive ranks of one node):
//
//   plan rank   = (dp_rank * pipeline + pp_rank) * context + context_rank
//   global rank = plan rank * tensor + tensor index
//
// so the ranks of one pipeline replica are consecutive too (one node when
// devices_per_node is a multiple of pipeline x context x tensor). Each plan
// rank runs its own plan: a context group's c ranks are c lanes of the
// pipeline (lane k of stage s talks to lane k of the neighbouring stages),
// which split some micro-batches between them and run others whole
// (proto/varipipe/v1/plan.proto, ContextPlacement). Plans, their transfers
// and their groups name plan ranks; every tensor rank of a plan rank runs
// the same plan, talking to the same tensor index of the other plan ranks
// (executor/comm/tensor_rank_transport.h). Without tensor and context
// parallelism the numberings are one. The planner's plans and the
// executors' groups both come from this type.
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
  uint32_t context = 1;

  static RankLayout Of(const v1::ParallelismConfig& parallelism) {
    return {.pipeline = std::max(1u, parallelism.pipeline()),
            .data = std::max(1u, parallelism.data()),
            .tensor = std::max(1u, parallelism.tensor()),
            .context = std::max(1u, parallelism.context())};
  }

  // Global ranks, and plan ranks (one plan each).
  int world_size() const { return plan_ranks() * static_cast<int>(tensor); }
  int plan_ranks() const { return static_cast<int>(pipeline * data * context); }
  // The former name of plan_ranks(), from before context parallelism.
  int pipeline_ranks() const { return plan_ranks(); }

  // Global rank <-> (plan rank, tensor index).
  int GlobalRank(int plan_rank, uint32_t tensor_index) const {
    return plan_rank * static_cast<int>(tensor) + static_cast<int>(tensor_index);
  }
  int PlanRankOf(int global_rank) const { return global_rank / static_cast<int>(tensor); }
  int PipelineRankOf(int global_rank) const { return PlanRankOf(global_rank); }
  uint32_t TensorIndex(int global_rank) const {
    return static_cast<uint32_t>(global_rank) % tensor;
  }
  // The global ranks running plan rank `plan_rank`'s plan.
  std::vector<int> TensorGroup(int plan_rank) const {
    std::vector<int> ranks;
    for (uint32_t i = 0; i < tensor; ++i) ranks.push_back(GlobalRank(plan_rank, i));
    return ranks;
  }

  // Plan-rank coordinates (and groups of plan ranks).
  int Rank(uint32_t dp_rank, uint32_t pp_rank, uint32_t context_rank = 0) const {
    return static_cast<int>((dp_rank * pipeline + pp_rank) * context + context_rank);
  }
  uint32_t DpRank(int rank) const { return static_cast<uint32_t>(rank) / context / pipeline; }
  uint32_t PpRank(int rank) const { return static_cast<uint32_t>(rank) / context % pipeline; }
  uint32_t ContextRank(int rank) const { return static_cast<uint32_t>(rank) % context; }
  // The ranks of lane `context_rank` of replica `dp_rank`'s pipeline, by
  // pipeline rank.
  std::vector<int> PipelineGroup(uint32_t dp_rank, uint32_t context_rank = 0) const {
    std::vector<int> ranks;
    for (uint32_t p = 0; p < pipeline; ++p) ranks.push_back(Rank(dp_rank, p, context_rank));
    return ranks;
  }
  // The ranks holding pipeline rank `pp_rank`'s stages, by replica then
  // lane: the group whose gradients are reduced together (data and context
  // parallelism both replicate the layers).
  std::vector<int> DataParallelGroup(uint32_t pp_rank) const {
    std::vector<int> ranks;
    for (uint32_t d = 0; d < data; ++d) {
      for (uint32_t k = 0; k < context; ++k) ranks.push_back(Rank(d, pp_rank, k));
    }
    return ranks;
  }
  // The lanes of replica `dp_rank` at pipeline rank `pp_rank`: the group
  // that splits micro-batches between them, by context rank.
  std::vector<int> ContextGroup(uint32_t dp_rank, uint32_t pp_rank) const {
    std::vector<int> ranks;
    for (uint32_t k = 0; k < context; ++k) ranks.push_back(Rank(dp_rank, pp_rank, k));
    return ranks;
  }
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CONFIG_RANK_LAYOUT_H_
