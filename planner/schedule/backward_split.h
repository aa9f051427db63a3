// The cost of a split backward (zero-bubble schedules): how a stage's
// backward time divides into B (input gradient) and W (weight gradient), and
// what B keeps for W. See docs/cost-model.md, "Split backward".
//
// Time (Qi et al. 2023, "Zero bubble pipeline parallelism", section 2; the
// F/B/W split ZeroPP builds on): W computes dW = X^T dY for every linear
// layer, exactly the FLOPs of the forward's weight GEMMs; everything else of
// the backward (the attention core's gradient, norms, element-wise ops,
// recomputation) belongs to B. Per token of a layer with hidden size h,
// attention width i (heads * kv_channels) and MLP width f, the forward's
// weight GEMMs take 8hi + 4hf FLOPs (QKV 6hi, output projection 2ih, MLP
// 4hf; a T5 decoder layer adds 4hi per target token for its cross-attention
// query and output projections and 4hi per encoder token for its keys and
// values) and the attention core 4 s i per attended position count s. So
//
//   t_W = min(t_F * weight / (weight + attention), t_bwd / 2),  t_B = t_bwd - t_W
//
// over the stage's layers (for GPT dimensions, i = h and f = 4h, the share is
// 6h / (6h + s)). The cap keeps B at least as long as W.
//
// Memory: B keeps, for every linear layer, its input and its output's
// gradient until W has used them (what the executor's deferred linear layer
// stores); the rest of what the forward stored is freed by B. Per token and
// layer that is h + 3i (QKV), i + h (output projection), h + f (fc1) and
// f + h (fc2): 4h + 4i + 2f values (16h for GPT dimensions, the 32 b s h
// bytes of Qi et al., Table 1); a T5 decoder layer adds h + i (query) and
// i + h (output projection) per target token and 2i (key and value
// gradients) per encoder token, and its stage keeps the encoder output (h
// per encoder token) once for all its layers. The LM head (vocabulary V,
// tied or not) computes its weight gradient in B (executor/model/
// chunked_loss_head.h: it recomputes its logits a chunk at a time and
// keeps nothing [tokens, V]-sized for W): its forward's 2hV FLOPs per token
// count in the forward's total (the share's denominator) and it keeps
// nothing for W. A LLAMA layer (K/V width k =
// key/value heads * kv_channels, SwiGLU) takes 4hi + 4hk + 6hf weight FLOPs
// (Q 2hi, K and V 4hk, output projection 2ih, gate, up and down 6hf) and
// keeps 4h + 2i + 2k + 3f values per token (q/k/v input h, shared by the
// three, and output gradients i + 2k; output projection i + h; gate/up input
// h, shared, and output gradients 2f; down projection f + h). A T5V11 layer
// is a MEGATRON one with the gated MLP's third matrix: 8hi + 6hf weight
// FLOPs and 4h + 4i + 3f kept values per token (decoder layers add what
// MEGATRON's do); its relative bias table's gradient, small like the norm
// weights', is B's. Under full
// recomputation B rebuilds the layer, so the same bytes are kept; they may
// exceed what the forward stored, and the zero-bubble fill then splits a
// backward only where they fit (weight_fill.h).
#ifndef VARIPIPE_PLANNER_SCHEDULE_BACKWARD_SPLIT_H_
#define VARIPIPE_PLANNER_SCHEDULE_BACKWARD_SPLIT_H_

#include <cstdint>

#include "planner/cost/model_dims.h"
#include "planner/schedule/stage_costs.h"

namespace varipipe::planner {

// The layers one stage runs for one micro-batch: `encoder_layers` (GPT
// layers or T5 encoder layers) over `input_len` tokens per sample and
// `decoder_layers` (T5) over `target_len` tokens, attending to `input_len`
// encoder tokens, for `samples` samples; `head`: the stage ends with the LM
// head (over the target tokens for T5, the sequence for GPT).
struct StageLayers {
  double samples = 0;
  uint32_t input_len = 0;
  uint32_t target_len = 0;
  uint32_t encoder_layers = 0;
  uint32_t decoder_layers = 0;
  bool head = false;
};

class BackwardSplitRule {
 public:
  explicit BackwardSplitRule(const ModelDims& dims) : dims_(dims) {}

  // W's share of the stage's forward time: its layers' weight-GEMM FLOPs
  // over those plus the attention-core FLOPs and the LM head's forward
  // FLOPs (0 with no layer).
  double WeightGemmShare(const StageLayers& stage) const;

  // The bytes B keeps for W (inputs and output gradients of the linear
  // layers) at the model's activation dtype.
  double KeptBytes(const StageLayers& stage) const;

  // Sets cost->weight_ms and cost->weight_stored_bytes from its forward and
  // backward times by the rule above.
  void Split(const StageLayers& stage, StageOpCost* cost) const;

 private:
  // Tokens per sample the LM head runs over.
  double HeadTokens(const StageLayers& stage) const;
  // The LM head's forward FLOPs per sample (0 without it).
  double HeadForwardFlops(const StageLayers& stage) const;

  ModelDims dims_;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_BACKWARD_SPLIT_H_
