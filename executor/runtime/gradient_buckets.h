// Data-parallel gradient reduction overlapped with the backward passes, as
// PyTorch's DDP and Megatron-Core do it. A stage's parameter gradients live
// in persistent flat fp32 buckets of at most `bucket_bytes` each (the
// parameters in reverse order, roughly the order a backward pass finishes
// them); each parameter's .grad is a view into its bucket, so accumulation,
// clipping and zeroing all happen in place and the reduction needs no copy.
//
// A post-hook on each parameter's gradient accumulator counts how often it
// runs in a backward pass (once per parameter, more for a weight used twice,
// e.g. tied embeddings under full recomputation, whose parts accumulate in
// separate backward calls). In the stage's last backward pass of an
// iteration a parameter's gradient is final once its accumulator ran as
// often as in the previous pass, and a bucket's all-reduce starts as soon as
// all its gradients are final. After the stage's last gradient pass
// StartAll starts the rest (split backwards accumulate weight gradients in
// their W pass, outside autograd: their iterations start everything there);
// Finish waits for them all. Buckets always start in index order, so every
// replica starts the same collectives in the same order whatever its
// timing, and each bucket is reduced alone with the transport's fixed
// summation order: the results do not depend on when a bucket started.
//
// ZeRO stage 1 (optimizer_sharding.h) uses the same machinery over its own
// layout (ReduceScatter): the stage's gradients are one flat buffer cut into
// buckets that may split a parameter, each bucket's collective is a
// reduce-scatter sum leaving this rank's chunk of it reduced, and a bucket
// holding a shared parameter (summed across stages first) is held back
// until Finish; the others still start in index order.
//
//   GradientBuckets buckets(stage->named_parameters(), excluded, 25 << 20);
//   buckets.BeginIteration(transport, group);
//   buckets.BeginPass(/*start_when_final=*/false);  // every backward pass ...
//   ... backward ...
//   buckets.EndPass();
//   buckets.BeginPass(/*start_when_final=*/true);   // ... the last one
//   ... backward ...
//   buckets.EndPass();
//   buckets.StartAll();                   // after the last gradient pass
//   VP_RETURN_IF_ERROR(buckets.Finish(deadline));  // the AllReduce instruction
//
// The hooks run where autograd accumulates (on a GPU, the autograd engine's
// device thread while the interpreter's thread waits in backward()).
#ifndef VARIPIPE_EXECUTOR_RUNTIME_GRADIENT_BUCKETS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_GRADIENT_BUCKETS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "executor/comm/transport.h"

namespace varipipe::executor {

class GradientBuckets {
 public:
  // `parameters` of one stage (in registration order), leaving out those
  // named in `excluded` (shared parameters, summed across stages first and
  // reduced apart). Each parameter's gradient becomes a view into its
  // bucket, keeping its current value (zeros when it had none).
  GradientBuckets(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                  const std::set<std::string>& excluded, int64_t bucket_bytes);
  // ZeRO stage 1's buckets. `parameters` (in order) lie at consecutive
  // offsets of `flat` (fp32, on their device); the gradient of each one
  // that requires one becomes a view into it, keeping its value. Bucket b
  // is flat[ranges[b].first, ranges[b].second), its size a multiple of the
  // group's; bucket 0 starts first. A bucket's collective is a sum
  // reduce-scatter: after Finish this rank's chunk of it (chunk `chunk` of
  // group-size equal chunks) holds the group's sum, unscaled, and its other
  // chunks are zero (the next iteration accumulates from zero; the optimizer
  // zeroes the chunk it consumed). Buckets holding any part of a parameter
  // named in `held` start only in Finish, in index order after the others.
  static std::unique_ptr<GradientBuckets> ReduceScatter(
      const torch::OrderedDict<std::string, torch::Tensor>& parameters, const torch::Tensor& flat,
      const std::vector<std::pair<int64_t, int64_t>>& ranges, const std::set<std::string>& held,
      int chunk);
  // Waits (bounded) for reductions still in flight: they write the buckets.
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // The iteration's reduction: all-reduces over `group` on `transport`.
  void BeginIteration(Transport* transport, std::vector<int> group);
  // A backward pass of the stage begins: its accumulations are counted.
  // With `start_when_final` (the iteration's last backward pass, when an
  // earlier one counted) a gradient is final once its accumulator ran as
  // often as in the previous pass, and buckets start when all theirs are.
  void BeginPass(bool start_when_final);
  // The pass ended: its counts are the next pass's expectation.
  void EndPass();
  // Whether a pass counted accumulations since construction.
  bool has_counts() const { return has_counts_; }
  // Starts every bucket not started yet, in order, but the held ones (after
  // BeginIteration).
  absl::Status StartAll();
  // Starts what is left (the held buckets last), waits for every bucket's
  // collective, then multiplies all-reduced buckets by the group size (each
  // replica's loss is already divided by the global token count: the
  // replicas' gradients add up) or zeroes the other ranks' chunks of
  // reduce-scattered ones. Resets for the next iteration.
  absl::Status Finish(absl::Time deadline);

  size_t num_buckets() const { return buckets_.size(); }
  // Whether BeginIteration ran and Finish did not yet.
  bool armed() const { return armed_; }
  // Buckets started from the hooks, inside the last backward pass, in the
  // last iteration that finished.
  int started_in_backward() const { return started_in_backward_; }
  // The names of the parameters in bucket `b` (tests).
  std::vector<std::string> BucketParameters(size_t b) const;

 private:
  enum class Reduction { kAllReduceMean, kReduceScatterSum };
  struct Bucket {
    torch::Tensor flat;           // fp32, contiguous, on the parameters' device
    std::vector<size_t> members;  // indices into params_ of the parameters in it
    size_t ready = 0;             // members whose gradients are final
    bool held = false;            // starts in Finish only
    bool started = false;
    std::unique_ptr<Transfer> transfer;  // started
    absl::Status start_status;
  };
  struct Param {
    std::string name;
    std::vector<size_t> buckets;  // the buckets holding a part of it
    bool ready = false;
    int fired = 0;     // accumulations in the current pass
    int expected = 0;  // accumulations in the previous pass
  };
  class Hook;
  GradientBuckets() = default;
  // Registers the hook of parameter params_.back(), `p`.
  void AddHook(const torch::Tensor& p);
  // A gradient accumulated (hook); mu_ held by the caller.
  void Accumulated(size_t param);
  // Starts the buckets from next_start_ on that are ready (all, with
  // `force`), passing over held ones; mu_ held.
  void StartReady(bool force);
  // Starts bucket `b`'s collective; mu_ held.
  void Start(Bucket& b);

  Reduction reduction_ = Reduction::kAllReduceMean;
  int chunk_ = 0;  // kReduceScatterSum: this rank's chunk of every bucket
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  // Each parameter's gradient accumulator (kept alive, so that autograd
  // keeps using the one that holds the hook) and its hook's key, removed
  // again on destruction.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::mutex mu_;
  bool armed_ = false;        // BeginIteration ran, Finish not yet
  bool counting_ = false;     // inside a pass
  bool in_backward_ = false;  // inside the last pass: start when final
  bool has_counts_ = false;
  Transport* transport_ = nullptr;
  std::vector<int> group_;
  size_t next_start_ = 0;
  // A gradient that accumulated again after its bucket started (a pass
  // unlike the one before it): Finish fails with it.
  absl::Status late_;
  int started_in_backward_ = 0;
  int started_now_ = 0;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_GRADIENT_BUCKETS_H_
