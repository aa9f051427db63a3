// The optimizer step of an iteration: AdamW (decoupled weight decay) or plain
// SGD (training.optimizer) over the parameters of this rank's stages, after
// clipping by the global gradient norm (over the whole model, not per stage),
// with linear warm-up followed by cosine decay of the learning rate.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_TRAINING_OPTIMIZER_H_
#define VARIPIPE_EXECUTOR_RUNTIME_TRAINING_OPTIMIZER_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "varipipe/v1/config.pb.h"

namespace varipipe::executor {

// Learning rate of iteration `iteration` (0-based) for a config with defaults
// applied: lr * (i + 1) / warmup during warm-up, then
// min + (lr - min) * (1 + cos(pi * progress)) / 2 over the remaining
// iterations.
double LearningRateAt(const v1::TrainingConfig& training, uint64_t iteration);

class TrainingOptimizer {
 public:
  // `training` with defaults applied (ApplyJobConfigDefaults).
  TrainingOptimizer(std::vector<torch::Tensor> parameters, const v1::TrainingConfig& training);

  // Sum of squared gradient entries of this rank's parameters; the caller
  // sums it over the pipeline to get the global squared norm.
  double LocalSquaredGradNorm() const;

  // Scales gradients by min(1, clip / global_norm), applies the update rule
  // with the iteration's learning rate and zeroes the gradients. Returns the
  // learning rate used.
  double Step(uint64_t iteration, double global_grad_norm);

  // The optimizer's state (AdamW: step counts, first and second moments;
  // SGD: none) for checkpoints; Load expects the state of the same kind of
  // optimizer over the same parameters.
  void Save(torch::serialize::OutputArchive& archive) const;
  void Load(torch::serialize::InputArchive& archive);

 private:
  std::vector<torch::Tensor> parameters_;
  v1::TrainingConfig training_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_TRAINING_OPTIMIZER_H_
