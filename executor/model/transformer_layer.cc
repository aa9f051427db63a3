#include "executor/model/transformer_layer.h"

#include <cmath>
#include <string>
#include <vector>

#include "executor/model/attention_mask.h"
#include "executor/model/deferred_linear.h"
#include "executor/model/recompute_precision.h"
#include "executor/model/recomputed_attention.h"
#include "executor/model/weight_grad_store.h"

namespace varipipe::executor {

TransformerLayer::TransformerLayer(const ModelSpec& spec, ModelComponent component, int64_t index,
                                   int64_t total_layers)
    : hidden_(spec.hidden_size),
      heads_(spec.num_attention_heads),
      cross_attention_(component == ModelComponent::kDecoderLayer),
      fused_attention_(spec.attention_kernel == v1::FUSED) {
  Initializer init(spec.seed, component, index);
  const int64_t h = spec.hidden_size;
  const int64_t inner = spec.num_attention_heads * spec.kv_channels;
  const int64_t ffn = spec.ffn_hidden_size;
  const double output_stddev = kInitStddev / std::sqrt(2.0 * static_cast<double>(total_layers));
  // Registration order is the draw order; keep it fixed.
  ln1_weight_ = register_parameter("ln1_weight", Initializer::Ones({h}));
  ln1_bias_ = register_parameter("ln1_bias", Initializer::Zeros({h}));
  qkv_weight_ = register_parameter("qkv_weight", init.Normal({3 * inner, h}, kInitStddev));
  qkv_bias_ = register_parameter("qkv_bias", Initializer::Zeros({3 * inner}));
  proj_weight_ = register_parameter("proj_weight", init.Normal({h, inner}, output_stddev));
  proj_bias_ = register_parameter("proj_bias", Initializer::Zeros({h}));
  if (cross_attention_) {
    lnx_weight_ = register_parameter("lnx_weight", Initializer::Ones({h}));
    lnx_bias_ = register_parameter("lnx_bias", Initializer::Zeros({h}));
    xq_weight_ = register_parameter("xq_weight", init.Normal({inner, h}, kInitStddev));
    xq_bias_ = register_parameter("xq_bias", Initializer::Zeros({inner}));
    xkv_weight_ = register_parameter("xkv_weight", init.Normal({2 * inner, h}, kInitStddev));
    xkv_bias_ = register_parameter("xkv_bias", Initializer::Zeros({2 * inner}));
    xproj_weight_ = register_parameter("xproj_weight", init.Normal({h, inner}, output_stddev));
    xproj_bias_ = register_parameter("xproj_bias", Initializer::Zeros({h}));
  }
  ln2_weight_ = register_parameter("ln2_weight", Initializer::Ones({h}));
  ln2_bias_ = register_parameter("ln2_bias", Initializer::Zeros({h}));
  fc1_weight_ = register_parameter("fc1_weight", init.Normal({ffn, h}, kInitStddev));
  fc1_bias_ = register_parameter("fc1_bias", Initializer::Zeros({ffn}));
  fc2_weight_ = register_parameter("fc2_weight", init.Normal({h, ffn}, output_stddev));
  fc2_bias_ = register_parameter("fc2_bias", Initializer::Zeros({h}));
}

torch::Tensor TransformerLayer::LayerNorm(const torch::Tensor& x, const torch::Tensor& weight,
                                          const torch::Tensor& bias) const {
  return torch::layer_norm(x, {hidden_}, weight, bias, 1e-5);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Full recomputation of one layer: nothing but the inputs is kept; the
// backward re-runs TransformerLayer::Compute with autograd on detached
// inputs and back-propagates through it, which accumulates the parameters'
// gradients directly (as PyTorch's reentrant checkpoint does) and gives the
// inputs' gradients. The masks travel in saved_data (LibTorch's Functions
// take no undefined tensor as an input); `memory` is an input only for
// decoder layers (CheckpointedDecoderLayer). The self mask is passed by
// pointer because it may be undefined (causal, SelfAttentionMaskFor).
void SaveForRecompute(AutogradContext* ctx, TransformerLayer* layer, const torch::Tensor& self_mask,
                      const torch::Tensor& cross_mask) {
  ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
  ctx->saved_data["has_self_mask"] = self_mask.defined();
  if (self_mask.defined()) ctx->saved_data["self_mask"] = self_mask;
  ctx->saved_data["has_cross_mask"] = cross_mask.defined();
  if (cross_mask.defined()) ctx->saved_data["cross_mask"] = cross_mask;
  SaveForwardPrecision(ctx);
  // A split backward's store: the re-run layer's linears record into it.
  ctx->saved_data["weight_grad_store"] = reinterpret_cast<int64_t>(CurrentWeightGradStore());
}

// Re-runs the layer on `x` (and `memory`), leaves requiring gradients, and
// back-propagates `grad` through it.
void Recompute(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& memory,
               const torch::Tensor& grad) {
  auto* layer = reinterpret_cast<TransformerLayer*>(ctx->saved_data["layer"].toInt());
  const torch::Tensor self_mask = ctx->saved_data["has_self_mask"].toBool()
                                      ? ctx->saved_data["self_mask"].toTensor()
                                      : torch::Tensor();
  const torch::Tensor cross_mask = ctx->saved_data["has_cross_mask"].toBool()
                                       ? ctx->saved_data["cross_mask"].toTensor()
                                       : torch::Tensor();
  torch::AutoGradMode enable_grad(true);
  torch::Tensor out;
  {
    const RecomputePrecisionScope precision(ctx);
    const WeightGradScope store(
        reinterpret_cast<WeightGradStore*>(ctx->saved_data["weight_grad_store"].toInt()));
    out = layer->Compute(x, self_mask, memory, cross_mask);
  }
  torch::autograd::backward({out}, {grad});
}

class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               TransformerLayer* layer, const torch::Tensor* self_mask) {
    ctx->save_for_backward({x});
    SaveForRecompute(ctx, layer, *self_mask, torch::Tensor());
    return layer->Compute(x, *self_mask, torch::Tensor(), torch::Tensor());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    Recompute(ctx, x, torch::Tensor(), grad_outputs[0]);
    return {x.grad(), torch::Tensor(), torch::Tensor()};
  }
};

