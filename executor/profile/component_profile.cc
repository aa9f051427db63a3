#include "executor/profile/component_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/loss_head_chunk.h"
#include "common/median.h"
#include "executor/model/attention_mask.h"
#include "executor/model/chunked_loss_head.h"
#include "executor/model/cuda_autocast.h"
#include "executor/model/initializer.h"
#include "executor/model/relative_position_bias.h"
#include "executor/model/rotary.h"
#include "executor/model/tensor_parallel_ops.h"
#include "executor/model/tensor_shard.h"
#include "executor/model/transformer_layer.h"
#include "executor/model/variable_length_attention.h"
#include "executor/model/variable_length_layout.h"
#include "executor/model/vocab_parallel.h"
#include "executor/runtime/counting_allocator.h"

#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define VARIPIPE_PROFILE_HAS_CUDA_ALLOCATOR 1
#endif

namespace varipipe::executor {
namespace {

#ifdef VARIPIPE_PROFILE_HAS_CUDA_ALLOCATOR
// The caching allocator's aggregate statistic (StatType::AGGREGATE, first in
// every LibTorch; newer ones declare StatType outside CUDACachingAllocator).
constexpr size_t kAggregateStat = 0;
#endif

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

// Live and peak bytes of the device: this thread's counting-allocator account
// on the CPU (it must be created before, and outlive, every tensor it
// counts), the caching allocator's statistics on a GPU.
class MemoryProbe {
 public:
  explicit MemoryProbe(torch::Device device) : device_(device), scope_(&account_) {}

#ifdef VARIPIPE_PROFILE_HAS_CUDA_ALLOCATOR
  // Defined before its callers: they need its deduced type.
  auto Stat() const {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index())
        .allocated_bytes[kAggregateStat];
  }
#endif

  int64_t Current() const {
#ifdef VARIPIPE_PROFILE_HAS_CUDA_ALLOCATOR
    if (device_.is_cuda()) return Stat().current;
#endif
    return account_.current_bytes();
  }
  int64_t Peak() const {
#ifdef VARIPIPE_PROFILE_HAS_CUDA_ALLOCATOR
    if (device_.is_cuda()) return Stat().peak;
#endif
    return account_.peak_bytes();
  }
  void ResetPeak() {
#ifdef VARIPIPE_PROFILE_HAS_CUDA_ALLOCATOR
    if (device_.is_cuda()) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
      return;
    }
#endif
    account_.ResetPeak();
  }

 private:
  torch::Device device_;
  MemoryAccount account_;
  ScopedAccount scope_;
};

// One component ready to run: its forward (output, or the loss for the LM
// head), the activations it reads that collect gradients, the gradient its
// output receives (undefined for the loss) and its parameters.
struct Runnable {
  std::function<torch::Tensor()> forward;
  std::vector<torch::Tensor> inputs;
  // Bytes of the inputs the component keeps (it is charged for them, not
  // for its output: a stage keeps its first layer's input, received or
  // embedded, and the next component keeps each output as its input);
  // negative for copies of its inputs it is not charged for (the
  // attention core's).
  int64_t kept_input_bytes = 0;
  torch::Tensor grad_output;
  std::vector<torch::Tensor> parameters;
  std::shared_ptr<TransformerLayer> layer;  // layers only
};

torch::Tensor Activation(const ProfilePoint& p, int64_t length, int64_t hidden,
                         torch::Device device) {
  return torch::randn({p.micro_batch, length, hidden}, torch::dtype(torch::kFloat32))
      .to(device)
      .requires_grad_(true);
}

// The group of unsharded components.
const TensorGroup kWholeLayers;

// This rank's part of a tensor drawn whole (tensor_shard.h), as ModelStage
// holds it.
torch::Tensor PartOf(const char* name, const torch::Tensor& full, const TensorGroup& tp) {
  return ShardOf(full, ShardOfParameter(name), tp.size(), tp.index());
}

// Rows of a layer's input: the rank's part of the sequence under sequence
// parallelism (tensor_parallel_ops.h), else all `s`.
int64_t LayerRows(int64_t s, const TensorGroup& tp) {
  return tp.sequence_parallel() ? (s + tp.size() - 1) / tp.size() : s;
}

