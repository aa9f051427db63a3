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
// This file holds the host-built index tensors, the reference computation
// (explicit fp32 arithmetic, chunk by chunk, differentiable by autograd, on
// any device), which defines what the fused path must equal, and a layer's
// whole context-parallel self-attention (ContextParallelSelfAttention):
// gather, key prefixes, then the reference core or a variable-length
// kernel (variable_length_attention.h) whose cu_seqlens are the split's
// query and key offsets, bottom-right causal.
#ifndef VARIPIPE_EXECUTOR_MODEL_CONTEXT_PARALLEL_ATTENTION_H_
#define VARIPIPE_EXECUTOR_MODEL_CONTEXT_PARALLEL_ATTENTION_H_

#include <torch/torch.h>

#include "common/plan_contract/context_parallel_split.h"
#include "executor/model/tensor_group.h"
#include "executor/model/variable_length_attention.h"
#include "executor/model/variable_length_layout.h"

namespace varipipe::executor {

// The split's index lists as int64 tensors on `device`.
struct ContextParallelIndex {
  torch::Tensor local_tokens;    // [local]: packed token of each local one
  torch::Tensor local_positions; // [local]: position in its own sample
  torch::Tensor key_index;       // [prefix keys]: into the gathered buffer
  torch::Tensor gathered_index;  // [packed]: each packed token's gathered slot

  static ContextParallelIndex Of(const ContextParallelSplit& split, torch::Device device);
};

// One lane's split micro-batch as its layers see it, built once per
// micro-batch: the split, its index tensors on the compute device, the
// positions of its [1, A] rows (local_positions, then 0 at padding) and the
// variable-length layout of its query chunks over their key prefixes
// (bottom-right causal; one row of `local` queries and of the prefixes'
// keys), whose offsets a variable-length kernel takes.
class ContextParallelInput : public torch::CustomClassHolder {
 public:
  ContextParallelInput(ContextParallelSplit split, torch::Device device);

  const ContextParallelSplit& split() const { return split_; }
  const ContextParallelIndex& index() const { return index_; }
  // int64 [1, all_gather_count] on the device.
  const torch::Tensor& positions() const { return positions_; }
  const c10::intrusive_ptr<VariableLengthLayout>& layout() const { return layout_; }

 private:
  ContextParallelSplit split_;
  ContextParallelIndex index_;
  torch::Tensor positions_;
  c10::intrusive_ptr<VariableLengthLayout> layout_;
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

// q [local, heads, d]; k, v [prefix keys, kv_heads, d] (GatherKeyPrefixes;
// kv_heads divides heads, query head i reading key/value head
// i / (heads / kv_heads)) -> [local, heads, d] in q's dtype:
// softmax(scale q k^T) v per query chunk over its key prefix, bottom-right
// causal, in fp32.
torch::Tensor ReferenceContextParallelAttention(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v,
                                                const ContextParallelSplit& split, double scale);

// q [1, A, heads * d] and k, v [1, A, kv_heads * d] of one lane (A =
// all_gather_count: the local tokens first, then padding; kv_heads divides
// heads, fewer under grouped-query attention) -> [1, A, heads * d]: each
// local query's causal attention over its sample's keys gathered from the
// whole group (AllGatherContext of k and v, then GatherKeyPrefixes), zero
// at padding. The group gathers the kv_heads heads and repeats them for
// their query heads afterwards (query head i reads key/value head
// i / (heads / kv_heads)), so a lane sends 2 x kv_heads x d values per
// token and layer, as the planner prices it.
// The core is `kernel` over input.layout() when given (one call; it keeps
// no score tensor), else ReferenceContextParallelAttention, which with
// `recompute` (selective recomputation) keeps only its inputs and is
// re-run in backward. Every lane of `group` must call it for the same
// micro-batch in the same order (its gather and, in backward, its
// reduce-scatter are collectives).
torch::Tensor ContextParallelSelfAttention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v,
                                           const c10::intrusive_ptr<ContextParallelInput>& input,
                                           const TensorGroup* group, int64_t heads,
                                           int64_t kv_heads, double scale,
                                           const VariableLengthKernel* kernel, bool recompute);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_CONTEXT_PARALLEL_ATTENTION_H_
