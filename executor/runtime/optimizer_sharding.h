// ZeRO stage 1 (training.zero_stage: 1; Rajbhandari et al. 2020, "ZeRO:
// memory optimizations toward training trillion parameter models", P_os):
// the optimizer state sharded across the data-parallel group.
//
// Layout, the invariant everything here relies on: each of this rank's
// model stages keeps its parameters in one flat fp32 buffer (in the stage's
// parameters() order, zero-padded to a multiple of dp elements), and every
// parameter tensor is a view into it (rebound once, at Create); its
// gradients live in a second flat buffer of the same layout, each
// parameter's .grad a view into it. The buffers are cut into buckets, as
// Megatron-Core's distributed optimizer does: bucket 0 is the last
// `bucket_bytes` of the buffer (rounded down to a multiple of dp elements),
// bucket 1 the same amount before it, and so on, the first bucket taking
// what is left; every bucket's size is a multiple of dp, and a bucket may
// split a parameter. Bucket b is split into dp equal chunks; the
// data-parallel group's i-th rank owns chunk i of every bucket, so its
// shard is one view per bucket. Without buckets (bucket_bytes 0) a stage is
// one bucket, and the shard one contiguous range (the layout of executors
// before buckets, whose checkpoints therefore load unchanged). After every
// step all dp replicas of a stage hold identical buffers, as under stage 0.
//
// An iteration:
// 1. Gradients accumulate in place in the gradient buffer. With buckets
//    (Buckets), each bucket is reduce-scattered with a sum as soon as its
//    gradients are final in the stage's last backward pass, on the NCCL
//    group stream or Gloo's collective thread (gradient_buckets.h; buckets
//    holding a shared parameter wait for the cross-stage sum, at the
//    instruction). The plan's AllReduceGradients becomes
//    ReduceScatterGradients: it waits for them (or, without buckets,
//    reduce-scatters the whole buffer there). Each replica's loss is
//    already divided by the global token count, so the sum is the global
//    mean's gradient, as stage 0's all-reduce gives. This rank's chunks of
//    the sum are the gradients of its shard parameters; the rest of the
//    buffer is zeroed (consumed).
// 2. OptimizerStep: the TrainingOptimizer runs over shard_parameters()
//    (OptimizerShard says which shard): its squared gradient norm summed
//    over the data-parallel group and then over the pipeline is stage 0's
//    global norm, it clips by that norm and updates its chunks only (and
//    zeroes their gradients), and AdamW's moments exist for its chunks only
//    (1/dp of stage 0's state).
// 3. AllGatherParameters: every bucket of every stage's parameter buffer is
//    all-gathered (all started, then all waited for), so every replica's
//    parameters are whole and equal again.
//
// With a data-parallel degree of 1 there is nothing to shard: MakeRankOptimizer
// then builds the stage 0 optimizer.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_OPTIMIZER_SHARDING_H_
#define VARIPIPE_EXECUTOR_RUNTIME_OPTIMIZER_SHARDING_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/comm/transport.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/gradient_buckets.h"
#include "executor/runtime/training_optimizer.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::executor {

class OptimizerSharding {
 public:
  // Rebinds the parameters of `stages` (fp32, on `device`) into flat
  // buffers, values unchanged, and their gradients into gradient buffers
  // of the same layout. `group`: the global ranks of this rank's
  // data-parallel group, ascending, this rank at position `index`.
  // `bucket_bytes`: the size of the buckets the shards are cut from (0 or
  // less: one bucket per stage, reduced after the last backward pass).
  static absl::StatusOr<std::unique_ptr<OptimizerSharding>> Create(
      const std::map<uint32_t, ModelStage*>& stages, std::vector<int> group, int index,
      torch::Device device, int64_t bucket_bytes = 0);
  ~OptimizerSharding();

  // What the optimizer updates: this rank's chunk of every bucket of each
  // stage's buffer, in stage order, then bucket order (views into the
  // buffers; their gradients views into the gradient buffers).
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
  int64_t bucket_bytes() const { return bucket_bytes_; }
  // Whether the gradients are reduce-scattered per bucket during the
  // backward (bucket_bytes > 0).
  bool bucketed() const { return bucket_bytes_ > 0; }

