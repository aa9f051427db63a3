// The deterministic mini-batch sampler: which samples form the global
// mini-batch of each training iteration.
//
// Epoch e visits the dataset in a shuffled order (Fisher-Yates driven by
// SplitMix64 of (seed, e): the same on every machine). Walking that order,
// samples are added to the current mini-batch while its token count stays
// within tokens_per_global_batch; a sample that does not fit starts the
// next mini-batch. Token counts use each sample truncated to the maximum
// lengths (decoder-only: input + target capped at max_input_len, keeping the
// target; encoder-decoder: each side capped). The last, partial mini-batch of
// an epoch is dropped. Iteration i maps to exactly one mini-batch, which any
// process computes from the lengths alone.
//
// Thread safety: Get() may be called concurrently (an internal cache of
// epoch boundaries is guarded by a mutex).
#ifndef VARIPIPE_COMMON_DATASET_MINIBATCH_SAMPLER_H_
#define VARIPIPE_COMMON_DATASET_MINIBATCH_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dataset/synthetic_mixture.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {

struct SamplerOptions {
  uint64_t seed = 0;
  uint64_t tokens_per_global_batch = 0;
  bool encoder_decoder = false;
  uint32_t max_input_len = 0;   // decoder-only: the whole sequence
  uint32_t max_target_len = 0;  // encoder-decoder only
};

// The sampler options of a job (defaults applied): its seed, token budget,
// model kind and maximum lengths. Planner daemons and executors both use it,
// so they draw and truncate the same samples.
SamplerOptions SamplerOptionsFromConfig(const v1::JobConfig& config);

// A sample truncated to the maximum lengths: T5 truncates input and target
// separately; GPT keeps as much of the target as fits the sequence and fills
// the rest with the input. Executors truncate tokens the same way (prefixes).
SampleLengths TruncateSample(SampleLengths s, const SamplerOptions& options);

struct SampledMiniBatch {
  uint64_t iteration = 0;
  uint64_t epoch = 0;
  std::vector<uint64_t> sample_ids;
  std::vector<SampleLengths> lengths;  // truncated, parallel to sample_ids
};

class MiniBatchSampler {
 public:
  // InvalidArgument for no samples, a zero budget or maxima, or when an epoch
  // cannot fill a single mini-batch.
  static absl::StatusOr<std::unique_ptr<MiniBatchSampler>> Create(
      std::vector<SampleLengths> lengths, const SamplerOptions& options);

  SampledMiniBatch Get(uint64_t iteration) const;
  // Mini-batches of epoch `epoch` (computes the epoch if needed).
  uint64_t MiniBatchesInEpoch(uint64_t epoch) const;

  // TruncateSample with this sampler's options.
  SampleLengths Truncate(SampleLengths s) const { return TruncateSample(s, options_); }

 private:
  MiniBatchSampler(std::vector<SampleLengths> lengths, const SamplerOptions& options)
      : lengths_(std::move(lengths)), options_(options) {}

  struct Epoch {
    std::vector<uint64_t> order;   // permutation of the samples
    std::vector<uint64_t> starts;  // mini-batch k = order[starts[k], starts[k + 1])
  };
  Epoch BuildEpoch(uint64_t epoch) const;
  // Ensures epochs up to the one holding `iteration` are counted; returns
  // that epoch and the iteration's index inside it.
  std::pair<uint64_t, uint64_t> Locate(uint64_t iteration) const;

  const std::vector<SampleLengths> lengths_;
  const SamplerOptions options_;
  mutable absl::Mutex mu_;
  // first_iteration_[e] = first iteration of epoch e; one more entry than
  // epochs counted.
  mutable std::vector<uint64_t> first_iteration_ ABSL_GUARDED_BY(mu_) = {0};
  mutable uint64_t cached_epoch_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};
  mutable std::shared_ptr<const Epoch> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_MINIBATCH_SAMPLER_H_
