#include "tests/testing/reference_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "absl/strings/str_cat.h"
#include "executor/model/tensor_shard.h"

namespace varipipe::testing {
namespace {

// The initialisation rule: component ids and the seed mixing (SplitMix64's
// finaliser) as documented in docs/executor.md.
constexpr uint64_t kEmbeddingComponent = 1;
constexpr uint64_t kEncoderLayerComponent = 2;
constexpr uint64_t kDecoderLayerComponent = 3;
constexpr uint64_t kHeadComponent = 4;
// T5V11's relative bias tables (docs/models.md): index 0 the encoder's, 1 the
// decoder's.
constexpr uint64_t kPositionBiasComponent = 5;
constexpr double kStddev = 0.02;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Draws N(0, stddev^2) tensors in call order from one component's generator.
class Draws {
 public:
  Draws(uint64_t seed, uint64_t component, uint64_t index)
      : generator_(at::make_generator<at::CPUGeneratorImpl>(
            SplitMix(SplitMix(seed) ^ (component << 48) ^ index))) {}
  torch::Tensor Normal(std::vector<int64_t> shape, double stddev) {
    return at::normal(0.0, stddev, shape, generator_, torch::dtype(torch::kFloat32));
  }

 private:
  at::Generator generator_;
};

torch::Tensor Ones(int64_t n) { return torch::ones({n}, torch::kFloat32); }
torch::Tensor Zeros(int64_t n) { return torch::zeros({n}, torch::kFloat32); }

torch::Tensor LayerNorm(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) {
  const torch::Tensor mean = x.mean(-1, /*keepdim=*/true);
  const torch::Tensor centered = x - mean;
  const torch::Tensor variance = centered.pow(2).mean(-1, /*keepdim=*/true);
  return centered / (variance + 1e-5).sqrt() * weight + bias;
}

// GELU with the error function (not the tanh approximation).
torch::Tensor Gelu(const torch::Tensor& x) {
  return 0.5 * x * (1.0 + torch::erf(x / std::sqrt(2.0)));
}

// RMSNorm: x / sqrt(mean(x^2) + eps) * weight.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double epsilon) {
  return x / (x.pow(2).mean(-1, /*keepdim=*/true) + epsilon).sqrt() * weight;
}

// GELU in the tanh form (T5V11's gated MLP):
// 0.5 u (1 + tanh(sqrt(2 / pi) (u + 0.044715 u^3))).
torch::Tensor GeluTanh(const torch::Tensor& x) {
  return 0.5 * x *
         (1.0 + torch::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x.pow(3))));
}

// SiLU: x * sigmoid(x).
torch::Tensor Silu(const torch::Tensor& x) { return x * torch::sigmoid(x); }

torch::Tensor Affine(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias = {}) {
  torch::Tensor y = x.matmul(weight.t());
  return bias.defined() ? y + bias : y;
}

// Softmax attention of q [n_q, heads * d] over k, v [n_k, kv_heads * d],
// one head at a time: query head h uses key/value head h / (heads /
// kv_heads) (kv_heads == heads: multi-head attention); with `causal` query i
// sees keys 0..i. The scores q_h k_h^T are divided by sqrt(d) unless
// `scaled` is false (T5V11), and bias[h] is added when `bias` [heads, n_q,
// n_k] is defined (T5V11's position bias).
torch::Tensor Attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        int64_t heads, int64_t kv_heads, bool causal,
                        const torch::Tensor& bias = torch::Tensor(), bool scaled = true) {
  const int64_t d = q.size(1) / heads;
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads && k.size(1) == kv_heads * d && v.size(1) == k.size(1),
              "attention: ", heads, " query heads over ", kv_heads, " key/value heads of ", d);
  TORCH_CHECK(!bias.defined() ||
                  (bias.size(0) == heads && bias.size(1) == q.size(0) && bias.size(2) == k.size(0)),
              "attention: the position bias does not fit the scores");
  std::vector<torch::Tensor> contexts;
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kv = h / group;
    const torch::Tensor qh = q.narrow(1, h * d, d);
    const torch::Tensor kh = k.narrow(1, kv * d, d);
    const torch::Tensor vh = v.narrow(1, kv * d, d);
    torch::Tensor scores = qh.matmul(kh.t());
    if (scaled) scores = scores / std::sqrt(static_cast<double>(d));
    if (bias.defined()) scores = scores + bias[h];
    if (causal) {
      const torch::Tensor future =
          torch::ones({q.size(0), k.size(0)}, torch::kBool).triu(/*diagonal=*/1);
      scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    }
    const torch::Tensor shifted = scores - std::get<0>(scores.max(-1, /*keepdim=*/true)).detach();
    const torch::Tensor weights = shifted.exp() / shifted.exp().sum(-1, /*keepdim=*/true);
    contexts.push_back(weights.matmul(vh));
  }
  return torch::cat(contexts, 1);
}

