// Mini-batches for the planning benchmarks: consecutive samples of a
// synthetic mixture (FLAN-like or documents-like, seed 2024), truncated to
// the job's maximum lengths (GPT: target first, then the input in what is
// left), up to data.tokens_per_global_batch tokens each.
#ifndef VARIPIPE_TESTS_BENCH_SYNTHETIC_BATCHES_H_
#define VARIPIPE_TESTS_BENCH_SYNTHETIC_BATCHES_H_

#include <vector>

#include "planner/planner.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

std::vector<MiniBatch> SyntheticBatches(const v1::JobConfig& config, bool documents, int count);

}  // namespace varipipe::planner

#endif  // VARIPIPE_TESTS_BENCH_SYNTHETIC_BATCHES_H_