// Makes `cache` hold the parameters of `component` (on `device`, requiring
// gradients), replacing another component's: this tensor rank's part.
void EnsureParameters(const ModelSpec& spec, v1::CostComponent component, torch::Device device,
                      const TensorGroup& tp, ComponentCache& cache) {
  if (cache.component == component && (cache.layer != nullptr || !cache.parameters.empty())) {
    return;
  }
  cache = ComponentCache{};  // frees the previous component first
  cache.component = component;
  const int64_t h = spec.hidden_size;
  switch (component) {
    case v1::DECODER_LAYER:
    case v1::ENCODER_LAYER:
      cache.layer = std::make_shared<TransformerLayer>(
          spec,
          component == v1::DECODER_LAYER ? ModelComponent::kDecoderLayer
                                         : ModelComponent::kEncoderLayer,
          0, spec.num_layers + spec.num_decoder_layers, &tp);
      cache.layer->to(device);
      // T5V11: the stack's relative bias table (a stage holds one for all
      // its layers of that stack).
      if (spec.t5v11) {
        Initializer init(spec.seed, ModelComponent::kPositionBias,
                         component == v1::DECODER_LAYER ? 1 : 0);
        cache.parameters = {
            PartOf("encoder_relative_bias",
                   init.Normal({spec.relative_buckets, spec.num_attention_heads}, kInitStddev), tp)
                .to(device)};
      }
      break;
    case v1::EMBEDDING: {
      Initializer init(spec.seed, ModelComponent::kEmbedding, 0);
      cache.parameters = {
          PartOf("word_embedding", init.Normal({spec.vocab_size, h}, kInitStddev), tp).to(device)};
      // MEGATRON's learned positions (LLAMA rotates in its layers, T5V11
      // adds a relative bias there).
      if (!spec.llama && !spec.t5v11) {
        cache.parameters.push_back(
            init.Normal({spec.max_sequence_length, h}, kInitStddev).to(device));
      }
      break;
    }
    case v1::ATTENTION_CORE:  // no parameters
      break;
    default: {  // POSTPROCESS: final LayerNorm and LM head
      Initializer init(spec.seed, ModelComponent::kHead, 0);
      // LLAMA's and T5V11's RMSNorm has no bias (an empty tensor keeps the
      // positions).
      const bool rms = spec.llama || spec.t5v11;
      cache.parameters = {
          Initializer::Ones({h}).to(device),
          rms ? torch::Tensor() : Initializer::Zeros({h}).to(device),
          PartOf("head_weight", init.Normal({spec.vocab_size, h}, kInitStddev), tp).to(device)};
      break;
    }
  }
  for (torch::Tensor& t : cache.parameters) {
    if (t.defined()) t.requires_grad_(true);
  }
}

// Drops the gradients a point's passes gave the cached parameters (they were
// counted by that point's memory probe and must not outlive it).
void ClearGradients(ComponentCache& cache) {
  if (cache.layer != nullptr) {
    for (torch::Tensor t : cache.layer->parameters()) t.mutable_grad() = torch::Tensor();
  }
  for (torch::Tensor& t : cache.parameters) {
    if (t.defined()) t.mutable_grad() = torch::Tensor();
  }
}

torch::Tensor FullLengths(const ProfilePoint& p, int64_t n, torch::Device device) {
  return torch::full({p.micro_batch}, n, torch::kInt64).to(device);
}

// T5V11: the stack's position bias is built before the forward, as a stage
// builds it once for all its layers of that stack (the memory model charges
// it per stage, PositionBiasBytes), and enters the layer as a leaf that
// receives its gradient. Undefined for other architectures.
torch::Tensor StackPositionBias(const ModelSpec& spec, const ProfilePoint& p, bool decoder,
                                torch::Device device, const ComponentCache& cache) {
  if (!spec.t5v11) return torch::Tensor();
  torch::NoGradGuard no_grad;
  const torch::Tensor positions = SequentialPositions(p.seq_len, device);
  return RelativePositionBias(
             cache.parameters[0],
             RelativePositionBuckets(positions, positions,
                                     /*bidirectional=*/!decoder, spec.relative_buckets,
                                     spec.relative_max_distance))
      .contiguous()
      .requires_grad_(true);
}