// T5's relative position bucket (docs/models.md, "Position bias") of
// r = key position - query position, with `buckets` N and `max_distance` M.
// Bidirectional (encoder): N' = N / 2, base = N' if r > 0 else 0, u = |r|.
// Causal (decoder): N' = N, base = 0, u = max(-r, 0). With E = N' / 2 the
// bucket is base + u for u < E, else
// base + min(N' - 1, E + trunc(log(u / E) / log(M / E) * (N' - E))), that
// branch in float32 as Hugging Face's _relative_position_bucket computes it:
// u / E in float32, torch's float32 log, divided by log(M / E) (computed in
// double, rounded to float32), times N' - E in float32, truncated toward
// zero. The float32 steps are torch CPU tensor ops so that the log rounds
// as torch's does.
int64_t RelativePositionBucket(int64_t r, bool bidirectional, int64_t buckets,
                               int64_t max_distance) {
  int64_t half = buckets;  // N'
  int64_t base = 0;
  int64_t u = 0;
  if (bidirectional) {
    half = buckets / 2;
    base = r > 0 ? half : 0;
    u = r < 0 ? -r : r;
  } else {
    u = std::max<int64_t>(-r, 0);
  }
  const int64_t exact = half / 2;  // E
  if (u < exact) return base + u;
  const auto scalar = [](float value) { return torch::full({1}, value, torch::kFloat32); };
  const torch::Tensor ratio = scalar(static_cast<float>(u)) / scalar(static_cast<float>(exact));
  const float log_range =
      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(exact)));
  const torch::Tensor scaled =
      ratio.log() / scalar(log_range) * scalar(static_cast<float>(half - exact));
  const int64_t large = exact + scaled.to(torch::kInt64).item<int64_t>();  // truncates
  return base + std::min(half - 1, large);
}

// Rotary frequencies inv_freq_j = theta^(-2j/d) for j < d/2, d = kv_channels,
// in double. With rope_scaling (Llama 3.1), by wavelength w = 2 pi /
// inv_freq_j against L = original_max_position_embeddings: w < L / high
// keeps it, w > L / low divides it by factor, and in between it becomes
// (1 - s) * inv_freq_j / factor + s * inv_freq_j with
// s = (L / w - low) / (high - low).
std::vector<double> RotaryFrequencies(const v1::ModelConfig& m) {
  const int64_t d = m.kv_channels();
  std::vector<double> inv_freq;
  for (int64_t j = 0; j < d / 2; ++j) {
    double f = std::pow(m.rope_theta(), -2.0 * static_cast<double>(j) / static_cast<double>(d));
    if (m.has_rope_scaling()) {
      const v1::RopeScaling& r = m.rope_scaling();
      const double original = r.original_max_position_embeddings();
      const double low = r.low_freq_factor();
      const double high = r.high_freq_factor();
      const double wavelength = 2 * std::numbers::pi / f;
      if (wavelength > original / low) {
        f /= r.factor();
      } else if (wavelength >= original / high) {
        const double s = (original / wavelength - low) / (high - low);
        f = (1 - s) * f / r.factor() + s * f;
      }
    }
    inv_freq.push_back(f);
  }
  return inv_freq;
}

// Rotary embeddings on x [n, heads * d] at positions 0..n-1 (Hugging Face's
// rotate_half layout): each head vector u = [u1, u2] (its halves) becomes
// u * cos + [-u2, u1] * sin, cos and sin of the angles p * inv_freq_j
// (computed in double) repeated twice.
torch::Tensor Rotary(const torch::Tensor& x, int64_t heads, const std::vector<double>& inv_freq) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  const int64_t d = 2 * half;
  TORCH_CHECK(x.size(1) == heads * d, "rotary: ", x.size(1), " channels are not ", heads,
              " heads of ", d);
  const torch::Tensor positions = torch::arange(x.size(0), torch::kFloat64).unsqueeze(1);
  const torch::Tensor angles =
      positions * torch::tensor(inv_freq, torch::kFloat64).unsqueeze(0);  // [n, d/2]
  const torch::Tensor repeated = torch::cat({angles, angles}, 1);         // [n, d]
  const torch::Tensor cos = repeated.cos().to(torch::kFloat32);
  const torch::Tensor sin = repeated.sin().to(torch::kFloat32);
  std::vector<torch::Tensor> rotated;
  for (int64_t h = 0; h < heads; ++h) {
    const torch::Tensor u = x.narrow(1, h * d, d);
    const torch::Tensor turned = torch::cat({-u.narrow(1, half, half), u.narrow(1, 0, half)}, 1);
    rotated.push_back(u * cos + turned * sin);
  }
  return torch::cat(rotated, 1);
}

