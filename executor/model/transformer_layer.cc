#include "executor/model/transformer_layer.h"

#include <cmath>
#include <string>
#include <vector>

#include "executor/model/attention_mask.h"
#include "executor/model/context_parallel_attention.h"
#include "executor/model/cuda_autocast.h"
#include "executor/model/deferred_linear.h"
#include "executor/model/recompute_precision.h"
#include "executor/model/recomputed_attention.h"
#include "executor/model/rotary.h"
#include "executor/model/tensor_parallel_ops.h"
#include "executor/model/tensor_shard.h"
#include "executor/model/variable_length_attention.h"
#include "executor/model/weight_cast_cache.h"
#include "executor/model/weight_grad_store.h"

namespace varipipe::executor {

namespace {

// The group of a layer without tensor parallelism.
const TensorGroup& SingleRank() {
  static const TensorGroup* const kGroup = new TensorGroup();
  return *kGroup;
}

}  // namespace

TransformerLayer::TransformerLayer(const ModelSpec& spec, ModelComponent component, int64_t index,
                                   int64_t total_layers, const TensorGroup* tensor)
    : tensor_(tensor != nullptr ? tensor : &SingleRank()),
      hidden_(spec.hidden_size),
      heads_(spec.num_attention_heads / tensor_->size()),
      llama_(spec.llama),
      t5v11_(spec.t5v11),
      kv_heads_((spec.llama ? spec.num_key_value_heads : spec.num_attention_heads) /
                tensor_->size()),
      norm_epsilon_(spec.norm_epsilon),
      cross_attention_(component == ModelComponent::kDecoderLayer),
      fused_attention_(spec.attention_kernel == v1::FUSED) {
  TORCH_CHECK(tensor_->size() == spec.tensor_parallel, "a tensor group of ", tensor_->size(),
              " ranks for a model of tensor-parallel degree ", spec.tensor_parallel);
  Initializer init(spec.seed, component, index);
  const double output_stddev = kInitStddev / std::sqrt(2.0 * static_cast<double>(total_layers));
  if (llama_) {
    RegisterLlama(spec, init, output_stddev);
  } else if (t5v11_) {
    RegisterT5V11(spec, init, output_stddev);
  } else {
    RegisterMegatron(spec, init, output_stddev);
  }
}

// Registration order is the draw order; keep it fixed (docs/models.md).
void TransformerLayer::RegisterLlama(const ModelSpec& spec, Initializer& init,
                                     double output_stddev) {
  const int64_t h = spec.hidden_size;
  const int64_t inner = spec.num_attention_heads * spec.kv_channels;
  const int64_t kv_inner = spec.num_key_value_heads * spec.kv_channels;
  const int64_t ffn = spec.ffn_hidden_size;
  attn_norm_weight_ = RegisterShard("attn_norm_weight", Initializer::Ones({h}));
  q_weight_ = RegisterShard("q_weight", init.Normal({inner, h}, kInitStddev));
  k_weight_ = RegisterShard("k_weight", init.Normal({kv_inner, h}, kInitStddev));
  v_weight_ = RegisterShard("v_weight", init.Normal({kv_inner, h}, kInitStddev));
  o_weight_ = RegisterShard("o_weight", init.Normal({h, inner}, output_stddev));
  mlp_norm_weight_ = RegisterShard("mlp_norm_weight", Initializer::Ones({h}));
  gate_weight_ = RegisterShard("gate_weight", init.Normal({ffn, h}, kInitStddev));
  up_weight_ = RegisterShard("up_weight", init.Normal({ffn, h}, kInitStddev));
  down_weight_ = RegisterShard("down_weight", init.Normal({h, ffn}, output_stddev));
}

// Registration order is the draw order (docs/models.md): q, k, v, o, then
// (decoder) xq, xk, xv, xo, then gate, up, down; norms draw nothing.
void TransformerLayer::RegisterT5V11(const ModelSpec& spec, Initializer& init,
                                     double output_stddev) {
  const int64_t h = spec.hidden_size;
  const int64_t inner = spec.num_attention_heads * spec.kv_channels;
  const int64_t ffn = spec.ffn_hidden_size;
  attn_norm_weight_ = RegisterShard("attn_norm_weight", Initializer::Ones({h}));
  q_weight_ = RegisterShard("q_weight", init.Normal({inner, h}, kInitStddev));
  k_weight_ = RegisterShard("k_weight", init.Normal({inner, h}, kInitStddev));
  v_weight_ = RegisterShard("v_weight", init.Normal({inner, h}, kInitStddev));
  o_weight_ = RegisterShard("o_weight", init.Normal({h, inner}, output_stddev));
  if (cross_attention_) {
    cross_norm_weight_ = RegisterShard("cross_norm_weight", Initializer::Ones({h}));
    xq_weight_ = RegisterShard("xq_weight", init.Normal({inner, h}, kInitStddev));
    xk_weight_ = RegisterShard("xk_weight", init.Normal({inner, h}, kInitStddev));
    xv_weight_ = RegisterShard("xv_weight", init.Normal({inner, h}, kInitStddev));
    xo_weight_ = RegisterShard("xo_weight", init.Normal({h, inner}, output_stddev));
  }
  mlp_norm_weight_ = RegisterShard("mlp_norm_weight", Initializer::Ones({h}));
  gate_weight_ = RegisterShard("gate_weight", init.Normal({ffn, h}, kInitStddev));
  up_weight_ = RegisterShard("up_weight", init.Normal({ffn, h}, kInitStddev));
  down_weight_ = RegisterShard("down_weight", init.Normal({h, ffn}, output_stddev));
}

// Registration order is the draw order; keep it fixed.
void TransformerLayer::RegisterMegatron(const ModelSpec& spec, Initializer& init,
                                        double output_stddev) {
  const int64_t h = spec.hidden_size;
  const int64_t inner = spec.num_attention_heads * spec.kv_channels;
  const int64_t ffn = spec.ffn_hidden_size;
  ln1_weight_ = RegisterShard("ln1_weight", Initializer::Ones({h}));
  ln1_bias_ = RegisterShard("ln1_bias", Initializer::Zeros({h}));
  qkv_weight_ = RegisterShard("qkv_weight", init.Normal({3 * inner, h}, kInitStddev));
  qkv_bias_ = RegisterShard("qkv_bias", Initializer::Zeros({3 * inner}));
  proj_weight_ = RegisterShard("proj_weight", init.Normal({h, inner}, output_stddev));
  proj_bias_ = RegisterShard("proj_bias", Initializer::Zeros({h}));
  if (cross_attention_) {
    lnx_weight_ = RegisterShard("lnx_weight", Initializer::Ones({h}));
    lnx_bias_ = RegisterShard("lnx_bias", Initializer::Zeros({h}));
    xq_weight_ = RegisterShard("xq_weight", init.Normal({inner, h}, kInitStddev));
    xq_bias_ = RegisterShard("xq_bias", Initializer::Zeros({inner}));
    xkv_weight_ = RegisterShard("xkv_weight", init.Normal({2 * inner, h}, kInitStddev));
    xkv_bias_ = RegisterShard("xkv_bias", Initializer::Zeros({2 * inner}));
    xproj_weight_ = RegisterShard("xproj_weight", init.Normal({h, inner}, output_stddev));
    xproj_bias_ = RegisterShard("xproj_bias", Initializer::Zeros({h}));
  }
  ln2_weight_ = RegisterShard("ln2_weight", Initializer::Ones({h}));
  ln2_bias_ = RegisterShard("ln2_bias", Initializer::Zeros({h}));
  fc1_weight_ = RegisterShard("fc1_weight", init.Normal({ffn, h}, kInitStddev));
  fc1_bias_ = RegisterShard("fc1_bias", Initializer::Zeros({ffn}));
  fc2_weight_ = RegisterShard("fc2_weight", init.Normal({h, ffn}, output_stddev));
  fc2_bias_ = RegisterShard("fc2_bias", Initializer::Zeros({h}));
}

// Every rank draws the whole tensor, so the draw order and the values are
// those of the unsharded layer, and keeps its part.
torch::Tensor TransformerLayer::RegisterShard(const std::string& name, const torch::Tensor& full) {
  return register_parameter(
      name, ShardOf(full, ShardOfParameter(name), tensor_->size(), tensor_->index()));
}

torch::Tensor TransformerLayer::Enter(const torch::Tensor& x, int64_t length) const {
  return EnterTensorRegion(x, *tensor_, length);
}

torch::Tensor TransformerLayer::RowParallel(const torch::Tensor& x, const torch::Tensor& weight,
                                            const torch::Tensor& bias) const {
  // One rank: the bias inside the linear, as before tensor parallelism.
  if (tensor_->size() == 1) return DeferredLinear(x, weight, bias);
  const torch::Tensor summed = LeaveTensorRegion(DeferredLinear(x, weight), *tensor_);
  // The bias in the residual stream's dtype (its cached copy under mixed
  // precision).
  return bias.defined() ? summed + Replicated(ParameterIn(bias, summed.scalar_type())) : summed;
}

torch::Tensor TransformerLayer::Replicated(const torch::Tensor& p) const {
  return SequenceParallelParameter(p, *tensor_);
}

torch::Tensor TransformerLayer::LayerNorm(const torch::Tensor& x, const torch::Tensor& weight,
                                          const torch::Tensor& bias) const {
  return LayerNormalization(x, weight, bias, 1e-5);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Full recomputation of one layer: nothing but the inputs is kept; the
// backward re-runs TransformerLayer::Compute with autograd on detached
// inputs and back-propagates through it, which accumulates the parameters'
// gradients directly (as PyTorch's reentrant checkpoint does) and gives the
// inputs' gradients. The attention inputs travel in saved_data
// (AttentionInput::SaveTo) and are passed to the Functions by pointer (they
// are not tensors); `memory` is an input only for decoder layers
// (CheckpointedDecoderLayer), and a T5V11 position bias is an input (it has a
// gradient), a LLAMA rotary table saved data.
void SaveForRecompute(AutogradContext* ctx, TransformerLayer* layer,
                      const AttentionInput& self_input, const AttentionInput& cross_input,
                      const torch::Tensor& rotary, int64_t length) {
  ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
  ctx->saved_data["length"] = length;
  ctx->saved_data["has_rotary"] = rotary.defined();
  if (rotary.defined()) ctx->saved_data["rotary"] = rotary;
  self_input.SaveTo(ctx, "self");
  cross_input.SaveTo(ctx, "cross");
  SaveForwardPrecision(ctx);
  // A split backward's store: the re-run layer's linears record into it.
  ctx->saved_data["weight_grad_store"] = reinterpret_cast<int64_t>(CurrentWeightGradStore());
}

// Re-runs the layer on `x` (and `memory`) with `position` (a detached bias
// that requires its gradient) or the saved rotary table, leaves requiring
// gradients, and back-propagates `grad` through it.
void Recompute(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& memory,
               const torch::Tensor& position, const torch::Tensor& grad) {
  auto* layer = reinterpret_cast<TransformerLayer*>(ctx->saved_data["layer"].toInt());
  const AttentionInput self_input = AttentionInput::LoadFrom(ctx, "self");
  const AttentionInput cross_input = AttentionInput::LoadFrom(ctx, "cross");
  const torch::Tensor rotary = ctx->saved_data["has_rotary"].toBool()
                                   ? ctx->saved_data["rotary"].toTensor()
                                   : torch::Tensor();
  torch::AutoGradMode enable_grad(true);
  torch::Tensor out;
  {
    const RecomputePrecisionScope precision(ctx);
    const WeightGradScope store(
        reinterpret_cast<WeightGradStore*>(ctx->saved_data["weight_grad_store"].toInt()));
    out = layer->Compute(x, self_input, memory, cross_input, position.defined() ? position : rotary,
                         ctx->saved_data["length"].toInt());
  }
  torch::autograd::backward({out}, {grad});
}

class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  // `rotary` by pointer: it is undefined for MEGATRON layers.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               TransformerLayer* layer, const AttentionInput* self_input,
                               const torch::Tensor* rotary, int64_t length) {
    ctx->save_for_backward({x});
    SaveForRecompute(ctx, layer, *self_input, AttentionInput(), *rotary, length);
    return layer->Compute(x, *self_input, torch::Tensor(), AttentionInput(), *rotary, length);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    Recompute(ctx, x, torch::Tensor(), torch::Tensor(), grad_outputs[0]);
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class CheckpointedDecoderLayer : public torch::autograd::Function<CheckpointedDecoderLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& memory, TransformerLayer* layer,
                               const AttentionInput* self_input, const AttentionInput* cross_input,
                               int64_t length) {
    ctx->save_for_backward({x, memory});
    SaveForRecompute(ctx, layer, *self_input, *cross_input, torch::Tensor(), length);
    return layer->Compute(x, *self_input, memory, *cross_input, torch::Tensor(), length);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach().requires_grad_(true);
    const torch::Tensor memory = saved[1].detach().requires_grad_(true);
    Recompute(ctx, x, memory, torch::Tensor(), grad_outputs[0]);
    return {x.grad(),        memory.grad(),   torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// T5V11 encoder layers: the position bias is an input with a gradient.
class CheckpointedBiasedLayer : public torch::autograd::Function<CheckpointedBiasedLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& bias, TransformerLayer* layer,
                               const AttentionInput* self_input, int64_t length) {
    ctx->save_for_backward({x, bias});
    SaveForRecompute(ctx, layer, *self_input, AttentionInput(), torch::Tensor(), length);
    return layer->Compute(x, *self_input, torch::Tensor(), AttentionInput(), bias, length);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach().requires_grad_(true);
    const torch::Tensor bias = saved[1].detach().requires_grad_(true);
    Recompute(ctx, x, torch::Tensor(), bias, grad_outputs[0]);
    return {x.grad(), bias.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// T5V11 decoder layers: the encoder output and the position bias are inputs.
class CheckpointedBiasedDecoderLayer
    : public torch::autograd::Function<CheckpointedBiasedDecoderLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& memory, const torch::Tensor& bias,
                               TransformerLayer* layer, const AttentionInput* self_input,
                               const AttentionInput* cross_input, int64_t length) {
    ctx->save_for_backward({x, memory, bias});
    SaveForRecompute(ctx, layer, *self_input, *cross_input, torch::Tensor(), length);
    return layer->Compute(x, *self_input, memory, *cross_input, bias, length);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach().requires_grad_(true);
    const torch::Tensor memory = saved[1].detach().requires_grad_(true);
    const torch::Tensor bias = saved[2].detach().requires_grad_(true);
    Recompute(ctx, x, memory, bias, grad_outputs[0]);
    return {x.grad(),        memory.grad(),   bias.grad(),    torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TransformerLayer::Forward(const torch::Tensor& x, const AttentionInput& self_input,
                                        const torch::Tensor& memory,
                                        const AttentionInput& cross_input,
                                        const torch::Tensor& position, int64_t length) {
  if (length == 0) length = x.size(1);
  if (recompute_full_ && torch::GradMode::is_enabled()) {
    if (t5v11_ && memory.defined()) {
      return CheckpointedBiasedDecoderLayer::apply(x, memory, position, this, &self_input,
                                                   &cross_input, length);
    }
    if (t5v11_) return CheckpointedBiasedLayer::apply(x, position, this, &self_input, length);
    if (memory.defined()) {
      return CheckpointedDecoderLayer::apply(x, memory, this, &self_input, &cross_input, length);
    }
    return CheckpointedLayer::apply(x, this, &self_input, &position, length);
  }
  return Compute(x, self_input, memory, cross_input, position, length);
}

torch::Tensor TransformerLayer::Attention(const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v,
                                          const AttentionInput& input) const {
  // T5V11 scores are not divided by sqrt(d).
  const bool scaled = !t5v11_;
  const torch::Tensor& bias = input.bias();
  if (input.kind() == AttentionInput::Kind::kContextParallel) {
    // A micro-batch split across the context group: the local queries over
    // the group's gathered keys; a variable-length kernel where one serves
    // (cu_seqlens from the split's offsets, bottom-right causal), else the
    // reference core, recomputed in backward under selective recomputation.
    TORCH_CHECK(!bias.defined(), "context-parallel attention takes no score bias");
    const int64_t head_dim = q.size(2) / heads_;
    const auto compute = [&](const torch::Tensor& t) { return t.to(ComputeDtype(q)); };
    const torch::Tensor cq = compute(q);
    const double scale = scaled ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
    const VariableLengthKernel* kernel =
        VariableLengthKernelFor(cq, head_dim, /*has_bias=*/false, fused_attention_);
    // k and v may hold fewer heads than q (grouped-query attention): the
    // group gathers those, not their repeats.
    return ContextParallelSelfAttention(
        kernel != nullptr ? cq : q, kernel != nullptr ? compute(k) : k,
        kernel != nullptr ? compute(v) : v, input.context(), input.context_group(), heads_,
        k.size(2) / head_dim, scale, kernel, recompute_attention_);
  }
  if (input.kind() == AttentionInput::Kind::kVariableLength) {
    // Packed rows: one variable-length kernel call where one serves the
    // device, dtype and model; otherwise the same core, sample by sample.
    const int64_t head_dim = q.size(2) / heads_;
    // Under CUDA autocast the kernel runs in the autocast dtype, as the
    // fused kernel of unpacked rows does (LLAMA's rotary positions leave q
    // and k in fp32).
    const auto compute = [&](const torch::Tensor& t) { return t.to(ComputeDtype(q)); };
    const torch::Tensor cq = compute(q);
    if (const VariableLengthKernel* kernel =
            VariableLengthKernelFor(cq, head_dim, bias.defined(), fused_attention_)) {
      const double scale = scaled ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
      return VariableLengthAttention(cq, compute(k), compute(v), input.layout_ptr(), heads_,
                                     scale, *kernel);
    }
    return PerSampleAttention(q, k, v, input.layout(), bias,
                              [this](const torch::Tensor& sq, const torch::Tensor& sk,
                                     const torch::Tensor& sv, const AttentionInput& sample) {
                                return Attention(sq, sk, sv, sample);
                              });
  }
  const torch::Tensor mask =
      input.kind() == AttentionInput::Kind::kDenseMask ? input.mask() : torch::Tensor();
  // The fused kernel keeps no score tensors: selective recomputation has
  // nothing to drop.
  if (fused_attention_) return FusedAttention(q, k, v, mask, heads_, bias, scaled);
  if (recompute_attention_) return RecomputedMaskedAttention(q, k, v, mask, heads_, bias, scaled);
  return MaskedAttention(q, k, v, mask, heads_, bias, scaled);
}

namespace {

// Grouped-query attention: each of x's `kv_heads` heads [b, s, kv_heads * d]
// repeated for the `heads / kv_heads` query heads that use it (query head i
// reads key/value head i / (heads / kv_heads)).
torch::Tensor RepeatKeyValueHeads(const torch::Tensor& x, int64_t kv_heads, int64_t heads) {
  if (kv_heads == heads) return x;
  const int64_t b = x.size(0);
  const int64_t s = x.size(1);
  const int64_t d = x.size(2) / kv_heads;
  return x.reshape({b, s, kv_heads, 1, d})
      .expand({b, s, kv_heads, heads / kv_heads, d})
      .reshape({b, s, heads * d});
}

}  // namespace

torch::Tensor TransformerLayer::ComputeLlama(const torch::Tensor& x,
                                             const AttentionInput& self_input,
                                             const torch::Tensor& rotary, int64_t length) {
  TORCH_CHECK(rotary.defined(), "a LLAMA layer needs its positions' rotary table");
  const torch::Tensor n = Enter(RmsNorm(x, Replicated(attn_norm_weight_), norm_epsilon_), length);
  const torch::Tensor q = ApplyRotary(DeferredLinear(n, q_weight_), rotary, heads_);
  const torch::Tensor k = ApplyRotary(DeferredLinear(n, k_weight_), rotary, kv_heads_);
  const torch::Tensor v = DeferredLinear(n, v_weight_);
  // A context-parallel split gathers the kv_heads heads across its group
  // and repeats them afterwards (ContextParallelSelfAttention).
  const bool split = self_input.kind() == AttentionInput::Kind::kContextParallel;
  const torch::Tensor y =
      x + RowParallel(Attention(q, split ? k : RepeatKeyValueHeads(k, kv_heads_, heads_),
                                split ? v : RepeatKeyValueHeads(v, kv_heads_, heads_),
                                self_input),
                      o_weight_);
  // SwiGLU MLP (Shazeer 2020): silu(m W_gate) * (m W_up), then W_down.
  const torch::Tensor m = Enter(RmsNorm(y, Replicated(mlp_norm_weight_), norm_epsilon_), length);
  const torch::Tensor gated =
      torch::silu(DeferredLinear(m, gate_weight_)) * DeferredLinear(m, up_weight_);
  return y + RowParallel(gated, down_weight_);
}

// T5V11 (docs/models.md, "The T5V11 layers").
torch::Tensor TransformerLayer::ComputeT5V11(const torch::Tensor& x,
                                             const AttentionInput& self_input,
                                             const torch::Tensor& memory,
                                             const AttentionInput& cross_input,
                                             const torch::Tensor& bias, int64_t length) {
  TORCH_CHECK(bias.defined(), "a T5V11 layer needs its stack's position bias");
  const torch::Tensor n = Enter(RmsNorm(x, Replicated(attn_norm_weight_), norm_epsilon_), length);
  torch::Tensor y =
      x + RowParallel(Attention(DeferredLinear(n, q_weight_), DeferredLinear(n, k_weight_),
                                DeferredLinear(n, v_weight_), self_input.WithBias(bias)),
                      o_weight_);
  if (cross_attention_) {
    // Queries from the decoder, keys and values from the encoder output; no
    // position bias.
    const torch::Tensor c =
        Enter(RmsNorm(y, Replicated(cross_norm_weight_), norm_epsilon_), length);
    const torch::Tensor encoded = CopyToTensorRegion(memory, *tensor_);
    y = y +
        RowParallel(Attention(DeferredLinear(c, xq_weight_), DeferredLinear(encoded, xk_weight_),
                              DeferredLinear(encoded, xv_weight_), cross_input),
                    xo_weight_);
  }
  // Gated GELU (Shazeer 2020), GELU in its tanh form as T5 v1.1's gelu_new.
  const torch::Tensor m = Enter(RmsNorm(y, Replicated(mlp_norm_weight_), norm_epsilon_), length);
  const torch::Tensor gated =
      torch::gelu(DeferredLinear(m, gate_weight_), "tanh") * DeferredLinear(m, up_weight_);
  return y + RowParallel(gated, down_weight_);
}

torch::Tensor TransformerLayer::ComputeMegatron(const torch::Tensor& x,
                                                const AttentionInput& self_input,
                                                const torch::Tensor& memory,
                                                const AttentionInput& cross_input, int64_t length) {
  // Self-attention branch.
  const torch::Tensor a =
      Enter(LayerNorm(x, Replicated(ln1_weight_), Replicated(ln1_bias_)), length);
  const std::vector<torch::Tensor> parts = DeferredLinear(a, qkv_weight_, qkv_bias_).chunk(3, -1);
  torch::Tensor y =
      x + RowParallel(Attention(parts[0], parts[1], parts[2], self_input), proj_weight_,
                      proj_bias_);
  // Cross-attention branch (T5 decoder): queries from the decoder, keys and
  // values from the encoder output.
  if (cross_attention_) {
    const torch::Tensor c =
        Enter(LayerNorm(y, Replicated(lnx_weight_), Replicated(lnx_bias_)), length);
    const torch::Tensor q = DeferredLinear(c, xq_weight_, xq_bias_);
    const std::vector<torch::Tensor> kv =
        DeferredLinear(CopyToTensorRegion(memory, *tensor_), xkv_weight_, xkv_bias_).chunk(2, -1);
    y = y + RowParallel(Attention(q, kv[0], kv[1], cross_input), xproj_weight_, xproj_bias_);
  }
  // MLP branch.
  const torch::Tensor m =
      Enter(LayerNorm(y, Replicated(ln2_weight_), Replicated(ln2_bias_)), length);
  const torch::Tensor hidden = torch::gelu(DeferredLinear(m, fc1_weight_, fc1_bias_));
  return y + RowParallel(hidden, fc2_weight_, fc2_bias_);
}

torch::Tensor TransformerLayer::Compute(const torch::Tensor& x, const AttentionInput& self_input,
                                        const torch::Tensor& memory,
                                        const AttentionInput& cross_input,
                                        const torch::Tensor& position, int64_t length) {
  if (length == 0) length = x.size(1);
  if (llama_) return ComputeLlama(x, self_input, position, length);
  if (t5v11_) return ComputeT5V11(x, self_input, memory, cross_input, position, length);
  return ComputeMegatron(x, self_input, memory, cross_input, length);
}

}  // namespace varipipe::executor
