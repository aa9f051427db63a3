// The precision a recomputation runs at: a custom autograd function that
// re-runs part of its forward in backward (full or selective recomputation)
// saves the forward's CUDA autocast state with SaveForwardPrecision, and its
// backward re-runs under a RecomputePrecisionScope, so the recomputed
// activations equal the forward's.
//
// Autocast caches the low-precision copy of every fp32 weight it casts,
// per thread, until the outermost autocast region ends. The autograd
// engine runs a device's backward on its own thread, where no forward's
// region ever ends: without clearing, a recomputation in a later iteration
// would reuse the copy of a weight the optimizer has changed since. The
// scope clears that cache when it leaves the region it opened, and it
// restores the previous state even when the recomputation throws.
#ifndef VARIPIPE_EXECUTOR_MODEL_RECOMPUTE_PRECISION_H_
#define VARIPIPE_EXECUTOR_MODEL_RECOMPUTE_PRECISION_H_

#include <torch/torch.h>

#include "executor/model/cuda_autocast.h"

namespace varipipe::executor {

// Records the calling thread's autocast state in `ctx->saved_data`.
inline void SaveForwardPrecision(torch::autograd::AutogradContext* ctx) {
  ctx->saved_data["autocast"] = CudaAutocastEnabled();
  ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(CudaAutocastDtype());
}

// Sets the autocast state SaveForwardPrecision recorded for its lifetime.
class RecomputePrecisionScope {
 public:
  explicit RecomputePrecisionScope(torch::autograd::AutogradContext* ctx)
      : was_enabled_(CudaAutocastEnabled()),
        was_dtype_(CudaAutocastDtype()),
        enabled_(ctx->saved_data["autocast"].toBool()) {
    if (enabled_) {
      SetCudaAutocastDtype(
          static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt()));
    }
    SetCudaAutocastEnabled(enabled_);
  }
  ~RecomputePrecisionScope() {
    SetCudaAutocastEnabled(was_enabled_);
    SetCudaAutocastDtype(was_dtype_);
    if (enabled_ && !was_enabled_) at::autocast::clear_cache();
  }
  RecomputePrecisionScope(const RecomputePrecisionScope&) = delete;
  RecomputePrecisionScope& operator=(const RecomputePrecisionScope&) = delete;

 private:
  const bool was_enabled_;
  const at::ScalarType was_dtype_;
  const bool enabled_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_RECOMPUTE_PRECISION_H_