// Summed negative log-likelihood of `labels` under `logits` [n, vocab].
torch::Tensor TokenLoss(const torch::Tensor& logits, const std::vector<int64_t>& labels) {
  const torch::Tensor top = std::get<0>(logits.max(-1, /*keepdim=*/true)).detach();
  const torch::Tensor log_normaliser = (logits - top).exp().sum(-1, /*keepdim=*/true).log() + top;
  const torch::Tensor log_probs = logits - log_normaliser;
  const torch::Tensor index = torch::tensor(labels, torch::kInt64).unsqueeze(1);
  return -log_probs.gather(1, index).sum();
}

}  // namespace

std::vector<ReferenceSample> IterationSamples(const std::vector<v1::ExecutionPlan>& plans) {
  std::vector<ReferenceSample> samples;
  for (const v1::ExecutionPlan& plan : plans) {
    // Each replica's micro-batches once (every lane of a context group
    // lists all of the group's).
    if (plan.pp_rank() != 0 || plan.context_rank() != 0) continue;
    for (const v1::MicroBatch& mb : plan.micro_batches()) {
      for (int i = 0; i < mb.sample_ids_size(); ++i) {
        samples.push_back({mb.sample_ids(i), mb.sample_input_lens(i), mb.sample_target_lens(i)});
      }
    }
  }
  return samples;
}

ReferenceModel::ReferenceModel(const v1::JobConfig& config) {
  const v1::ModelConfig& m = config.model();
  t5_ = m.kind() == v1::T5;
  encoder_layers_ = m.num_layers();
  decoder_layers_ = t5_ ? m.num_decoder_layers() : 0;
  hidden_ = m.hidden_size();
  heads_ = m.num_attention_heads();
  llama_ = m.architecture() == v1::LLAMA;
  t5v11_ = m.architecture() == v1::T5V11;
  if (llama_) {
    TORCH_CHECK(!t5_, "the reference builds LLAMA models of kind GPT only");
    kv_heads_ = m.num_key_value_heads();
    TORCH_CHECK(kv_heads_ > 0 && heads_ % kv_heads_ == 0, "num_key_value_heads ", kv_heads_,
                " must divide num_attention_heads ", heads_, " (defaults applied?)");
    TORCH_CHECK(m.kv_channels() % 2 == 0, "LLAMA needs even kv_channels (got ", m.kv_channels(),
                ")");
    TORCH_CHECK(m.has_norm_epsilon() && m.has_rope_theta(),
                "the reference needs a LLAMA config with defaults applied");
    norm_epsilon_ = m.norm_epsilon();
    tied_ = m.tie_word_embeddings();
    inv_freq_ = RotaryFrequencies(m);
    InitLlama(config);
  } else if (t5v11_) {
    TORCH_CHECK(t5_, "the reference builds T5V11 models of kind T5 only");
    TORCH_CHECK(m.has_norm_epsilon() && m.relative_attention_num_buckets() > 0 &&
                    m.relative_attention_max_distance() > 0,
                "the reference needs a T5V11 config with defaults applied");
    TORCH_CHECK(m.num_key_value_heads() == 0 || m.num_key_value_heads() == m.num_attention_heads(),
                "T5V11 has multi-head attention (num_key_value_heads ", m.num_key_value_heads(),
                " is not num_attention_heads ", heads_, ")");
    TORCH_CHECK(!m.tie_word_embeddings(), "T5V11 has an untied LM head");
    norm_epsilon_ = m.norm_epsilon();
    buckets_ = m.relative_attention_num_buckets();
    max_distance_ = m.relative_attention_max_distance();
    // The encoder's exact range is N / 4 >= 1 bucket wide and the decoder's
    // N / 2, below the maximum distance.
    TORCH_CHECK(buckets_ >= 4 && buckets_ % 2 == 0 && max_distance_ > buckets_ / 2,
                "T5V11 needs even relative_attention_num_buckets from 4 (got ", buckets_,
                ") and relative_attention_max_distance above half of them (got ", max_distance_,
                ")");
    InitT5V11(config);
  } else {
    InitMegatron(config);
  }
  for (auto& [name, p] : parameters_) p.requires_grad_(true);
}

