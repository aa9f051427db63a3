#include "planner/schedule/backward_split.h"

#include <algorithm>

namespace varipipe::planner {

double BackwardSplitRule::HeadTokens(const StageLayers& stage) const {
  return dims_.encoder_decoder() ? stage.target_len : stage.input_len;
}

double BackwardSplitRule::HeadForwardFlops(const StageLayers& stage) const {
  return stage.head ? HeadTokens(stage) * 2.0 * dims_.hidden * dims_.vocab : 0.0;
}

double BackwardSplitRule::WeightGemmShare(const StageLayers& stage) const {
  const double h = dims_.hidden;
  const double i = static_cast<double>(dims_.attention_width());
  const double f = dims_.ffn;
  const double in = stage.input_len;
  const double tgt = stage.target_len;
  if (dims_.llama()) {
    // Per token: Q 2hi, K and V 4hk (k = key/value heads * kv_channels),
    // output projection 2ih, SwiGLU gate, up and down 6hf; the core 4 s i.
    // Decoder-only: no decoder layers.
    const double k = static_cast<double>(dims_.kv_width());
    const double weight = stage.encoder_layers * in * (4 * h * i + 4 * h * k + 6 * h * f);
    const double attention = stage.encoder_layers * in * 4 * in * i;
    const double total = weight + attention + HeadForwardFlops(stage);
    return total > 0 ? weight / total : 0.0;
  }
  // Per sample, summed over the stage's layers. T5V11's gated GELU has three
  // MLP matrices (gate, up, down: 6hf per token; MEGATRON's fc1 and fc2:
  // 4hf); its relative bias table's gradient, like the norm weights', is
  // small and computed with B.
  const double mlp = dims_.gated_mlp() ? 6 * h * f : 4 * h * f;
  const double weight = stage.encoder_layers * in * (8 * h * i + mlp) +
                        stage.decoder_layers * (tgt * (12 * h * i + mlp) + in * 4 * h * i);
  const double attention =
      stage.encoder_layers * in * 4 * in * i + stage.decoder_layers * tgt * 4 * (tgt + in) * i;
  const double total = weight + attention + HeadForwardFlops(stage);
  return total > 0 ? weight / total : 0.0;
}

double BackwardSplitRule::KeptBytes(const StageLayers& stage) const {
  const double h = dims_.hidden;
  const double i = static_cast<double>(dims_.attention_width());
  const double f = dims_.ffn;
  const double in = stage.input_len;
  const double tgt = stage.target_len;
  if (dims_.llama()) {
    // Per token: q/k/v input h (one tensor for the three) and output
    // gradients i + 2k, output projection i + h, gate/up input h (one
    // tensor) and output gradients 2f, down projection f + h.
    const double k = static_cast<double>(dims_.kv_width());
    const double values = stage.encoder_layers * in * (4 * h + 2 * i + 2 * k + 3 * f);
    return values * stage.samples * dims_.dtype_bytes;
  }
  // T5V11 (separate q, k and v reading one normed input, as one QKV GEMM
  // does): its MLP keeps the gate/up input h (shared) and output gradients
  // 2f, and the down projection's input f and output gradient h: 2h + 3f
  // against MEGATRON's 2h + 2f.
  const double mlp = dims_.gated_mlp() ? 3 * f : 2 * f;
  double values = stage.encoder_layers * in * (4 * h + 4 * i + mlp);
  if (stage.decoder_layers > 0) {
    values += stage.decoder_layers * (tgt * (6 * h + 6 * i + mlp) + in * 2 * i) + in * h;
  }
  return values * stage.samples * dims_.dtype_bytes;
}

void BackwardSplitRule::Split(const StageLayers& stage, StageOpCost* cost) const {
  cost->weight_ms = std::min(cost->forward_ms * WeightGemmShare(stage), cost->backward_ms / 2);
  cost->weight_stored_bytes = KeptBytes(stage);
}

}  // namespace varipipe::planner
