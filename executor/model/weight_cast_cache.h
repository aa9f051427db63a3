// The compute-dtype copies of the parameters under mixed precision
// (docs/models.md, "Mixed precision"), as Megatron-LM keeps them: each
// linear layer's weight and bias (the LM head's weight too) is cast from its
// fp32 master weight once per optimizer step, and that one copy serves every
// forward, recomputation and backward of every micro-batch of the
// iteration.
//
// A copy is valid while its parameter is unchanged: the cache keys it on the
// parameter (its TensorImpl, held weakly), its version counter (which every
// in-place update bumps: the optimizer's step, a checkpoint's load) and its
// data pointer (set_data), so no hook tells it about a step. A write that
// bypasses the version counter (a raw copy into the parameter's storage)
// must bump it (torch::autograd::impl::bump_version) or call
// ClearWeightCasts().
//
// Memory: one copy per cast parameter, dtype bytes x its elements, held from
// its first use until the parameter changes and is used again (or dies);
// tensors allocated while a counting-allocator account is current are
// charged to it (executor/runtime/counting_allocator.h).
//
// Thread safety: every function may be called from any thread.
#ifndef VARIPIPE_EXECUTOR_MODEL_WEIGHT_CAST_CACHE_H_
#define VARIPIPE_EXECUTOR_MODEL_WEIGHT_CAST_CACHE_H_

#include <torch/torch.h>

#include <cstdint>

namespace varipipe::executor {

// `parameter` (a leaf) in `dtype`, without autograd history: the cached copy
// when the parameter has not changed since it was made, else a new one
// (which replaces it). The copy must not be modified.
torch::Tensor CachedCast(const torch::Tensor& parameter, torch::ScalarType dtype);

// `parameter` as an operand in `dtype`: the parameter itself when it has
// that dtype; otherwise CachedCast's copy, through an autograd function
// whose backward casts the gradient back to the parameter's dtype (fp32),
// so that it accumulates in the parameter's grad() (fp32, Megatron's
// main_grad) by the usual gradient accumulator. A tensor that is not a leaf
// is cast with autograd (not cached).
torch::Tensor ParameterIn(const torch::Tensor& parameter, torch::ScalarType dtype);

// Copies made (cache misses) since the process started or the last
// ClearWeightCasts, and the bytes of the copies held now.
struct WeightCastStats {
  int64_t casts = 0;
  int64_t held_bytes = 0;
};
WeightCastStats WeightCastCacheStats();

// Drops every copy and zeroes the count.
void ClearWeightCasts();

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_WEIGHT_CAST_CACHE_H_