// An encoder or decoder layer (GPT layers are encoder-less decoders built
// as ENCODER_LAYER points).
void BuildLayer(const ModelSpec& spec, const ProfilePoint& p, torch::Device device,
                const ComponentCache& cache, const TensorGroup& tp, Runnable& r) {
  const int64_t s = p.seq_len;
  const bool decoder = p.component == v1::DECODER_LAYER;
  r.layer = cache.layer;
  r.layer->set_recompute_attention(p.recompute == v1::RECOMPUTE_SELECTIVE);
  r.layer->set_recompute_full(p.recompute == v1::RECOMPUTE_FULL);
  for (const torch::Tensor& t : r.layer->parameters()) r.parameters.push_back(t);
  torch::Tensor bias = StackPositionBias(spec, p, decoder, device, cache);
  const auto position = [spec, bias, s](torch::Device at) {
    if (spec.llama) return RotaryTable(spec, SequentialPositions(s, at));
    return bias;  // undefined for MEGATRON
  };
  torch::Tensor x = Activation(p, LayerRows(s, tp), spec.hidden_size, device);
  r.inputs.push_back(x);
  r.kept_input_bytes = x.nbytes();
  if (bias.defined()) r.inputs.push_back(bias);  // its gradient is reset per pass
  // GPT layers and T5 decoder layers are causal; T5 encoder layers not.
  const bool causal = decoder || !spec.encoder_decoder;
  // The masks are built inside the forward, as a stage builds them for
  // its layers, so the stored memory counts them (once per layer, where
  // a stage keeps one per micro-batch: a small overestimate).
  torch::Tensor full_lengths = FullLengths(p, s, device);
  if (!decoder) {
    r.forward = [layer = r.layer, x, full_lengths, s, causal, spec, position] {
      return layer->Forward(x, SelfAttentionMaskFor(spec.attention_kernel, full_lengths, s, causal),
                            {}, AttentionInput(), position(x.device()), s);
    };
    return;
  }
  torch::Tensor memory = Activation(p, p.encoder_len, spec.hidden_size, device);
  r.inputs.insert(r.inputs.begin() + 1, memory);
  torch::Tensor encoder_lengths = FullLengths(p, p.encoder_len, device);
  const int64_t e = p.encoder_len;
  r.forward = [layer = r.layer, x, memory, full_lengths, encoder_lengths, s, e,
               kernel = spec.attention_kernel, position] {
    return layer->Forward(x, SelfAttentionMaskFor(kernel, full_lengths, s, /*causal=*/true), memory,
                          AttentionInput::DenseMask(CrossAttentionMask(encoder_lengths, s, e)),
                          position(x.device()), s);
  };
}

