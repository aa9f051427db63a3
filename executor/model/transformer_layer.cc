#include "executor/model/transformer_layer.h"

#include <cmath>
#include <string>

#include "executor/model/attention_mask.h"
#include "executor/model/recomputed_attention.h"

namespace varipipe::executor {

TransformerLayer::TransformerLayer(const ModelSpec& spec, ModelComponent component, int64_t index,
                                   int64_t total_layers)
    : hidden_(spec.hidden_size),
      heads_(spec.num_attention_heads),
      cross_attention_(component == ModelComponent::kDecoderLayer) {
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

torch::Tensor TransformerLayer::Forward(const torch::Tensor& x, const torch::Tensor& self_mask,
                                        const torch::Tensor& memory,
                                        const torch::Tensor& cross_mask) {
  // Self-attention branch.
  const torch::Tensor qkv = torch::linear(LayerNorm(x, ln1_weight_, ln1_bias_), qkv_weight_,
                                          qkv_bias_);
  const std::vector<torch::Tensor> parts = qkv.chunk(3, -1);
  const auto attention = recompute_attention_ ? RecomputedMaskedAttention : MaskedAttention;
  torch::Tensor y = x + torch::linear(attention(parts[0], parts[1], parts[2], self_mask, heads_),
                                      proj_weight_, proj_bias_);
  // Cross-attention branch (T5 decoder): queries from the decoder, keys and
  // values from the encoder output.
  if (cross_attention_) {
    const torch::Tensor q = torch::linear(LayerNorm(y, lnx_weight_, lnx_bias_), xq_weight_,
                                          xq_bias_);
    const std::vector<torch::Tensor> kv = torch::linear(memory, xkv_weight_, xkv_bias_).chunk(2, -1);
    y = y + torch::linear(attention(q, kv[0], kv[1], cross_mask, heads_), xproj_weight_,
                          xproj_bias_);
  }
  // MLP branch.
  const torch::Tensor hidden =
      torch::gelu(torch::linear(LayerNorm(y, ln2_weight_, ln2_bias_), fc1_weight_, fc1_bias_));
  return y + torch::linear(hidden, fc2_weight_, fc2_bias_);
}

}  // namespace varipipe::executor
