// Causal attention of a context-parallel rank's local queries against its
// group's gathered keys (common/plan_contract/context_parallel_split.h has
// the split: every sample cut into 2c chunks, rank i holding chunks i and
// 2c - 1 - i). Each local query chunk [a, b) of a sample attends to the
// sample's keys [0, b), bottom-right aligned: the query at position a + t
// sees keys 0 .. a + t. The key prefixes are laid back to back (one gather
// of the all-gathered keys), so one variable-length kernel call covers
// every chunk, with cu_seqlens_q over the query chunks and cu_seqlens_k
// over their prefixes.
//
// This file holds the host-built index tensors and the reference
// computation (explicit fp32 arithmetic, chunk by chunk, differentiable by
// autograd, on any device): it defines what the fused path must equal.
#ifndef VARIPIPE_EXECUTOR_MODEL_CONTEXT_PARALLEL_ATTENTION_H_
#define VARIPIPE_EXECUTOR_MODEL_CONTEXT_PARALLEL_ATTENTION_H_

#include <torch/torch.h>

#include "common/plan_contract/context_parallel_split.h"
#include "executor/model/tensor_group.h"

namespace varipipe::executor {

// The split's index lists as int64 tensors on `device`.
struct ContextParallelIndex {
  torch::Tensor local_tokens;    // [local]: packed token of each local one
  torch::Tensor local_positions; // [local]: position in its own sample
  torch::Tensor key_index;       // [prefix keys]: into the gathered buffer
  torch::Tensor gathered_index;  // [packed]: each packed token's gathered slot

  static ContextParallelIndex Of(const ContextParallelSplit& split, torch::Device device);
};

// x [local, ...] -> [group size * all_gather_count, ...]: every rank's local
// rows, each padded to split.all_gather_count(), rank after rank (the
// layout gathered_index() addresses). Differentiable: the backward
// reduce-scatters the gathered gradient (each slot summed over the group,
// every rank having used every other's keys) and keeps this rank's rows.
// `group` is the context-parallel group (its index is split.index()).
torch::Tensor AllGatherContext(const torch::Tensor& x, const ContextParallelSplit& split,
                               const TensorGroup* group);

// `gathered` [group * all_gather_count, heads, d] (the all-gather of every
// rank's local keys or values, each padded to all_gather_count) -> the
// key prefixes of this rank's query chunks, back to back
// [split.key_offsets().back(), heads, d].
torch::Tensor GatherKeyPrefixes(const torch::Tensor& gathered, const ContextParallelIndex& index);

// q [local, heads, d]; k, v [prefix keys, heads, d] (GatherKeyPrefixes) ->
// [local, heads, d] in q's dtype: softmax(scale q k^T) v per query chunk
// over its key prefix, bottom-right causal, in fp32.
torch::Tensor ReferenceContextParallelAttention(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v,
                                                const ContextParallelSplit& split, double scale);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_CONTEXT_PARALLEL_ATTENTION_H_
