// A linear layer y = x W^T + b whose weight gradient a split backward can
// defer (zero-bubble schedules: B computes the input gradient, W the weight
// gradients later; docs/executor.md, "Split backward").
//
// With a current WeightGradStore (weight_grad_store.h) and grad mode on, the
// layer is a custom autograd Function: its backward returns the gradients of
// x and of the bias (cheap: a sum over tokens) and records (x, grad_y) in
// the store instead of computing grad_W; WeightGradStore::Apply later adds
// grad_y^T x to W.grad(). It keeps the parameter and the weight operand
// (the parameter itself, or under mixed precision the cached copy).
// Without a store it is torch::linear (the combined backward, unchanged).
//
// Dtypes are those of torch::linear: under CUDA autocast the layer computes
// in the autocast dtype (x, W and b cast to it; the output, the stored x and
// grad_y in it), and the input and bias gradients are returned in their
// tensors' own dtypes, as autocast's casts would back-propagate them.
//
// Mixed precision (ComputeDtype(x), cuda_autocast.h, differs from the
// weight's dtype; docs/models.md, "Mixed precision"): W and b enter as the
// iteration's one cached copy in the compute dtype (weight_cast_cache.h),
// never a per-pass cast, in both paths and in recomputations; the product,
// grad_x = grad_y W and grad_W = grad_y^T x run in the compute dtype and
// grad_W (and grad_b) accumulate into the fp32 parameters' grad(). With the
// weight's own dtype (fp32 on CPUs) the layer is unchanged.
#ifndef VARIPIPE_EXECUTOR_MODEL_DEFERRED_LINEAR_H_
#define VARIPIPE_EXECUTOR_MODEL_DEFERRED_LINEAR_H_

#include <torch/torch.h>

namespace varipipe::executor {

// x [..., in], weight [out, in], bias [out] or undefined; returns [..., out].
torch::Tensor DeferredLinear(const torch::Tensor& x, const torch::Tensor& weight,
                             const torch::Tensor& bias = {});

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_DEFERRED_LINEAR_H_
