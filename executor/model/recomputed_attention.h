// Selective activation recomputation (Korthikanti et al., "Reducing
// Activation Recomputation in Large Transformer Models", section 4.2; the
// planner's RECOMPUTE_SELECTIVE): the attention core, QK^T scores, masking,
// softmax and the context P.V, keeps none of its [b, heads, sq, sk]
// intermediates for the backward pass. Only its inputs q, k, v and the mask
// are stored; the backward pass recomputes the core from them (under the
// forward's autocast state) and differentiates it. Values and gradients are
// those of MaskedAttention.
#ifndef VARIPIPE_EXECUTOR_MODEL_RECOMPUTED_ATTENTION_H_
#define VARIPIPE_EXECUTOR_MODEL_RECOMPUTED_ATTENTION_H_

#include <torch/torch.h>

namespace varipipe::executor {

// MaskedAttention (attention_mask.h) whose core is recomputed in backward;
// a `bias` (T5V11) is kept as an input and gets its gradient.
torch::Tensor RecomputedMaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const torch::Tensor& mask,
                                        int64_t heads, const torch::Tensor& bias = torch::Tensor(),
                                        bool scaled = true);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_RECOMPUTED_ATTENTION_H_
