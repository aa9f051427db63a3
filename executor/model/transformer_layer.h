// One pre-norm transformer layer: self-attention and MLP residual branches,
// plus a cross-attention branch for T5 decoder layers. MEGATRON layers use
// LayerNorm, biases and a GELU MLP; LLAMA layers (docs/models.md) RMSNorm,
// rotary positions, grouped-query attention and a SwiGLU MLP, no biases;
// T5V11 layers RMSNorm, a relative position bias on unscaled scores and a
// gated-GELU MLP, no biases. Parameters
// come from the layer's own Initializer (model component and global layer
// index), so a layer is identical on whichever stage holds it. Its linear
// layers are DeferredLinear: a split
// backward records their weight gradients' operands in the current
// WeightGradStore (deferred_linear.h).
//
// Tensor parallelism (a TensorGroup of more than one rank): the layer holds
// its rank's heads and MLP columns (tensor_shard.h) and runs Megatron's
// column- and row-parallel projections: each branch's normalised input
// enters the tensor region (f; with sequence parallelism the all-gather of
// the rank's sequence part) and its output projection leaves it (g; the
// reduce-scatter), tensor_parallel_ops.h. A rank's result equals the
// unsharded layer's (its sequence part of it with sequence parallelism).
#ifndef VARIPIPE_EXECUTOR_MODEL_TRANSFORMER_LAYER_H_
#define VARIPIPE_EXECUTOR_MODEL_TRANSFORMER_LAYER_H_

#include <torch/torch.h>

#include "executor/model/attention_input.h"
#include "executor/model/initializer.h"
#include "executor/model/model_spec.h"
#include "executor/model/norm.h"  // RmsNorm, for the layers' users
#include "executor/model/tensor_group.h"

namespace varipipe::executor {

class TransformerLayer : public torch::nn::Module {
 public:
  // `component` is kEncoderLayer (GPT, T5 encoder) or kDecoderLayer (T5
  // decoder, which adds cross-attention); `index` the global layer index;
  // `total_layers` scales the residual output projections. `tensor` (not
  // owned, outlives the layer) is the rank's tensor group, whose size is
  // spec.tensor_parallel; null: a group of one.
  TransformerLayer(const ModelSpec& spec, ModelComponent component, int64_t index,
                   int64_t total_layers, const TensorGroup* tensor = nullptr);

  // x [b, s, hidden]; `self_input` says which keys each position sees
  // (attention_input.h: causal, a dense mask [b, 1, s, s], or packed rows'
  // variable-length layout); for decoder layers `memory` [b, s_enc, hidden]
  // and `cross_input` (a dense mask [b, 1, s, s_enc] or a layout from the
  // target rows to the input rows). `position`: LLAMA
  // layers need the positions' RotaryTable (rotary.h), T5V11 layers their
  // stack's RelativePositionBias [B, heads, s, s] (relative_position_bias.h;
  // its gradient flows back to the stage's table); MEGATRON layers none.
  // With sequence parallelism x is the rank's part [b, ceil(s / t), hidden]
  // of the sequence (tensor_parallel_ops.h) and `length` is s; otherwise
  // `length` is unused. `memory` is always whole.
  torch::Tensor Forward(const torch::Tensor& x, const AttentionInput& self_input,
                        const torch::Tensor& memory = {},
                        const AttentionInput& cross_input = AttentionInput(),
                        const torch::Tensor& position = {}, int64_t length = 0);

  // Selective recomputation: the attention cores (self and cross) keep no
  // intermediates for backward and are recomputed there
  // (recomputed_attention.h). Off by default. With the FUSED attention
  // kernel (spec.attention_kernel) the cores keep no intermediates anyway
  // and the setting changes nothing.
  void set_recompute_attention(bool on) { recompute_attention_ = on; }

  // Full recomputation (Megatron's full activation recomputation, one layer
  // per checkpoint): the forward keeps only the layer's inputs; the backward
  // re-runs the layer with autograd (under the forward's autocast state) and
  // differentiates it, one layer at a time. Off by default. The re-run
  // records into the WeightGradStore that was current in the forward.
  void set_recompute_full(bool on) { recompute_full_ = on; }

  // The layer's computation as an autograd graph, whatever the recompute
  // setting (Forward and the full recomputation call it).
  torch::Tensor Compute(const torch::Tensor& x, const AttentionInput& self_input,
                        const torch::Tensor& memory, const AttentionInput& cross_input,
                        const torch::Tensor& position, int64_t length);

 private:
  // Registers part of `full` (tensor_shard.h's ShardOfParameter(name)).
  torch::Tensor RegisterShard(const std::string& name, const torch::Tensor& full);
  // A branch's normalised input entering the column-parallel projections.
  torch::Tensor Enter(const torch::Tensor& x, int64_t length) const;
  // x W^T + b of a row-parallel projection, summed over the tensor group.
  torch::Tensor RowParallel(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& bias = {}) const;
  // A replicated norm weight or bias as the rank's sequence part uses it.
  torch::Tensor Replicated(const torch::Tensor& p) const;
  void RegisterMegatron(const ModelSpec& spec, Initializer& init, double output_stddev);
  void RegisterLlama(const ModelSpec& spec, Initializer& init, double output_stddev);
  void RegisterT5V11(const ModelSpec& spec, Initializer& init, double output_stddev);
  torch::Tensor ComputeMegatron(const torch::Tensor& x, const AttentionInput& self_input,
                                const torch::Tensor& memory, const AttentionInput& cross_input,
                                int64_t length);
  torch::Tensor ComputeLlama(const torch::Tensor& x, const AttentionInput& self_input,
                             const torch::Tensor& rotary, int64_t length);
  torch::Tensor ComputeT5V11(const torch::Tensor& x, const AttentionInput& self_input,
                             const torch::Tensor& memory, const AttentionInput& cross_input,
                             const torch::Tensor& bias, int64_t length);
  torch::Tensor LayerNorm(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias) const;
  // The attention core the input and the settings choose: for packed rows
  // the variable-length kernel where one serves (variable_length_attention.h)
  // else PerSampleAttention; otherwise fused, recomputed or explicit. T5V11
  // adds the input's bias to the scores and does not scale them.
  torch::Tensor Attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const AttentionInput& input) const;

  const TensorGroup* tensor_;
  int64_t hidden_;
  int64_t heads_;  // this rank's (heads / tensor), as kv_heads_
  bool llama_;
  bool t5v11_;
  int64_t kv_heads_;
  double norm_epsilon_;
  bool cross_attention_;
  bool fused_attention_;
  bool recompute_attention_ = false;
  bool recompute_full_ = false;
  torch::Tensor ln1_weight_, ln1_bias_, qkv_weight_, qkv_bias_, proj_weight_, proj_bias_;
  torch::Tensor lnx_weight_, lnx_bias_, xq_weight_, xq_bias_, xkv_weight_, xkv_bias_, xproj_weight_,
      xproj_bias_;
  torch::Tensor ln2_weight_, ln2_bias_, fc1_weight_, fc1_bias_, fc2_weight_, fc2_bias_;
  // LLAMA and T5V11 (T5V11 decoders also cross_norm_weight_, xq_weight_ and
  // the x*_weight_ below).
  torch::Tensor attn_norm_weight_, q_weight_, k_weight_, v_weight_, o_weight_, mlp_norm_weight_,
      gate_weight_, up_weight_, down_weight_;
  torch::Tensor cross_norm_weight_, xk_weight_, xv_weight_, xo_weight_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_TRANSFORMER_LAYER_H_