// MEGATRON (docs/executor.md): per component, the weights drawn in a fixed
// order, then LayerNorm 1/0 and biases 0.
void ReferenceModel::InitMegatron(const v1::JobConfig& config) {
  const v1::ModelConfig& m = config.model();
  const int64_t h = hidden_;
  const int64_t inner = heads_ * m.kv_channels();
  const int64_t ffn = m.ffn_hidden_size();
  const int64_t vocab = m.vocab_size();
  const int64_t positions =
      std::max(config.data().max_sequence_length(), config.data().max_target_length());
  const uint64_t seed = config.data().seed();
  const double residual_stddev =
      kStddev / std::sqrt(2.0 * static_cast<double>(encoder_layers_ + decoder_layers_));
  {
    Draws draw(seed, kEmbeddingComponent, 0);
    parameters_["word_embedding"] = draw.Normal({vocab, h}, kStddev);
    parameters_["position_embedding"] = draw.Normal({positions, h}, kStddev);
  }
  if (t5_) {
    Draws draw(seed, kEmbeddingComponent, 1);
    parameters_["decoder_word_embedding"] = draw.Normal({vocab, h}, kStddev);
    parameters_["decoder_position_embedding"] = draw.Normal({positions, h}, kStddev);
    parameters_["encoder_ln_weight"] = Ones(h);
    parameters_["encoder_ln_bias"] = Zeros(h);
  }
  const auto layer = [&](const std::string& prefix, uint64_t component, int64_t index) {
    Draws draw(seed, component, static_cast<uint64_t>(index));
    const bool cross = component == kDecoderLayerComponent;
    // Draw order: qkv, proj, [xq, xkv, xproj], fc1, fc2.
    parameters_[prefix + "qkv_weight"] = draw.Normal({3 * inner, h}, kStddev);
    parameters_[prefix + "proj_weight"] = draw.Normal({h, inner}, residual_stddev);
    if (cross) {
      parameters_[prefix + "xq_weight"] = draw.Normal({inner, h}, kStddev);
      parameters_[prefix + "xkv_weight"] = draw.Normal({2 * inner, h}, kStddev);
      parameters_[prefix + "xproj_weight"] = draw.Normal({h, inner}, residual_stddev);
      parameters_[prefix + "lnx_weight"] = Ones(h);
      parameters_[prefix + "lnx_bias"] = Zeros(h);
      parameters_[prefix + "xq_bias"] = Zeros(inner);
      parameters_[prefix + "xkv_bias"] = Zeros(2 * inner);
      parameters_[prefix + "xproj_bias"] = Zeros(h);
    }
    parameters_[prefix + "fc1_weight"] = draw.Normal({ffn, h}, kStddev);
    parameters_[prefix + "fc2_weight"] = draw.Normal({h, ffn}, residual_stddev);
    parameters_[prefix + "ln1_weight"] = Ones(h);
    parameters_[prefix + "ln1_bias"] = Zeros(h);
    parameters_[prefix + "qkv_bias"] = Zeros(3 * inner);
    parameters_[prefix + "proj_bias"] = Zeros(h);
    parameters_[prefix + "ln2_weight"] = Ones(h);
    parameters_[prefix + "ln2_bias"] = Zeros(h);
    parameters_[prefix + "fc1_bias"] = Zeros(ffn);
    parameters_[prefix + "fc2_bias"] = Zeros(h);
  };
  for (int64_t i = 0; i < encoder_layers_; ++i) {
    layer(absl::StrCat("encoder_layer_", i, "."), kEncoderLayerComponent, i);
  }
  for (int64_t i = 0; i < decoder_layers_; ++i) {
    layer(absl::StrCat("decoder_layer_", i, "."), kDecoderLayerComponent, i);
  }
  {
    Draws draw(seed, kHeadComponent, 0);
    parameters_["head_weight"] = draw.Normal({vocab, h}, kStddev);
    parameters_["final_ln_weight"] = Ones(h);
    parameters_["final_ln_bias"] = Zeros(h);
  }
}

