// The LM head and its loss on the labelled positions only, a chunk of
// tokens at a time (docs/models.md, "The loss head"): a fused linear +
// cross-entropy that never holds the logits of more than `chunk_tokens`
// tokens, so no [tokens, vocabulary] tensor exists in the forward or the
// backward.
//
// For labelled rows x_i (the final norm's outputs at the positions whose
// label y_i >= 0, gathered beforehand) and this tensor rank's vocabulary rows
// W (ids begin .. begin + rows - 1; the whole vocabulary on one rank):
//
//   forward, per chunk: z = x W^T in the compute dtype (the CUDA autocast
//     dtype on a GPU under mixed precision, else x's), cast to fp32; each
//     token's log-sum-exp over the chunk's columns and its target logit z_y
//     (from the rank holding y). Then lse_i = log sum_ranks exp(lse_rank,i)
//     (one all-gather of n values per rank) and z_y summed over the ranks
//     (one all-reduce); loss = sum_i (lse_i - z_{i,y_i}), a fp32 scalar, the
//     same on every rank.
//   backward, per chunk: z again (one more matrix product than an unchunked
//     head: nothing [n, rows]-sized is kept), g = (softmax(z) - onehot(y)) *
//     grad in fp32, cast to the compute dtype; grad_x = g W and grad_W +=
//     g^T x (accumulated in fp32 over the chunks), with no communication
//     (the caller's CopyToTensorRegion sums grad_x over the ranks).
//
// The weight enters as the iteration's one copy in the compute dtype
// (weight_cast_cache.h; the parameter itself when it has that dtype), in
// the forward and the backward; grad_W is returned in fp32.
//
// It keeps x (in the compute dtype), the labels and lse: n (h + 3) values.
// Its transient is one chunk's logits in the compute dtype and in fp32 (and
// in the backward their gradient in the compute dtype), plus grad_W in fp32.
// The weight gradient is computed in the backward itself, also under a
// split backward (zero-bubble schedules): deferring it would keep either the
// [n, rows] logit gradients or x for a second recomputation; the planner's
// split rule counts the head's weight FLOPs in B (planner/schedule/
// backward_split.h).
#ifndef VARIPIPE_EXECUTOR_MODEL_CHUNKED_LOSS_HEAD_H_
#define VARIPIPE_EXECUTOR_MODEL_CHUNKED_LOSS_HEAD_H_

#include <torch/torch.h>

#include <cstdint>

#include "executor/model/tensor_group.h"

namespace varipipe::executor {

// x [n, h], weight [rows, h] (vocabulary ids begin .. begin + rows - 1),
// labels int64 [n] (< 0: no loss; the others within the vocabulary), on
// x's device; chunk_tokens >= 1. Returns the summed loss, a fp32 scalar.
torch::Tensor ChunkedLinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight,
                                        const torch::Tensor& labels, int64_t begin,
                                        const TensorGroup& group, int64_t chunk_tokens);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_CHUNKED_LOSS_HEAD_H_
