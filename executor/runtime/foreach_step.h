// Multi-tensor optimizer steps: the update rules of LibTorch's AdamW and SGD
// (momentum 0) applied to each parameter group's whole list at once with
// ATen's foreach operations (a few fused multi-tensor kernels on a GPU;
// per-tensor loops of the same operations on a CPU, hence bitwise the same
// results as the optimizers' own step there). State lives in the optimizer
// (its step counts and moments), so its save and load, and the checkpoints
// written before, are unchanged.
//
// AdamW, per parameter p with gradient g at step t (LibTorch's order):
//   p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// SGD: p -= lr * (g + weight_decay * p).
// Parameters without a gradient are skipped, as the optimizers do.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_FOREACH_STEP_H_
#define VARIPIPE_EXECUTOR_RUNTIME_FOREACH_STEP_H_

#include <torch/torch.h>

namespace varipipe::executor {

// amsgrad is not supported (TORCH_CHECK).
void ForeachAdamWStep(torch::optim::AdamW& optimizer);
// Momentum 0 only (TORCH_CHECK).
void ForeachSgdStep(torch::optim::SGD& optimizer);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_FOREACH_STEP_H_