  // The layout the shards are cut from, for checkpoints: per stage its id,
  // its unpadded element count, its bucket count and each bucket's size
  // (int64). Two shardings over the same data-parallel degree hold the
  // same shards exactly when these are equal.
  torch::Tensor LayoutTensor() const;
  // Whether `layout` (a LayoutTensor) has one bucket per stage: the layout
  // of executors before buckets, which recorded none.
  static bool IsUnbucketed(const torch::Tensor& layout);

  // Bucketed sharding: the gradient buckets of stage `stage`, made at the
  // first call (their hooks count the stage's accumulations), whose
  // reduce-scatters the interpreter starts during the backward; buckets
  // holding a parameter named in `held` (shared parameters) start at the
  // instruction. Null without buckets or for a stage this rank lacks.
  GradientBuckets* Buckets(uint32_t stage, const std::set<std::string>& held);

  // Step 1 for stage `stage` over `group` (the plan's all-reduce group, which
  // must be the sharding's): waits (until `deadline`) for the stage's
  // buckets when they were armed this iteration, or reduce-scatters the
  // whole gradient buffer now. Counts the buckets into `buckets` and those
  // started inside the backward into `started_in_backward` when given.
  absl::Status ReduceScatterGradients(uint32_t stage, const std::vector<int>& group,
                                      Transport& transport, absl::Time deadline,
                                      int* buckets = nullptr,
                                      int* started_in_backward = nullptr);
  // FailedPrecondition unless every stage's shard has its gradient of this
  // iteration (the plan reduced every stage before its OptimizerStep).
  absl::Status CheckGradientsReduced() const;
  // Step 3, after the optimizer's step: every bucket's all-gather started,
  // then all waited for (until `deadline`).
  absl::Status AllGatherParameters(Transport& transport, absl::Time deadline);

 private:
  struct Stage {
    std::vector<std::string> names;         // of the parameters, in order
    std::vector<torch::Tensor> parameters;  // views into `flat`
    // Offsets in `flat` of replica parameters: [begin, end).
    std::vector<std::pair<int64_t, int64_t>> replicas;
    int64_t numel = 0;    // of the parameters, unpadded
    torch::Tensor flat;   // [numel rounded up to a multiple of dp] fp32 parameters
    torch::Tensor grads;  // the same layout: the parameters' gradients
    // Bucket b: [begin, end) of flat (bucket 0 at its end).
    std::vector<std::pair<int64_t, int64_t>> buckets;
    // This rank's chunk of each bucket: views into flat (their gradients:
    // the same chunks of grads).
    std::vector<torch::Tensor> shards;
    std::unique_ptr<GradientBuckets> bucketed;  // Buckets()
    bool reduced = false;  // the shards hold this iteration's gradients
  };
  OptimizerSharding(std::vector<int> group, int index, torch::Device device, int64_t bucket_bytes)
      : group_(std::move(group)), index_(index), device_(device), bucket_bytes_(bucket_bytes) {}
  // [begin, end) of flat of this rank's chunk of bucket `b` of `st`.
  std::pair<int64_t, int64_t> Chunk(const Stage& st, size_t b) const;
  // Points each shard's gradient at its chunk of the gradient buffer.
  static void BindShardGradients(Stage& st);

  std::vector<int> group_;
  int index_;
  torch::Device device_;
  int64_t bucket_bytes_;
  std::map<uint32_t, Stage> stages_;
};

// A rank's optimizer for `training.zero_stage`: stage 0 (or a group of one)
// updates every parameter of `stages`; stage 1 shards (sharding non-null).
struct RankOptimizer {
  std::unique_ptr<OptimizerSharding> sharding;
  std::unique_ptr<TrainingOptimizer> optimizer;
};
// Under stage 1 the shards are cut from buckets of `bucket_bytes` (unset:
// training.gradient_bucket_mib, 25 MiB by default; the interpreter's
// InterpreterOptions::gradient_bucket_bytes should match).
absl::StatusOr<RankOptimizer> MakeRankOptimizer(const std::map<uint32_t, ModelStage*>& stages,
                                                const v1::TrainingConfig& training,
                                                const std::vector<int>& data_parallel_group,
                                                int data_parallel_index, torch::Device device,
                                                std::optional<int64_t> bucket_bytes = {});
// The gradient bucket size training.gradient_bucket_mib asks for (25 MiB
// unset).
int64_t GradientBucketBytes(const v1::TrainingConfig& training);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_OPTIMIZER_SHARDING_H_
