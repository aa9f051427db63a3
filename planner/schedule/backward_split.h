// The cost of a split backward (zero-bubble schedules): how a stage's
// backward time divides into B (input gradient) and W (weight gradient), and
// what B keeps for W. See docs/cost-model.md, "Split backward".
//
// Time (Qi et al. 2023, "Zero bubble pipeline parallelism", section 2; the
// F/B/W split ZeroPP builds on): per transformer layer over s tokens of
// hidden size h, the forward's weight GEMMs take 24 b s h^2 FLOPs (QKV 6,
// output projection 2, MLP 16) and its attention core 4 b s^2 h. W computes
// dW = X^T dY for every linear layer: exactly the FLOPs of the forward's
// weight GEMMs. Everything else of the backward (the attention core's
// gradient, norms, element-wise ops, recomputation) belongs to B:
//
//   t_W = min(t_F * 6h / (6h + s), t_bwd / 2),    t_B = t_bwd - t_W
//
// with s the attention length (decoder stages: the longer of input and
// target). The cap keeps B at least as long as W.
//
// Memory (Qi et al., Table 1): a layer stores M_B = 34 b s h bytes (plus
// 5 a s^2 b of attention scores without a fused kernel) for its backward; B
// frees all but M_W = 32 b s h bytes, the inputs and output gradients of
// the linear layers, which W frees:
//
//   M_W = stored * 32 / 34
//
// (an upper bound when the scores are stored). Under full recomputation a
// stage stores only its layers' inputs and B rebuilds the layer, so M_W is
// counted in full: 32 b s h bytes per layer at 2-byte activations,
// LinearKeptBytes; it may exceed what the forward stored, and the
// zero-bubble fill then splits a backward only where that fits
// (weight_fill.h).
#ifndef VARIPIPE_PLANNER_SCHEDULE_BACKWARD_SPLIT_H_
#define VARIPIPE_PLANNER_SCHEDULE_BACKWARD_SPLIT_H_

#include <cstdint>

#include "planner/schedule/stage_costs.h"

namespace varipipe::planner {

// Fraction of the stored activation B keeps for W (32 / 34).
inline constexpr double kWeightKeptFraction = 32.0 / 34.0;

// W's share of the forward time for hidden size `hidden` and attention
// length `attention_len`: 6h / (6h + s).
double WeightGemmShare(uint32_t hidden, uint32_t attention_len);

// Sets cost->weight_ms and cost->weight_stored_bytes from its forward,
// backward and stored bytes by the rule above.
void SplitBackward(uint32_t hidden, uint32_t attention_len, StageOpCost* cost);

// M_W of `layers` transformer layers over `tokens` (b s) tokens: the
// inputs and output gradients of their linear layers, 16 h values per token
// and layer.
double LinearKeptBytes(double tokens, uint32_t hidden, uint32_t layers, uint32_t dtype_bytes);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_BACKWARD_SPLIT_H_