// The core alone (QK^T, masking, softmax, P.V in the model's kernel) over
// the layer's Q, K and V, which the layer keeps whether the core runs over
// the row or per sample: nothing is charged for them. GPT: causal; T5:
// full, as the encoder's. The kernel is the one packed rows' attention runs
// on this device (TransformerLayer::Attention): where a variable-length
// kernel serves the device, dtype and model (CUDA, 16-bit autocast, FUSED,
// no score bias), one call over the point's b samples of s tokens, so the
// planner prices a micro-batch's samples as one launch of the same score
// area (micro_batch_cost.h); otherwise (CPUs, fp32, T5V11's biased
// self-attention) the core a sample runs alone, whose (1, l) points the
// planner sums per sample.
// The explicit kernel's batched matrix products copy Q, K and V into their
// [b * heads, s, d] layout and keep the copies for backward, where one row
// (b = 1) is a view: the layer keeps one copy of Q, K and V either way (its
// projection's output, which a sample's core views; the rows' core's
// copies, for which the projection's output is freed), so in fp32 (no
// autocast, whose casts are copies at every b) the copies are not charged,
// and the grid's points agree across b.
void BuildAttentionCore(const ModelSpec& spec, const ProfilePoint& p, torch::Device device,
                        const TensorGroup& tp, bool autocast, Runnable& r) {
  const int64_t s = p.seq_len;
  // The rank's heads.
  const int64_t heads = spec.num_attention_heads / tp.size();
  const int64_t width = heads * spec.kv_channels;
  torch::Tensor q = Activation(p, s, width, device);
  torch::Tensor k = Activation(p, s, width, device);
  torch::Tensor v = Activation(p, s, width, device);
  r.inputs = {q, k, v};
  const bool causal = !spec.encoder_decoder;
  const AttentionInput input =
      SelfAttentionMaskFor(spec.attention_kernel, FullLengths(p, s, device), s, causal);
  const torch::Tensor mask = input.is_causal() ? torch::Tensor() : input.mask();
  const bool fused = spec.attention_kernel == v1::FUSED;
  // Every row one sample of s tokens, as packed rows' layouts hold them.
  const c10::intrusive_ptr<VariableLengthLayout> layout = VariableLengthLayout::FromSegments(
      torch::zeros({p.micro_batch, s}, torch::kInt64),
      torch::zeros({p.micro_batch, s}, torch::kInt64), causal);
  r.forward = [q, k, v, mask, fused, heads, layout, head_dim = spec.kv_channels,
               biased = spec.t5v11, scaled = !spec.t5v11] {
    // Chosen inside the forward: under autocast, in the compute dtype.
    const torch::Tensor cq = q.to(ComputeDtype(q));
    if (const VariableLengthKernel* kernel =
            VariableLengthKernelFor(cq, head_dim, biased, fused)) {
      const double scale = scaled ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
      return VariableLengthAttention(cq, k.to(cq.scalar_type()), v.to(cq.scalar_type()), layout,
                                     heads, scale, *kernel);
    }
    return fused ? FusedAttention(q, k, v, mask, heads, {}, scaled)
                 : MaskedAttention(q, k, v, mask, heads, {}, scaled);
  };
  r.grad_output = torch::randn({p.micro_batch, s, width}, torch::dtype(torch::kFloat32)).to(device);
  const bool variable_length =
      VariableLengthKernelFor(q.to(ComputeDtype(q)), spec.kv_channels, spec.t5v11, fused) != nullptr;
  if (!fused && !variable_length && !autocast && p.micro_batch > 1) {
    r.kept_input_bytes = -3 * q.nbytes();
  }
}

void BuildEmbedding(const ModelSpec& spec, const ProfilePoint& p, torch::Device device,
                    const ComponentCache& cache, const TensorGroup& tp, Runnable& r) {
  const int64_t s = p.seq_len;
  const torch::Tensor word = cache.parameters[0];
  const torch::Tensor position = spec.llama || spec.t5v11 ? torch::Tensor() : cache.parameters[1];
  r.parameters = cache.parameters;
  torch::Tensor tokens =
      torch::randint(spec.vocab_size, {p.micro_batch, s}, torch::kInt64).to(device);
  r.kept_input_bytes = tokens.nbytes();  // the backward keeps the token ids
  const int64_t begin = RangeOfPart(spec.vocab_size, tp.size(), tp.index()).begin;
  r.forward = [word, position, tokens, s, begin, &tp] {
    const torch::Tensor words = VocabParallelEmbedding(tokens, word, begin, tp);
    return position.defined() ? words + position.slice(0, 0, s).unsqueeze(0) : words;
  };
}

// The final norm, the LM head and the summed token loss, as a stage runs
// them (ModelStage's head: chunked, LossChunkTokens of `chunk_tokens`): the point's
// b * s positions are all labelled, so the planner reads the grid at a
// micro-batch's labelled tokens.
void BuildPostprocess(const ModelSpec& spec, const ProfilePoint& p, torch::Device device,
                      const ComponentCache& cache, const TensorGroup& tp, int64_t chunk_tokens,
                      Runnable& r) {
  const int64_t h = spec.hidden_size;
  const torch::Tensor weight = cache.parameters[0];
  const torch::Tensor bias = cache.parameters[1];
  const torch::Tensor head = cache.parameters[2];
  for (const torch::Tensor& t : cache.parameters) {
    if (t.defined()) r.parameters.push_back(t);
  }
  torch::Tensor x = Activation(p, p.seq_len, h, device);
  r.inputs.push_back(x);
  torch::Tensor labels =
      torch::randint(spec.vocab_size, {p.micro_batch * p.seq_len}, torch::kInt64).to(device);
  r.kept_input_bytes = x.nbytes() + labels.nbytes();
  const bool rms = spec.llama || spec.t5v11;
  const double epsilon = spec.norm_epsilon;
  const int64_t begin = RangeOfPart(spec.vocab_size, tp.size(), tp.index()).begin;
  const int64_t chunk = LossChunkTokens(chunk_tokens, head.size(0));
  r.forward = [x, weight, bias, head, labels, h, rms, epsilon, begin, chunk, &tp] {
    const torch::Tensor rows = x.reshape({-1, h});
    const torch::Tensor normed =
        rms ? RmsNorm(rows, weight, epsilon) : torch::layer_norm(rows, {h}, weight, bias, 1e-5);
    // The rank's logits, a chunk at a time (vocabulary-parallel under
    // tensor parallelism).
    return ChunkedLinearCrossEntropy(CopyToTensorRegion(normed, tp), head, labels, begin, tp,
                                     chunk);
  };
}

