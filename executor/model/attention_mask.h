// Boolean attention masks ([b, 1, queries, keys], true = may attend) built
// from the real lengths of padded samples. Padding is always at the end of a
// sample, so with these masks the outputs at real positions do not depend on
// how far a sample was padded (the property dynamic micro-batching relies
// on: the same sample gives the same result in any micro-batch).
#ifndef VARIPIPE_EXECUTOR_MODEL_ATTENTION_MASK_H_
#define VARIPIPE_EXECUTOR_MODEL_ATTENTION_MASK_H_

#include <torch/torch.h>

#include <functional>

#include "executor/model/attention_input.h"
#include "varipipe/v1/config.pb.h"

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

// An attention core: q [b, sq, heads*d], k, v [b, sk, heads*d] under a
// causal or dense-mask input, with its optional score bias.
using AttentionCore = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v,
                                                  const AttentionInput& input)>;

// Attention computed per sample of packed rows (`layout`,
// variable_length_layout.h): `core` runs once per sample over that sample's
// own queries and keys (causal or full, as the layout says), so its cost and
// memory are the sum over samples of their lengths squared rather than the
// row length squared. T5V11's `bias` [B, heads, sq, sk] is sliced per sample
// (relative positions do not change within a sample). Outputs at padding
// queries are zero (they reach no loss). At real queries the values equal
// `core` under the block-diagonal masks (SegmentSelfAttentionMask,
// SegmentCrossAttentionMask) up to rounding. The reference for the
// variable-length kernels (variable_length_attention.h), and the path of
// devices and models they do not serve.
torch::Tensor PerSampleAttention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const VariableLengthLayout& layout,
                                 const torch::Tensor& bias, const AttentionCore& core);

// The self-attention input a layer running `kernel` needs: with FUSED and
// `causal`, Causal (no mask; see MaskedAttention), so the fused kernel runs
// without an s x s mask (FlashAttention); otherwise SelfAttentionMask.
AttentionInput SelfAttentionMaskFor(v1::AttentionKernel kernel, const torch::Tensor& lengths,
                                   int64_t padded, bool causal);

// Scaled dot-product attention of q [b, sq, heads*d], k, v [b, sk, heads*d]
// under `mask` [b, 1, sq, sk]; returns [b, sq, heads*d]. Explicit kernel:
// the [b, heads, sq, sk] scores and probabilities are materialised (and kept
// by autograd). An undefined `mask` means causal (sq == sk): with padding at
// the end of each sample this is SelfAttentionMask(lengths, s, causal) for
// every real query; padding queries also see the padding keys before them,
// which changes only padding outputs (they reach no loss). T5V11: `bias`
// [B, heads, sq, sk] (B 1 or b; relative_position_bias.h) is added to the
// scores, and `scaled` false leaves out the 1/sqrt(d).
torch::Tensor MaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, int64_t heads,
                              const torch::Tensor& bias = torch::Tensor(), bool scaled = true);

// Whether this build's LibTorch has the fused kernel
// (torch::scaled_dot_product_attention, LibTorch 2.0 or newer).
bool FusedAttentionAvailable();

// MaskedAttention through torch's scaled_dot_product_attention: no score
// tensor is kept for backward (FlashAttention or memory-efficient attention
// on GPUs; an undefined mask runs it with is_causal). Same values as
// MaskedAttention up to rounding. REQUIRES: FusedAttentionAvailable()
// (throws c10::Error otherwise).
// With a `bias` the kernel gets it (masked with -inf) as a float mask, which
// it keeps for backward: [B, heads, sq, sk] per layer.
torch::Tensor FusedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, int64_t heads,
                             const torch::Tensor& bias = torch::Tensor(), bool scaled = true);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_ATTENTION_MASK_H_