// LLAMA (docs/models.md): each component draws its normal tensors in the
// table's order; the norms start at one and draw nothing.
void ReferenceModel::InitLlama(const v1::JobConfig& config) {
  const v1::ModelConfig& m = config.model();
  const int64_t h = hidden_;
  const int64_t q_inner = heads_ * m.kv_channels();
  const int64_t kv_inner = kv_heads_ * m.kv_channels();
  const int64_t ffn = m.ffn_hidden_size();
  const int64_t vocab = m.vocab_size();
  const uint64_t seed = config.data().seed();
  const double residual_stddev = kStddev / std::sqrt(2.0 * static_cast<double>(encoder_layers_));
  {
    Draws draw(seed, kEmbeddingComponent, 0);
    parameters_["word_embedding"] = draw.Normal({vocab, h}, kStddev);
  }
  for (int64_t i = 0; i < encoder_layers_; ++i) {
    const std::string prefix = absl::StrCat("encoder_layer_", i, ".");
    Draws draw(seed, kEncoderLayerComponent, static_cast<uint64_t>(i));
    // Draw order: q, k, v, o, gate, up, down.
    parameters_[prefix + "attn_norm_weight"] = Ones(h);
    parameters_[prefix + "q_weight"] = draw.Normal({q_inner, h}, kStddev);
    parameters_[prefix + "k_weight"] = draw.Normal({kv_inner, h}, kStddev);
    parameters_[prefix + "v_weight"] = draw.Normal({kv_inner, h}, kStddev);
    parameters_[prefix + "o_weight"] = draw.Normal({h, q_inner}, residual_stddev);
    parameters_[prefix + "mlp_norm_weight"] = Ones(h);
    parameters_[prefix + "gate_weight"] = draw.Normal({ffn, h}, kStddev);
    parameters_[prefix + "up_weight"] = draw.Normal({ffn, h}, kStddev);
    parameters_[prefix + "down_weight"] = draw.Normal({h, ffn}, residual_stddev);
  }
  {
    Draws draw(seed, kHeadComponent, 0);
    parameters_["final_norm_weight"] = Ones(h);
    if (!tied_) parameters_["head_weight"] = draw.Normal({vocab, h}, kStddev);
  }
}

// T5V11 (docs/models.md): each component draws its normal tensors in the
// table's order; the norms start at one and draw nothing. Decoder layer i is
// component 3, index i (its index within the decoder).
void ReferenceModel::InitT5V11(const v1::JobConfig& config) {
  const v1::ModelConfig& m = config.model();
  const int64_t h = hidden_;
  const int64_t inner = heads_ * m.kv_channels();
  const int64_t ffn = m.ffn_hidden_size();
  const int64_t vocab = m.vocab_size();
  const uint64_t seed = config.data().seed();
  const double residual_stddev =
      kStddev / std::sqrt(2.0 * static_cast<double>(encoder_layers_ + decoder_layers_));
  {
    Draws draw(seed, kEmbeddingComponent, 0);
    parameters_["word_embedding"] = draw.Normal({vocab, h}, kStddev);
  }
  {
    Draws draw(seed, kPositionBiasComponent, 0);
    parameters_["encoder_relative_bias"] = draw.Normal({buckets_, heads_}, kStddev);
  }
  {
    Draws draw(seed, kPositionBiasComponent, 1);
    parameters_["decoder_relative_bias"] = draw.Normal({buckets_, heads_}, kStddev);
  }
  const auto layer = [&](const std::string& prefix, uint64_t component, int64_t index) {
    Draws draw(seed, component, static_cast<uint64_t>(index));
    // Draw order: q, k, v, o, [xq, xk, xv, xo], gate, up, down.
    parameters_[prefix + "attn_norm_weight"] = Ones(h);
    parameters_[prefix + "q_weight"] = draw.Normal({inner, h}, kStddev);
    parameters_[prefix + "k_weight"] = draw.Normal({inner, h}, kStddev);
    parameters_[prefix + "v_weight"] = draw.Normal({inner, h}, kStddev);
    parameters_[prefix + "o_weight"] = draw.Normal({h, inner}, residual_stddev);
    if (component == kDecoderLayerComponent) {
      parameters_[prefix + "cross_norm_weight"] = Ones(h);
      parameters_[prefix + "xq_weight"] = draw.Normal({inner, h}, kStddev);
      parameters_[prefix + "xk_weight"] = draw.Normal({inner, h}, kStddev);
      parameters_[prefix + "xv_weight"] = draw.Normal({inner, h}, kStddev);
      parameters_[prefix + "xo_weight"] = draw.Normal({h, inner}, residual_stddev);
    }
    parameters_[prefix + "mlp_norm_weight"] = Ones(h);
    parameters_[prefix + "gate_weight"] = draw.Normal({ffn, h}, kStddev);
    parameters_[prefix + "up_weight"] = draw.Normal({ffn, h}, kStddev);
    parameters_[prefix + "down_weight"] = draw.Normal({h, ffn}, residual_stddev);
  };
  for (int64_t i = 0; i < encoder_layers_; ++i) {
    layer(absl::StrCat("encoder_layer_", i, "."), kEncoderLayerComponent, i);
  }
  parameters_["encoder_norm_weight"] = Ones(h);
  for (int64_t i = 0; i < decoder_layers_; ++i) {
    layer(absl::StrCat("decoder_layer_", i, "."), kDecoderLayerComponent, i);
  }
  {
    Draws draw(seed, kHeadComponent, 0);
    parameters_["final_norm_weight"] = Ones(h);
    parameters_["head_weight"] = draw.Normal({vocab, h}, kStddev);
  }
}

