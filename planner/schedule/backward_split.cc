#include "planner/schedule/backward_split.h"

#include <algorithm>

namespace varipipe::planner {

double BackwardSplitRule::HeadTokens(const StageLayers& stage) const {
  return dims_.encoder_decoder() ? stage.target_len : stage.input_len;
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
    const double weight = stage.encoder_layers * in * (4 * h * i + 4 * h * k + 6 * h * f) +
                          (stage.head ? HeadTokens(stage) * 2 * h * dims_.vocab : 0.0);
    const double attention = stage.encoder_layers * in * 4 * in * i;
    return weight + attention > 0 ? weight / (weight + attention) : 0.0;
  }
  // Per sample, summed over the stage's layers.
  const double weight = stage.encoder_layers * in * (8 * h * i + 4 * h * f) +
                        stage.decoder_layers * (tgt * (12 * h * i + 4 * h * f) + in * 4 * h * i) +
                        (stage.head ? HeadTokens(stage) * 2 * h * dims_.vocab : 0.0);
  const double attention =
      stage.encoder_layers * in * 4 * in * i + stage.decoder_layers * tgt * 4 * (tgt + in) * i;
  return weight + attention > 0 ? weight / (weight + attention) : 0.0;
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
    double values = stage.encoder_layers * in * (4 * h + 2 * i + 2 * k + 3 * f);
    if (stage.head) values += HeadTokens(stage) * (h + dims_.vocab);
    return values * stage.samples * dims_.dtype_bytes;
  }
  double values = stage.encoder_layers * in * (4 * h + 4 * i + 2 * f);
  if (stage.decoder_layers > 0) {
    values += stage.decoder_layers * (tgt * (6 * h + 6 * i + 2 * f) + in * 2 * i) + in * h;
  }
  if (stage.head) values += HeadTokens(stage) * (h + dims_.vocab);
  return values * stage.samples * dims_.dtype_bytes;
}

void BackwardSplitRule::Split(const StageLayers& stage, StageOpCost* cost) const {
  cost->weight_ms = std::min(cost->forward_ms * WeightGemmShare(stage), cost->backward_ms / 2);
  cost->weight_stored_bytes = KeptBytes(stage);
}

}  // namespace varipipe::planner
