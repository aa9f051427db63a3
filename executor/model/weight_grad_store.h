// What a split backward (zero-bubble schedules, BackwardPass with
// weight_grad_deferred) keeps for its WeightGradPass: for every linear layer
// it ran through, the layer's input and output gradient, from which the
// weight gradient is grad_W = sum over tokens of grad_out^T x
// (deferred_linear.h). One store per (stage, micro-batch); the weight_grad
// instruction applies it.
//
// A store is bound to a forward pass by a WeightGradScope on the thread that
// runs the forward: every DeferredLinear built there (with grad mode on)
// records into it when its backward runs, on whichever thread the autograd
// engine runs that (the store is captured by the graph, not looked up then).
// Full recomputation re-runs layers inside the backward; their linears
// record into the store the checkpointed layer captured in its forward.
//
// The stored tensors are ordinary tensors: the device's allocator (and the
// executor's counting allocator on CPUs) sees them until Apply releases
// them.
//
// Thread safety: Add may be called from any thread (the autograd engine's);
// Apply and the accessors must not run concurrently with a backward that
// records into the same store.
#ifndef VARIPIPE_EXECUTOR_MODEL_WEIGHT_GRAD_STORE_H_
#define VARIPIPE_EXECUTOR_MODEL_WEIGHT_GRAD_STORE_H_

#include <torch/torch.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace varipipe::executor {

class WeightGradStore {
 public:
  WeightGradStore() = default;
  WeightGradStore(const WeightGradStore&) = delete;
  WeightGradStore& operator=(const WeightGradStore&) = delete;

  // Records one linear layer's deferred weight gradient: `weight` is the
  // parameter (fp32 master weight), `input` [..., in] and `grad_output`
  // [..., out] in the dtype the layer computed in (the CUDA autocast dtype
  // under mixed precision).
  void Add(const torch::Tensor& weight, const torch::Tensor& input,
           const torch::Tensor& grad_output);

  // Computes grad_out^T x for every recorded pair (in the pair's dtype, as
  // the combined backward does), accumulates it into its parameter's grad()
  // (in the parameter's dtype) and releases the pairs. The store is empty
  // afterwards.
  void Apply();

  // Recorded pairs and the bytes their tensors hold (each storage once).
  size_t size() const;
  int64_t stored_bytes() const;

 private:
  struct Pair {
    torch::Tensor weight;
    torch::Tensor input;
    torch::Tensor grad_output;
  };
  mutable std::mutex mutex_;
  std::vector<Pair> pairs_;  // guarded by mutex_
};

// The store DeferredLinear forwards on this thread record into, or null.
WeightGradStore* CurrentWeightGradStore();

// Makes `store` (may be null: none) the current store of this thread for
// its lifetime, then restores the previous one.
class WeightGradScope {
 public:
  explicit WeightGradScope(WeightGradStore* store);
  ~WeightGradScope();
  WeightGradScope(const WeightGradScope&) = delete;
  WeightGradScope& operator=(const WeightGradScope&) = delete;

 private:
  WeightGradStore* previous_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_WEIGHT_GRAD_STORE_H_
