// ZeRO stage 1 (training.zero_stage: 1; Rajbhandari et al. 2020, "ZeRO:
// memory optimizations toward training trillion parameter models", P_os):
// the optimizer state sharded across the data-parallel group.
//
// Layout, the invariant everything here relies on: each of this rank's
// model stages keeps its parameters in one flat fp32 buffer (in the stage's
// parameters() order, zero-padded to a multiple of dp elements), and every
// parameter tensor is a view into it (rebound once, at Create). The buffer
// is split into dp contiguous shards of equal size; the data-parallel
// group's i-th rank owns shard i of every stage. After every step all dp
// replicas of a stage hold identical buffers, as under stage 0.
//
// An iteration:
// 1. The plan's AllReduceGradients becomes ReduceScatterGradients for each
//    stage: the stage's gradients are flattened in the same layout (padding
//    zero) and reduce-scattered with a sum (each replica's loss is already
//    divided by the global token count, so the sum is the global mean's
//    gradient, as stage 0's all-reduce gives). This rank's shard of the sum
//    becomes the gradient of its shard parameter; the model's full
//    gradients are zeroed (consumed).
// 2. OptimizerStep: the TrainingOptimizer runs over shard_parameters()
//    (OptimizerShard says which shard): its squared gradient norm summed
//    over the data-parallel group and then over the pipeline is stage 0's
//    global norm, it clips by that norm and updates its shards only, and
//    AdamW's moments exist for its shards only (1/dp of stage 0's state).
// 3. AllGatherParameters: every stage's buffer is all-gathered, so every
//    replica's parameters are whole and equal again.
//
// With a data-parallel degree of 1 there is nothing to shard: MakeRankOptimizer
// then builds the stage 0 optimizer.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_OPTIMIZER_SHARDING_H_
#define VARIPIPE_EXECUTOR_RUNTIME_OPTIMIZER_SHARDING_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/comm/transport.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/training_optimizer.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::executor {

class OptimizerSharding {
 public:
  // Rebinds the parameters of `stages` (fp32, on `device`) into flat
  // buffers, values unchanged. `group`: the global ranks of this rank's
  // data-parallel group, ascending, this rank at position `index`.
  static absl::StatusOr<std::unique_ptr<OptimizerSharding>> Create(
      const std::map<uint32_t, ModelStage*>& stages, std::vector<int> group, int index,
      torch::Device device);

  // What the optimizer updates: this rank's shard of each stage's buffer, in
  // stage order (views into the buffers).
  std::vector<torch::Tensor> shard_parameters() const;
  // The parts of shard_parameters() that are replicas (ModelStage::IsReplica),
  // for TrainingOptimizer::set_norm_exclusions.
  std::vector<NormExclusion> ShardNormExclusions() const;
  const std::vector<int>& group() const { return group_; }
  uint32_t data_parallel() const { return static_cast<uint32_t>(group_.size()); }
  uint32_t index() const { return static_cast<uint32_t>(index_); }
  OptimizerShard shard() const {
    return {.zero_stage = 1, .data_parallel = data_parallel(), .index = index()};
  }

  // Step 1 for stage `stage` over `group` (the plan's all-reduce group, which
  // must be the sharding's).
  absl::Status ReduceScatterGradients(uint32_t stage, const std::vector<int>& group,
                                      Transport& transport);
  // FailedPrecondition unless every stage's shard has its gradient of this
  // iteration (the plan reduced every stage before its OptimizerStep).
  absl::Status CheckGradientsReduced() const;
  // Step 3, after the optimizer's step; drops the shards' gradients.
  absl::Status AllGatherParameters(Transport& transport);

 private:
  struct Stage {
    std::vector<torch::Tensor> parameters;  // views into `flat`
    // Offsets in `flat` of replica parameters: [begin, end).
    std::vector<std::pair<int64_t, int64_t>> replicas;
    torch::Tensor flat;   // [dp * shard_size] fp32
    torch::Tensor shard;  // flat[index * shard_size, +shard_size)
    int64_t shard_size = 0;
    bool reduced = false;  // the shard holds this iteration's gradient
  };
  OptimizerSharding(std::vector<int> group, int index, torch::Device device)
      : group_(std::move(group)), index_(index), device_(device) {}
  // Waits for the device's queued work (NCCL runs on its own stream).
  void Synchronize() const;

  std::vector<int> group_;
  int index_;
  torch::Device device_;
  std::map<uint32_t, Stage> stages_;
};

// A rank's optimizer for `training.zero_stage`: stage 0 (or a group of one)
// updates every parameter of `stages`; stage 1 shards (sharding non-null).
struct RankOptimizer {
  std::unique_ptr<OptimizerSharding> sharding;
  std::unique_ptr<TrainingOptimizer> optimizer;
};
absl::StatusOr<RankOptimizer> MakeRankOptimizer(const std::map<uint32_t, ModelStage*>& stages,
                                                const v1::TrainingConfig& training,
                                                const std::vector<int>& data_parallel_group,
                                                int data_parallel_index, torch::Device device);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_OPTIMIZER_SHARDING_H_