class CheckpointedDecoderLayer : public torch::autograd::Function<CheckpointedDecoderLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& memory, TransformerLayer* layer,
                               const torch::Tensor* self_mask, const torch::Tensor& cross_mask) {
    ctx->save_for_backward({x, memory});
    SaveForRecompute(ctx, layer, *self_mask, cross_mask);
    return layer->Compute(x, *self_mask, memory, cross_mask);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach().requires_grad_(true);
    const torch::Tensor memory = saved[1].detach().requires_grad_(true);
    Recompute(ctx, x, memory, grad_outputs[0]);
    return {x.grad(), memory.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TransformerLayer::Forward(const torch::Tensor& x, const torch::Tensor& self_mask,
                                        const torch::Tensor& memory,
                                        const torch::Tensor& cross_mask) {
  if (recompute_full_ && torch::GradMode::is_enabled()) {
    if (memory.defined()) {
      return CheckpointedDecoderLayer::apply(x, memory, this, &self_mask, cross_mask);
    }
    return CheckpointedLayer::apply(x, this, &self_mask);
  }
  return Compute(x, self_mask, memory, cross_mask);
}

torch::Tensor TransformerLayer::Compute(const torch::Tensor& x, const torch::Tensor& self_mask,
                                        const torch::Tensor& memory,
                                        const torch::Tensor& cross_mask) {
  // Self-attention branch.
  const torch::Tensor qkv =
      DeferredLinear(LayerNorm(x, ln1_weight_, ln1_bias_), qkv_weight_, qkv_bias_);
  const std::vector<torch::Tensor> parts = qkv.chunk(3, -1);
  // The fused kernel keeps no score tensors: selective recomputation has
  // nothing to drop.
  const auto attention = fused_attention_       ? FusedAttention
                         : recompute_attention_ ? RecomputedMaskedAttention
                                                : MaskedAttention;
  torch::Tensor y = x + DeferredLinear(attention(parts[0], parts[1], parts[2], self_mask, heads_),
                                       proj_weight_, proj_bias_);
  // Cross-attention branch (T5 decoder): queries from the decoder, keys and
  // values from the encoder output.
  if (cross_attention_) {
    const torch::Tensor q =
        DeferredLinear(LayerNorm(y, lnx_weight_, lnx_bias_), xq_weight_, xq_bias_);
    const std::vector<torch::Tensor> kv =
        DeferredLinear(memory, xkv_weight_, xkv_bias_).chunk(2, -1);
    y = y +
        DeferredLinear(attention(q, kv[0], kv[1], cross_mask, heads_), xproj_weight_, xproj_bias_);
  }
  // MLP branch.
  const torch::Tensor hidden =
      torch::gelu(DeferredLinear(LayerNorm(y, ln2_weight_, ln2_bias_), fc1_weight_, fc1_bias_));
  return y + DeferredLinear(hidden, fc2_weight_, fc2_bias_);
}

}  // namespace varipipe::executor