torch::Tensor& ReferenceModel::P(const std::string& name) {
  const auto it = parameters_.find(name);
  TORCH_CHECK(it != parameters_.end(), "the reference model has no parameter ", name);
  return it->second;
}

torch::Tensor ReferenceModel::Embed(const std::string& prefix, const std::vector<int64_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const torch::Tensor ids = torch::tensor(tokens, torch::kInt64);
  const torch::Tensor words = P(prefix + "word_embedding").index_select(0, ids);
  // LLAMA's rotary positions and T5V11's position bias act inside attention.
  if (llama_ || t5v11_) return words;
  return words + P(prefix + "position_embedding").narrow(0, 0, n);
}

// Pre-LayerNorm layer: x + SelfAttention(LN1(x)), [+ CrossAttention(LNx(.),
// memory)], + MLP(LN2(.)) with GELU.
torch::Tensor ReferenceModel::Layer(const std::string& prefix, const torch::Tensor& x, bool causal,
                                    const torch::Tensor& memory) {
  const torch::Tensor qkv = Affine(LayerNorm(x, P(prefix + "ln1_weight"), P(prefix + "ln1_bias")),
                                   P(prefix + "qkv_weight"), P(prefix + "qkv_bias"));
  const int64_t inner = qkv.size(1) / 3;
  torch::Tensor y = x + Affine(Attention(qkv.narrow(1, 0, inner), qkv.narrow(1, inner, inner),
                                         qkv.narrow(1, 2 * inner, inner), heads_, heads_, causal),
                               P(prefix + "proj_weight"), P(prefix + "proj_bias"));
  if (memory.defined()) {
    const torch::Tensor q = Affine(LayerNorm(y, P(prefix + "lnx_weight"), P(prefix + "lnx_bias")),
                                   P(prefix + "xq_weight"), P(prefix + "xq_bias"));
    const torch::Tensor kv = Affine(memory, P(prefix + "xkv_weight"), P(prefix + "xkv_bias"));
    y = y + Affine(Attention(q, kv.narrow(1, 0, inner), kv.narrow(1, inner, inner), heads_, heads_,
                             /*causal=*/false),
                   P(prefix + "xproj_weight"), P(prefix + "xproj_bias"));
  }
  const torch::Tensor mlp =
      Gelu(Affine(LayerNorm(y, P(prefix + "ln2_weight"), P(prefix + "ln2_bias")),
                  P(prefix + "fc1_weight"), P(prefix + "fc1_bias")));
  return y + Affine(mlp, P(prefix + "fc2_weight"), P(prefix + "fc2_bias"));
}

// LLAMA layer (docs/models.md), no biases: y = x + GQA(rotary q, rotary k,
// v of RMSNorm(x)) o^T, then y + (SiLU(m gate^T) * (m up^T)) down^T with
// m = RMSNorm(y).
torch::Tensor ReferenceModel::LlamaLayer(const std::string& prefix, const torch::Tensor& x) {
  const torch::Tensor n = RmsNorm(x, P(prefix + "attn_norm_weight"), norm_epsilon_);
  const torch::Tensor q = Rotary(Affine(n, P(prefix + "q_weight")), heads_, inv_freq_);
  const torch::Tensor k = Rotary(Affine(n, P(prefix + "k_weight")), kv_heads_, inv_freq_);
  const torch::Tensor v = Affine(n, P(prefix + "v_weight"));
  const torch::Tensor y =
      x + Affine(Attention(q, k, v, heads_, kv_heads_, /*causal=*/true), P(prefix + "o_weight"));
  const torch::Tensor m = RmsNorm(y, P(prefix + "mlp_norm_weight"), norm_epsilon_);
  const torch::Tensor gated =
      Silu(Affine(m, P(prefix + "gate_weight"))) * Affine(m, P(prefix + "up_weight"));
  return y + Affine(gated, P(prefix + "down_weight"));
}

