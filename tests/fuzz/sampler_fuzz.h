// Shared by the dataset fuzz targets: sample lengths drawn into mini-batches
// by the training sampler, as planner daemons and executors draw them.
#ifndef VARIPIPE_TESTS_FUZZ_SAMPLER_FUZZ_H_
#define VARIPIPE_TESTS_FUZZ_SAMPLER_FUZZ_H_

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/synthetic_mixture.h"

namespace varipipe::fuzz {

inline void DrawMiniBatches(const std::vector<SampleLengths>& lengths) {
  // Budgets small enough for the seeds' few samples to fill mini-batches.
  const SamplerOptions jobs[] = {
      {.seed = 7, .tokens_per_global_batch = 24, .max_input_len = 16},
      {.seed = 11,
       .tokens_per_global_batch = 24,
       .encoder_decoder = true,
       .max_input_len = 16,
       .max_target_len = 8},
      {.seed = 3, .tokens_per_global_batch = 2048, .max_input_len = 256}};
  for (const SamplerOptions& options : jobs) {
    absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler =
        MiniBatchSampler::Create(lengths, options);
    if (!sampler.ok()) continue;
    for (uint64_t iteration : {0, 1, 2}) {
      const SampledMiniBatch mb = (*sampler)->Get(iteration);
      uint64_t tokens = 0;
      for (const SampleLengths& s : mb.lengths) tokens += uint64_t{s.input} + s.target;
      if (mb.sample_ids.empty() || mb.sample_ids.size() != mb.lengths.size() ||
          tokens > options.tokens_per_global_batch) {
        std::fprintf(stderr, "mini-batch %lu: %zu samples, %lu tokens\n",
                     static_cast<unsigned long>(iteration), mb.sample_ids.size(),
                     static_cast<unsigned long>(tokens));
        std::abort();
      }
      for (uint64_t id : mb.sample_ids) {
        if (id >= lengths.size()) std::abort();
      }
    }
  }
}

}  // namespace varipipe::fuzz

#endif  // VARIPIPE_TESTS_FUZZ_SAMPLER_FUZZ_H_
