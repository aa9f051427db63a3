// The normalisations of the layers and stages: LayerNorm and RMSNorm (Zhang
// and Sennrich 2019) of x [..., h] over its last dimension, with weight [h]
// (and LayerNorm's bias [h]). The statistics are fp32 whatever x's dtype;
// the output is in ComputeDtype(x) (cuda_autocast.h).
//
// With x and the compute dtype fp32 (CPUs, fp32 models) each is its plain
// autograd graph. Under mixed precision (docs/models.md, "Mixed
// precision") each is an autograd function that normalises x in fp32, casts
// the result to the compute dtype, keeps only x (in the compute dtype: the
// residual stream's dtype, not an fp32 copy) and the parameters, and
// recomputes the fp32 normalisation in its backward (one memory-bound pass
// over x), as Megatron-LM's fused norms keep their inputs. Gradients: x's in
// x's dtype, the parameters' in fp32.
#ifndef VARIPIPE_EXECUTOR_MODEL_NORM_H_
#define VARIPIPE_EXECUTOR_MODEL_NORM_H_

#include <torch/torch.h>

namespace varipipe::executor {

// (x - mean) / sqrt(var + epsilon) * weight + bias.
torch::Tensor LayerNormalization(const torch::Tensor& x, const torch::Tensor& weight,
                                 const torch::Tensor& bias, double epsilon);

// x / sqrt(mean(x^2) + epsilon) * weight (as Hugging Face's Llama, whose
// statistic is fp32 too).
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double epsilon);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_NORM_H_