// T5V11 position bias: B[j][q][k] = table[bucket(k - q)][j], one bucket per
// relative position r = k - q (docs/models.md).
torch::Tensor ReferenceModel::PositionBias(const std::string& name, int64_t n, bool bidirectional) {
  std::vector<int64_t> bucket_of;  // bucket of r at index r + n - 1
  for (int64_t r = -(n - 1); r <= n - 1; ++r) {
    bucket_of.push_back(RelativePositionBucket(r, bidirectional, buckets_, max_distance_));
  }
  std::vector<int64_t> buckets;  // [n, n], query-major
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t k = 0; k < n; ++k) buckets.push_back(bucket_of[k - q + n - 1]);
  }
  const torch::Tensor gathered = P(name).index_select(0, torch::tensor(buckets, torch::kInt64));
  return gathered.view({n, n, heads_}).permute({2, 0, 1});
}

// T5V11 layer (docs/models.md), no biases: y = x + Attention(RMSNorm(x))
// o^T with unscaled scores plus the stack's position bias (causal in the
// decoder); decoder layers add CrossAttention(RMSNorm(y), memory) xo^T
// (unscaled, no bias, every encoder position); then
// y + (gelu_tanh(m gate^T) * (m up^T)) down^T with m = RMSNorm(y).
torch::Tensor ReferenceModel::T5V11Layer(const std::string& prefix, const torch::Tensor& x,
                                         const torch::Tensor& bias, const torch::Tensor& memory) {
  const bool decoder = memory.defined();
  const torch::Tensor n = RmsNorm(x, P(prefix + "attn_norm_weight"), norm_epsilon_);
  torch::Tensor y =
      x + Affine(Attention(Affine(n, P(prefix + "q_weight")), Affine(n, P(prefix + "k_weight")),
                           Affine(n, P(prefix + "v_weight")), heads_, heads_, /*causal=*/decoder,
                           bias, /*scaled=*/false),
                 P(prefix + "o_weight"));
  if (decoder) {
    const torch::Tensor c = RmsNorm(y, P(prefix + "cross_norm_weight"), norm_epsilon_);
    y = y + Affine(Attention(Affine(c, P(prefix + "xq_weight")),
                             Affine(memory, P(prefix + "xk_weight")),
                             Affine(memory, P(prefix + "xv_weight")), heads_, heads_,
                             /*causal=*/false, /*bias=*/{}, /*scaled=*/false),
                   P(prefix + "xo_weight"));
  }
  const torch::Tensor m = RmsNorm(y, P(prefix + "mlp_norm_weight"), norm_epsilon_);
  const torch::Tensor gated =
      GeluTanh(Affine(m, P(prefix + "gate_weight"))) * Affine(m, P(prefix + "up_weight"));
  return y + Affine(gated, P(prefix + "down_weight"));
}

// MEGATRON: final LayerNorm, then head_weight. LLAMA: final RMSNorm, then
// head_weight (word_embedding when tied). T5V11: final RMSNorm, then
// head_weight (untied, no rescaling).
torch::Tensor ReferenceModel::Head(const torch::Tensor& x) {
  if (llama_ || t5v11_) {
    return Affine(RmsNorm(x, P("final_norm_weight"), norm_epsilon_),
                  P(tied_ ? "word_embedding" : "head_weight"));
  }
  return Affine(LayerNorm(x, P("final_ln_weight"), P("final_ln_bias")), P("head_weight"));
}

