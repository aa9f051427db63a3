// The optimizer step of an iteration: AdamW (decoupled weight decay) or plain
// SGD (training.optimizer) over the parameters of this rank's stages, after
// clipping by the global gradient norm (over the whole model, not per stage),
// with linear warm-up followed by cosine decay of the learning rate. Under
// ZeRO stage 1 it updates this rank's shards only (optimizer_sharding.h).
//
// Every step works on the whole parameter list at once (foreach_step.h: a
// few multi-tensor kernels on a GPU, not several per parameter), and nothing
// in it reads the device: the gradient norm stays a device tensor until the
// caller reads it (host_reads.h), and the clipping factor it returns is a
// host number.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_TRAINING_OPTIMIZER_H_
#define VARIPIPE_EXECUTOR_RUNTIME_TRAINING_OPTIMIZER_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::executor {

// Learning rate of iteration `iteration` (0-based) for a config with defaults
// applied: lr * (i + 1) / warmup during warm-up, then
// min + (lr - min) * (1 + cos(pi * progress)) / 2 over the remaining
// iterations.
double LearningRateAt(const v1::TrainingConfig& training, uint64_t iteration);

// Which part of the optimizer state an optimizer holds: the whole state
// (ZeRO stage 0, or data-parallel degree 1), or under ZeRO stage 1 shard
// `index` of `data_parallel` (optimizer_sharding.h). Recorded in
// checkpoints, which resume only into the same sharding.
struct OptimizerShard {
  uint32_t zero_stage = 0;
  uint32_t data_parallel = 1;
  uint32_t index = 0;  // this rank's position in its data-parallel group
  bool sharded() const { return zero_stage >= 1 && data_parallel > 1; }
};

// Elements [begin, end) of parameter `parameter` (flattened) that the
// gradient norm leaves out: a replica whose gradient another stage's copy
// already counts (ModelStage::IsReplica).
struct NormExclusion {
  size_t parameter = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

class TrainingOptimizer {
 public:
  // `training` with defaults applied (ApplyJobConfigDefaults). `parameters`
  // are what the optimizer updates: the model's parameters, or under ZeRO
  // stage 1 this rank's shards of them (`shard` says which).
  TrainingOptimizer(std::vector<torch::Tensor> parameters, const v1::TrainingConfig& training,
                    OptimizerShard shard = {});

  // Sum of squared gradient entries of this optimizer's parameters, as a
  // 0-dim fp64 tensor on their device (fp32 per-parameter norms from one
  // multi-tensor kernel, squared and summed in fp64; no read). The caller
  // sums it over the pipeline (and, sharded, the data-parallel group) to get
  // the global squared norm.
  torch::Tensor LocalSquaredGradNormTensor() const;
  // The same, read to the host (one device read; tools and tests).
  double LocalSquaredGradNorm() const;
  void set_norm_exclusions(std::vector<NormExclusion> exclusions) {
    norm_exclusions_ = std::move(exclusions);
  }

  // Scales gradients by clip / (global_norm + 1e-6) when global_norm > clip,
  // applies the update rule with the iteration's learning rate and zeroes the
  // gradients (in place: they stay allocated). Returns the learning rate
  // used.
  double Step(uint64_t iteration, double global_grad_norm);

  // Bytes of the optimizer's state tensors (AdamW: first and second moments
  // of its parameters, from the first step on; SGD: none).
  int64_t StateBytes() const;

  const OptimizerShard& shard() const { return shard_; }

  // The optimizer's state (AdamW: step counts, first and second moments;
  // SGD: none) and, sharded, which shard it is, for checkpoints.
  // CheckShard (FailedPrecondition naming both data-parallel degrees) tells
  // whether an archive's state was written by an optimizer sharded like
  // this one (stage 0 state fits any stage 0 optimizer); Load checks that,
  // then expects the state of the same kind of optimizer over the same
  // parameters.
  void Save(torch::serialize::OutputArchive& archive) const;
  absl::Status CheckShard(torch::serialize::InputArchive& archive) const;
  absl::Status Load(torch::serialize::InputArchive& archive);

 private:
  std::vector<torch::Tensor> parameters_;
  std::vector<NormExclusion> norm_exclusions_;
  v1::TrainingConfig training_;
  OptimizerShard shard_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

// Bytes of `tensors`' elements (a rank's parameters).
int64_t TensorBytes(const std::vector<torch::Tensor>& tensors);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_TRAINING_OPTIMIZER_H_
