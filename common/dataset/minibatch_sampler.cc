#include "common/dataset/minibatch_sampler.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/mix64.h"

namespace varipipe {

absl::StatusOr<std::unique_ptr<MiniBatchSampler>> MiniBatchSampler::Create(
    std::vector<SampleLengths> lengths, const SamplerOptions& options) {
  if (lengths.empty()) return absl::InvalidArgumentError("sampler: the dataset has no samples");
  if (options.tokens_per_global_batch == 0 || options.max_input_len == 0 ||
      (options.encoder_decoder && options.max_target_len == 0)) {
    return absl::InvalidArgumentError("sampler: token budget and maximum lengths must be set");
  }
  std::unique_ptr<MiniBatchSampler> s(new MiniBatchSampler(std::move(lengths), options));
  if (s->MiniBatchesInEpoch(0) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("sampler: the dataset's ", s->lengths_.size(),
                                                   " samples do not fill one mini-batch of ",
                                                   options.tokens_per_global_batch, " tokens"));
  }
  return s;
}

SamplerOptions SamplerOptionsFromConfig(const v1::JobConfig& config) {
  return {.seed = config.data().seed(),
          .tokens_per_global_batch = config.data().tokens_per_global_batch(),
          .encoder_decoder = config.model().kind() == v1::T5,
          .max_input_len = config.data().max_sequence_length(),
          .max_target_len = config.data().max_target_length()};
}

SampleLengths TruncateSample(SampleLengths s, const SamplerOptions& options) {
  if (options.encoder_decoder) {
    return {std::min(s.input, options.max_input_len), std::min(s.target, options.max_target_len)};
  }
  const uint32_t target = std::min(s.target, options.max_input_len);
  return {std::min(s.input, options.max_input_len - target), target};
}

MiniBatchSampler::Epoch MiniBatchSampler::BuildEpoch(uint64_t epoch) const {
  Epoch e;
  e.order.resize(lengths_.size());
  std::iota(e.order.begin(), e.order.end(), uint64_t{0});
  uint64_t state = Mix64(options_.seed) ^ Mix64(epoch + 0x5851f42d4c957f2dULL);
  for (uint64_t i = e.order.size(); i > 1; --i) {
    state = Mix64(state);
    std::swap(e.order[i - 1], e.order[state % i]);
  }
  uint64_t tokens = 0;
  e.starts.push_back(0);
  for (uint64_t k = 0; k < e.order.size(); ++k) {
    const SampleLengths s = Truncate(lengths_[e.order[k]]);
    const uint64_t n = uint64_t{s.input} + s.target;
    if (tokens > 0 && tokens + n > options_.tokens_per_global_batch) {
      e.starts.push_back(k);
      tokens = 0;
    }
    tokens += n;
  }
  // The last mini-batch runs from starts.back() to the end of the order. It
  // is kept only when it reached the budget exactly; otherwise it is the
  // partial batch that is dropped, and its start closes the last full one.
  if (tokens == options_.tokens_per_global_batch) e.starts.push_back(e.order.size());
  return e;
}

uint64_t MiniBatchSampler::MiniBatchesInEpoch(uint64_t epoch) const {
  return BuildEpoch(epoch).starts.size() - 1;
}

std::pair<uint64_t, uint64_t> MiniBatchSampler::Locate(uint64_t iteration) const {
  absl::MutexLock lock(&mu_);
  while (first_iteration_.back() <= iteration) {
    const uint64_t epoch = first_iteration_.size() - 1;
    first_iteration_.push_back(first_iteration_.back() + MiniBatchesInEpoch(epoch));
  }
  const auto it = std::upper_bound(first_iteration_.begin(), first_iteration_.end(), iteration);
  const uint64_t epoch = static_cast<uint64_t>(it - first_iteration_.begin()) - 1;
  return {epoch, iteration - first_iteration_[epoch]};
}

SampledMiniBatch MiniBatchSampler::Get(uint64_t iteration) const {
  const auto [epoch, index] = Locate(iteration);
  std::shared_ptr<const Epoch> e;
  {
    absl::MutexLock lock(&mu_);
    if (cached_epoch_ != epoch) {
      cached_ = std::make_shared<const Epoch>(BuildEpoch(epoch));
      cached_epoch_ = epoch;
    }
    e = cached_;
  }
  SampledMiniBatch mb;
  mb.iteration = iteration;
  mb.epoch = epoch;
  for (uint64_t k = e->starts[index]; k < e->starts[index + 1]; ++k) {
    mb.sample_ids.push_back(e->order[k]);
    mb.lengths.push_back(Truncate(lengths_[e->order[k]]));
  }
  return mb;
}

}  // namespace varipipe