// GPT: the sequence input ++ target; position p predicts token p + 1, and
// the loss covers the target tokens (every token after the first when there
// is no target). T5: the encoder reads the input, the decoder reads a start
// token (id 0) followed by the target shifted right and predicts every
// target token. T5V11 embeds both in the one word_embedding, and each stack
// adds its position bias (the encoder's over the input, the decoder's over
// the decoder input).
torch::Tensor ReferenceModel::SampleLoss(const std::vector<int64_t>& input,
                                         const std::vector<int64_t>& target,
                                         uint64_t* loss_tokens) {
  if (!t5_) {
    std::vector<int64_t> sequence = input;
    sequence.insert(sequence.end(), target.begin(), target.end());
    torch::Tensor x = Embed("", sequence);
    for (int64_t i = 0; i < encoder_layers_; ++i) {
      const std::string prefix = absl::StrCat("encoder_layer_", i, ".");
      x = llama_ ? LlamaLayer(prefix, x) : Layer(prefix, x, /*causal=*/true, {});
    }
    const size_t first = target.empty() ? 1 : std::max<size_t>(input.size(), 1);
    std::vector<int64_t> labels(sequence.begin() + static_cast<ptrdiff_t>(first), sequence.end());
    *loss_tokens += labels.size();
    if (labels.empty()) return torch::zeros({}, torch::kFloat32);
    const torch::Tensor predicting =
        Head(x).narrow(0, static_cast<int64_t>(first) - 1, static_cast<int64_t>(labels.size()));
    return TokenLoss(predicting, labels);
  }
  torch::Tensor memory = Embed("", input);
  const torch::Tensor encoder_bias =
      t5v11_ ? PositionBias("encoder_relative_bias", static_cast<int64_t>(input.size()),
                            /*bidirectional=*/true)
             : torch::Tensor();
  for (int64_t i = 0; i < encoder_layers_; ++i) {
    const std::string prefix = absl::StrCat("encoder_layer_", i, ".");
    memory = t5v11_ ? T5V11Layer(prefix, memory, encoder_bias, {})
                    : Layer(prefix, memory, /*causal=*/false, {});
  }
  memory = t5v11_ ? RmsNorm(memory, P("encoder_norm_weight"), norm_epsilon_)
                  : LayerNorm(memory, P("encoder_ln_weight"), P("encoder_ln_bias"));
  std::vector<int64_t> decoder_input = {0};
  decoder_input.insert(decoder_input.end(), target.begin(), target.end() - 1);
  torch::Tensor x = Embed(t5v11_ ? "" : "decoder_", decoder_input);
  const torch::Tensor decoder_bias =
      t5v11_ ? PositionBias("decoder_relative_bias", static_cast<int64_t>(decoder_input.size()),
                            /*bidirectional=*/false)
             : torch::Tensor();
  for (int64_t i = 0; i < decoder_layers_; ++i) {
    const std::string prefix = absl::StrCat("decoder_layer_", i, ".");
    x = t5v11_ ? T5V11Layer(prefix, x, decoder_bias, memory)
               : Layer(prefix, x, /*causal=*/true, memory);
  }
  *loss_tokens += target.size();
  return TokenLoss(Head(x), target);
}

ReferencePass ReferenceModel::Gradients(const std::vector<ReferenceSample>& samples,
                                        const SampleDataset& dataset) {
  ReferencePass pass;
  std::vector<torch::Tensor> losses;
  std::vector<int64_t> input;
  std::vector<int64_t> target;
  for (const ReferenceSample& s : samples) {
    const absl::Status read = dataset.ReadSample(s.id, &input, &target);
    TORCH_CHECK(read.ok(), "reading sample ", s.id, ": ", std::string(read.message()));
    TORCH_CHECK(s.input <= input.size() && s.target <= target.size(), "sample ", s.id,
                " is shorter than the plan says");
    input.resize(s.input);
    target.resize(s.target);
    losses.push_back(SampleLoss(input, target, &pass.loss_tokens));
  }
  for (auto& [name, p] : parameters_) p.mutable_grad() = torch::Tensor();
  const double scale = 1.0 / static_cast<double>(pass.loss_tokens);
  const torch::Tensor loss = torch::stack(losses).sum() * scale;
  loss.backward();
  pass.loss = loss.item<double>();
  double squared = 0;
  for (auto& [name, p] : parameters_) {
    torch::Tensor g = p.grad().defined() ? p.grad().detach().clone() : torch::zeros_like(p);
    squared += g.to(torch::kFloat64).pow(2).sum().item<double>();
    pass.gradients[name] = g;
  }
  pass.grad_norm = std::sqrt(squared);
  return pass;
}

void ReferenceModel::SgdStep(const NamedTensors& gradients, double learning_rate) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : parameters_) p.sub_(gradients.at(name) * learning_rate);
}

NamedTensors TensorPartOf(const NamedTensors& whole, int tensor, int index) {
  NamedTensors part;
  for (const auto& [name, t] : whole) {
    part[name] = executor::ShardOf(t.detach(), executor::ShardOfParameter(name), tensor, index);
  }
  return part;
}

TensorDifference MaxRelativeDifference(const NamedTensors& a, const NamedTensors& b) {
  TensorDifference d;
  for (const auto& [name, tensor] : a) {
    const auto other = b.find(name);
    TORCH_CHECK(other != b.end(), "the reference has no tensor ", name);
    const torch::Tensor expected = other->second.detach().to(torch::kFloat64);
    const double scale = std::max(expected.abs().max().item<double>(), 1e-30);
    const double difference =
        (tensor.detach().to(torch::kFloat64) - expected).abs().max().item<double>() / scale;
    if (difference >= d.worst) {
      d.worst = difference;
      d.worst_name = name;
    }
    ++d.compared;
  }
  return d;
}

}  // namespace varipipe::testing
