// Boolean attention masks ([b, 1, queries, keys], true = may attend) built
// from the real lengths of padded samples. Padding is always at the end of a
// sample, so with these masks the outputs at real positions do not depend on
// how far a sample was padded (the property dynamic micro-batching relies
// on: the same sample gives the same result in any micro-batch).
#ifndef VARIPIPE_EXECUTOR_MODEL_ATTENTION_MASK_H_
#define VARIPIPE_EXECUTOR_MODEL_ATTENTION_MASK_H_

#include <torch/torch.h>

namespace varipipe::executor {

// Self-attention over a padded sequence of length `padded`: keys beyond a
// sample's length are hidden, and with `causal` every query sees only keys
// at or before it. `lengths` is int64 [b], each in [1, padded].
torch::Tensor SelfAttentionMask(const torch::Tensor& lengths, int64_t padded, bool causal);

// Cross-attention from `queries` decoder positions to an encoder output
// padded to `padded_keys`: keys beyond the encoder length are hidden.
torch::Tensor CrossAttentionMask(const torch::Tensor& key_lengths, int64_t queries,
                                 int64_t padded_keys);

// Packed rows (several samples back to back; `segments` int64 [b, s] gives
// each position's sample within its row, -1 for padding): a query attends
// only to keys of its own sample (block-diagonal, and causal with `causal`),
// so no sample sees another. Padding queries attend to every key, which keeps
// their softmax finite; their outputs reach no loss.
torch::Tensor SegmentSelfAttentionMask(const torch::Tensor& segments, bool causal);

// Packed T5 cross-attention: decoder position q attends to the encoder
// positions of the same sample (`query_segments` [b, t], `key_segments`
// [b, s]); decoder padding attends to every key.
torch::Tensor SegmentCrossAttentionMask(const torch::Tensor& query_segments,
                                        const torch::Tensor& key_segments);

// Scaled dot-product attention of q [b, sq, heads*d], k, v [b, sk, heads*d]
// under `mask` [b, 1, sq, sk]; returns [b, sq, heads*d].
torch::Tensor MaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, int64_t heads);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_ATTENTION_MASK_H_