// The point's inputs and forward around the parameters in `cache`
// (EnsureParameters for p.component).
Runnable Build(const ModelSpec& spec, const ProfilePoint& p, torch::Device device,
               const ComponentCache& cache, const TensorGroup& tp, int64_t chunk_tokens,
               bool autocast) {
  Runnable r;
  int64_t rows = p.seq_len;  // of the output
  switch (p.component) {
    case v1::DECODER_LAYER:
    case v1::ENCODER_LAYER:
      BuildLayer(spec, p, device, cache, tp, r);
      rows = LayerRows(p.seq_len, tp);
      break;
    case v1::ATTENTION_CORE:
      BuildAttentionCore(spec, p, device, tp, autocast, r);
      return r;  // its own gradient shape
    case v1::EMBEDDING:
      BuildEmbedding(spec, p, device, cache, tp, r);
      break;
    default:  // POSTPROCESS: its output is the loss
      BuildPostprocess(spec, p, device, cache, tp, chunk_tokens, r);
      return r;
  }
  r.grad_output =
      torch::randn({p.micro_batch, rows, spec.hidden_size}, torch::dtype(torch::kFloat32))
          .to(device);
  return r;
}

void Synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Pass {
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t stored = 0;
  int64_t peak = 0;
};

// One forward and backward as the executor runs them (the layer's own
// recompute settings: selective and full recomputation happen inside it).
Pass RunOnce(Runnable& r, const ProfileSettings& settings, MemoryProbe& probe) {
  const auto forward = [&] {
    const bool autocast = settings.cuda_autocast_dtype.has_value();
    if (autocast) {
      SetCudaAutocastDtype(*settings.cuda_autocast_dtype);
      SetCudaAutocastEnabled(true);
    }
    torch::Tensor out = r.forward();
    if (autocast) {
      SetCudaAutocastEnabled(false);
      at::autocast::clear_cache();
    }
    return out;
  };
  for (torch::Tensor& x : r.inputs) x.mutable_grad() = torch::Tensor();
  Synchronize(settings.device);
  probe.ResetPeak();
  const int64_t base = probe.Current();
  Pass pass;
  const Clock::time_point start = Clock::now();
  torch::Tensor out = forward();
  Synchronize(settings.device);
  const Clock::time_point forwarded = Clock::now();
  // Charged for the inputs it keeps, not for its output (add nodes keep no
  // output; the next component keeps it as its input).
  const int64_t output_bytes = r.grad_output.defined() ? out.nbytes() : 0;
  pass.stored = probe.Current() - base + r.kept_input_bytes - output_bytes;
  // The gradient the backward receives is a buffer of its own (a stage
  // receives it from the next one) and counts in the peak.
  const torch::Tensor grad = r.grad_output.defined()
                                 ? r.grad_output.to(out.scalar_type(), /*non_blocking=*/false,
                                                    /*copy=*/true)
                                 : torch::Tensor();
  Synchronize(settings.device);
  const Clock::time_point backward_start = Clock::now();
  if (grad.defined()) {
    out.backward(grad);
  } else {
    out.backward();
  }
  out = torch::Tensor();
  Synchronize(settings.device);
  const Clock::time_point done = Clock::now();
  pass.peak = probe.Peak() - base + r.kept_input_bytes;
  pass.forward_ms = Ms(forwarded - start);
  pass.backward_ms = Ms(done - backward_start);
  {
    torch::NoGradGuard no_grad;
    for (torch::Tensor& w : r.parameters) {
      if (w.grad().defined()) w.mutable_grad().zero_();
    }
  }
  return pass;
}

}  // namespace

