// T5's relative position bias (Raffel et al. 2020, section 2.1; T5V11 in
// docs/models.md, "The T5V11 layers"): every pair of query position i and key
// position j inside one sample falls in a bucket of r = j - i, exact for small
// distances and log-spaced up to a maximum distance; each attention head adds
// its learned scalar for that bucket to the pair's score. One table per stack
// (encoder: bidirectional buckets; decoder: causal), used by all its layers.
#ifndef VARIPIPE_EXECUTOR_MODEL_RELATIVE_POSITION_BIAS_H_
#define VARIPIPE_EXECUTOR_MODEL_RELATIVE_POSITION_BIAS_H_

#include <torch/torch.h>

#include <cstdint>

namespace varipipe::executor {

// Buckets of every (query, key) pair: int64 [B, sq, sk] for query positions
// [B, sq] and key positions [B, sk] (int64, positions inside each sample;
// B may be 1). The large-distance branch runs in fp32 as Hugging Face's
// _relative_position_bucket computes it on a CPU, and on the CPU whatever
// the positions' device (a table of the distances up to max_distance, then
// moved), so a checkpoint sees the buckets it was trained with on every
// device.
torch::Tensor RelativePositionBuckets(const torch::Tensor& query_positions,
                                      const torch::Tensor& key_positions, bool bidirectional,
                                      int64_t num_buckets, int64_t max_distance);

// The additive score bias [B, heads, sq, sk] from `table` [num_buckets,
// heads] and RelativePositionBuckets' `buckets`; differentiable in `table`.
torch::Tensor RelativePositionBias(const torch::Tensor& table, const torch::Tensor& buckets);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_RELATIVE_POSITION_BIAS_H_