absl::StatusOr<PointCosts> MeasurePoint(const ModelSpec& spec, const ProfilePoint& point,
                                        const ProfileSettings& settings, ComponentCache* cache) {
  if (point.micro_batch < 1 || point.seq_len < 1 ||
      (point.component == v1::DECODER_LAYER && point.encoder_len < 1)) {
    return absl::InvalidArgumentError("profile points need positive sizes and lengths");
  }
  ComponentCache local;
  ComponentCache& parameters = cache != nullptr ? *cache : local;
  try {
    const TensorGroup& tp = settings.tensor != nullptr ? *settings.tensor : kWholeLayers;
    if (tp.size() != spec.tensor_parallel) {
      return absl::InvalidArgumentError(
          absl::StrCat("a tensor group of ", tp.size(),
                       " ranks for a model of tensor-parallel degree ", spec.tensor_parallel));
    }
    // Parameters before the probe: they are model state, and outlive it.
    EnsureParameters(spec, point.component, settings.device, tp, parameters);
    MemoryProbe probe(settings.device);  // outlives every tensor below
    const absl::Cleanup clear_gradients = [&parameters] { ClearGradients(parameters); };
    Runnable runnable =
        Build(spec, point, settings.device, parameters, tp, settings.loss_chunk_tokens,
              settings.cuda_autocast_dtype.has_value());
    // Warm-up passes also allocate the parameters' gradients, which are
    // model state and must not count as activation memory.
    for (int i = 0; i < std::max(1, settings.warmup); ++i) {
      RunOnce(runnable, settings, probe);
    }
    std::vector<double> forward;
    std::vector<double> backward;
    PointCosts costs;
    for (int i = 0; i < std::max(1, settings.repeats); ++i) {
      const Pass pass = RunOnce(runnable, settings, probe);
      forward.push_back(pass.forward_ms);
      backward.push_back(pass.backward_ms);
      costs.stored_mib = std::max(costs.stored_mib, static_cast<double>(pass.stored) / kMiB);
      costs.peak_mib = std::max(costs.peak_mib, static_cast<double>(pass.peak) / kMiB);
    }
    costs.forward_ms = Median(forward);
    costs.backward_ms = Median(backward);
    costs.peak_mib = std::max(costs.peak_mib, costs.stored_mib);
    return costs;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string where = absl::StrCat(v1::CostComponent_Name(point.component),
                                           " b=", point.micro_batch, " s=", point.seq_len);
    if (absl::StrContains(what, "out of memory") || absl::StrContains(what, "bad_alloc")) {
      return absl::ResourceExhaustedError(absl::StrCat(where, ": out of memory: ", what));
    }
    return absl::InternalError(absl::StrCat(where, ": ", what));
  }
}

double ComponentParameters(const ModelSpec& spec, v1::CostComponent component) {
  const double h = static_cast<double>(spec.hidden_size);
  const double vocab = static_cast<double>(spec.vocab_size);
  switch (component) {
    case v1::ENCODER_LAYER:
    case v1::DECODER_LAYER: {
      torch::NoGradGuard no_grad;
      ModelSpec whole = spec;  // unsharded counts, whatever the tensor degree
      whole.tensor_parallel = 1;
      const TransformerLayer layer(whole,
                                   component == v1::DECODER_LAYER ? ModelComponent::kDecoderLayer
                                                                  : ModelComponent::kEncoderLayer,
                                   0, spec.num_layers + spec.num_decoder_layers, &kWholeLayers);
      double n = 0;
      for (const torch::Tensor& t : layer.parameters()) n += static_cast<double>(t.numel());
      return n;
    }
    case v1::ATTENTION_CORE:
      return 0;
    case v1::EMBEDDING:  // LLAMA, T5V11: no position table
      return (vocab +
              (spec.llama || spec.t5v11 ? 0.0 : static_cast<double>(spec.max_sequence_length))) *
             h;
    default:  // LM head and the final LayerNorm (LLAMA, T5V11: RMSNorm, no bias)
      return vocab * h + (spec.llama || spec.t5v11 ? 1 : 2) * h;
  }
}

}  // namespace varipipe::executor
