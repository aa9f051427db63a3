#include "planner/cost/analytic_model.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/loss_head_chunk.h"

namespace varipipe::planner {
namespace {

constexpr double kMaskBytes = 1;  // dropout masks are stored as bytes
constexpr double kStatBytes = 4;  // FlashAttention's row statistics are fp32
// What the loss head keeps per labelled token beside its rows: its
// position and label (int64), the label's column (int64) and whether this
// rank holds it, its fp32 log-sum-exp and label mask.
constexpr double kHeadTokenBytes = 8 + 8 + 8 + 1 + 4 + 4;
// One step of a tensor group's ring collective: a kernel launch and a hop on
// the node's link (NVLink-class latency).
constexpr double kTensorStepLatencyUs = 5;
// The executor's tensor collectives move fp32 (tensor_group.h), except
// all-gathers of 2-byte elements, which travel as they are.
constexpr double kTensorCollectiveBytes = 4;

// The vocabulary rows of the busiest tensor rank (executor/model/
// tensor_shard.h: ceil(V / t) each, the last rank the rest).
double VocabRows(const ModelDims& d, double t) {
  return std::ceil(static_cast<double>(d.vocab) / t);
}

// The divisor of what sequence parallelism splits along the sequence.
double SequenceDivisor(uint32_t tp, bool sequence_parallel) {
  return sequence_parallel && tp > 1 ? static_cast<double>(tp) : 1.0;
}

// Stored bytes of one attention block with queries over s_q and keys/values
// over s_kv (self-attention: s_q == s_kv), Korthikanti et al. Table 2
// generalised: B = element bytes, A = heads * kv_channels, a = heads.
//   inputs kept: LayerNorm input B*s_q*b*h, projection input(s)
//   Q B*s_q*b*A/t, K and V B*s_kv*b*A/t each, output projection input
//   B*s_q*b*A/t, output dropout mask s_q*b*h,
//   score path (explicit kernel only, and not with selective recomputation):
//   softmax output B, dropout mask 1, dropout output B bytes per element of
//   the a*s_q*s_kv*b score tensor (/t).
// A fused kernel (FlashAttention, Dao et al. 2022, section 3.1) keeps no
// score tensor, only one fp32 logsumexp per query row and head,
// 4*a*s_q*b/t; its output is the output projection input counted above.
// Cross-attention also keeps the encoder output (K/V projection input)
// B*s_kv*b*h. `r` divides what sequence parallelism splits (r = t, else 1):
// the LayerNorm input and the output dropout mask.
double AttentionStored(const ModelDims& d, Recompute recompute, double b, double s_q, double s_kv,
                       bool cross, double t, double r) {
  const double B = d.dtype_bytes;
  const double h = d.hidden;
  const double A = static_cast<double>(d.attention_width());
  const double a = d.heads;
  double bytes = B * s_q * b * h / r              // LayerNorm input
                 + B * s_q * b * h                // QKV (or Q) projection input
                 + B * s_q * b * A / t            // Q
                 + 2 * B * s_kv * b * A / t       // K, V
                 + B * s_q * b * A / t            // output projection input
                 + kMaskBytes * s_q * b * h / r;  // output dropout mask
  if (cross) bytes += B * s_kv * b * h;       // encoder output, K/V projection input
  if (d.attention_kernel == AttentionKernel::kFused) {
    bytes += kStatBytes * a * s_q * b / t;  // logsumexp per query row
  } else if (recompute != Recompute::kSelective) {
    bytes += (2 * B + kMaskBytes) * a * s_q * s_kv * b / t;  // softmax, mask, dropout output
  }
  return bytes;
}

// Stored bytes of the MLP block: LayerNorm input (/r), fc1 input, GeLU input
// and output (ffn wide), dropout mask (/r).
double MlpStored(const ModelDims& d, double b, double s, double t, double r) {
  const double B = d.dtype_bytes;
  return B * s * b * d.hidden / r + B * s * b * d.hidden + 2 * B * s * b * d.ffn / t +
         kMaskBytes * s * b * d.hidden / r;
}

// LLAMA (docs/models.md, "The LLAMA layer"): the same terms for its blocks,
// with K = key_value_heads * kv_channels the width of K and V under
// grouped-query attention (K = A without it), and what the architecture
// drops: no dropout anywhere (no masks, no dropout output), RMSNorm (its
// input kept, as LayerNorm's; the per-row statistic is left out for both).
//   attention: RMSNorm input B*s*b*h, q/k/v projection input B*s*b*h
//   (one tensor feeds all three), Q B*s*b*A/t, K and V B*s*b*K/t each
//   (after rotary embedding, which keeps nothing of its own: it is linear in
//   Q and K with fixed cos/sin tables), output projection input B*s*b*A/t;
//   score path (explicit kernel, no selective recomputation): the softmax
//   output B*a*s^2*b/t only, which both the softmax backward and P.V's use;
//   fused kernel: the logsumexp 4*a*s*b/t as for MEGATRON.
//   SwiGLU MLP: RMSNorm input B*s*b*h, gate/up projection input B*s*b*h,
//   and four ffn-wide tensors B*s*b*f/t each: the gate projection's output
//   (silu's input), silu's output and the up projection's output (the
//   product's operands) and their product (the down projection's input).
// Total without recomputation, explicit kernel:
//   4B*sbh + 2B*sb(A + K)/t + 4B*sbf/t + B*a*s^2*b/t.
// An implementation that repeats K and V to all `a` heads before the core
// (rather than grouping the query heads over each key/value head) keeps
// A-wide copies instead; a measured profile records what the executor keeps.
double LlamaAttentionStored(const ModelDims& d, Recompute recompute, double b, double s, double t,
                            double r) {
  const double B = d.dtype_bytes;
  const double h = d.hidden;
  const double A = static_cast<double>(d.attention_width());
  const double K = static_cast<double>(d.kv_width());
  const double a = d.heads;
  double bytes = B * s * b * h / r        // RMSNorm input
                 + B * s * b * h          // q/k/v projection input
                 + B * s * b * A / t      // Q
                 + 2 * B * s * b * K / t  // K, V
                 + B * s * b * A / t;     // output projection input
  if (d.attention_kernel == AttentionKernel::kFused) {
    bytes += kStatBytes * a * s * b / t;  // logsumexp per query row
  } else if (recompute != Recompute::kSelective) {
    bytes += B * a * s * s * b / t;  // softmax output
  }
  return bytes;
}

double LlamaMlpStored(const ModelDims& d, double b, double s, double t, double r) {
  const double B = d.dtype_bytes;
  // RMSNorm input (/r), gate/up input; gate output, silu output, up output,
  // their product.
  return B * s * b * d.hidden / r + B * s * b * d.hidden + 4 * B * s * b * d.ffn / t;
}

// T5V11 (docs/models.md, "The T5V11 layers"): the self-attention block and
// the MLP keep LLAMA's terms with K = A (multi-head attention): RMSNorm
// input, q/k/v projection input (one tensor feeds the three), Q, K, V and
// the output projection input; the softmax output on the explicit path (the
// position bias is added to the scores, which keeps nothing: the bias itself
// is the stage's, kept once per stack: StageLayout::PositionBiasBytes), the
// logsumexp on the fused one; the gated-GELU MLP's four ffn-wide tensors
// (gate output = GELU input, GELU output, up output, product = down input),
// as SwiGLU's. No dropout. A decoder layer adds its cross-attention block,
// queries over s and keys/values over the encoder's e positions, no
// position bias:
//   RMSNorm input B*s*b*h, xq projection input B*s*b*h, the encoder output
//   (xk/xv projection input, charged to every decoder layer as MEGATRON's
//   is) B*e*b*h, Q B*s*b*A/t, K and V 2B*e*b*A/t, xo projection input
//   B*s*b*A/t; score path (explicit kernel, no selective recomputation):
//   the softmax output B*a*s*e*b/t; fused kernel: the logsumexp 4*a*s*b/t.
double T5V11CrossAttentionStored(const ModelDims& d, Recompute recompute, double b, double s,
                                 double e, double t, double r) {
  const double B = d.dtype_bytes;
  const double h = d.hidden;
  const double A = static_cast<double>(d.attention_width());
  const double a = d.heads;
  double bytes = B * s * b * h / r        // RMSNorm input
                 + B * s * b * h          // xq projection input
                 + B * e * b * h          // encoder output, xk/xv projection input
                 + B * s * b * A / t      // Q
                 + 2 * B * e * b * A / t  // K, V
                 + B * s * b * A / t;     // xo projection input
  if (d.attention_kernel == AttentionKernel::kFused) {
    bytes += kStatBytes * a * s * b / t;  // logsumexp per query row
  } else if (recompute != Recompute::kSelective) {
    bytes += B * a * s * e * b / t;  // softmax output
  }
  return bytes;
}

// Elementwise traffic of a layer's forward pass: every stored activation is
// written once and read once (LayerNorm, softmax, GeLU, dropout, residuals).
double ElementwiseBytes(double stored_without_recompute) { return 2 * stored_without_recompute; }

double MatrixMs(const Hardware& hw, const ModelDims& d, double flops, double tokens) {
  const double peak = (d.dtype_bytes >= 4 ? hw.peak_tflops_fp32 : hw.peak_tflops_16bit) * 1e12;
  return flops / (peak * hw.Efficiency(tokens)) * 1e3;
}

double MemoryMs(const Hardware& hw, double bytes) {
  return bytes / (hw.memory_bandwidth_gbps * 1e9) * 1e3;
}

// Attention-core FLOPs (QK^T and scores x V) of a block.
double AttentionCoreFlops(const ModelDims& d, double b, double s_q, double s_kv, double t) {
  return 4 * b * s_q * s_kv * static_cast<double>(d.attention_width()) / t;
}

// Matrix time of one layer's forward pass. Each GEMM group runs at the
// efficiency of its own token count: the cross-attention K/V projections of
// a decoder layer work on the encoder's b * encoder_s tokens, everything else
// on the layer's b * s tokens (so time grows with every length and with b).
double LayerMatrixMs(const ModelDims& d, const Hardware& hw, double t, double b, double s,
                     double encoder_s, bool decoder) {
  const double own = b * s;
  double ms = MatrixMs(hw, d, EncoderLayerForwardFlops(d, b, s, t), own);
  if (decoder) {
    const double h = d.hidden;
    const double A = static_cast<double>(d.attention_width());
    ms += MatrixMs(hw, d, 4 * b * s * h * A / t + AttentionCoreFlops(d, b, s, encoder_s, t), own);
    ms += MatrixMs(hw, d, 4 * b * encoder_s * h * A / t, b * encoder_s);
  }
  return ms;
}

// Extra backward work of a fused attention core: FlashAttention's backward
// recomputes the scores S = QK^T block by block from Q, K and the stored
// logsumexp (Dao et al. 2022, section 3.1, Algorithm 4): 2*b*s_q*s_kv*A/t
// FLOPs on top of the explicit kernel's 8*b*s_q*s_kv*A/t.
double FusedRecomputeFlops(const ModelDims& d, double b, double s, double encoder_s, bool decoder,
                           double t) {
  double flops = AttentionCoreFlops(d, b, s, s, t) / 2;
  if (decoder) flops += AttentionCoreFlops(d, b, s, encoder_s, t) / 2;
  return flops;
}

// The tensor group's collectives of one layer (Megatron's f and g, figure
// 3 of Shoeybi et al.): forward, g after each branch's row-parallel output
// projection (self-attention, MLP, and a decoder's cross-attention), all on
// b * s * h values; backward, f on each branch's input (the same), and a
// decoder's f on the encoder output, b * encoder_s * h values. Sequence
// parallelism's all-gather and reduce-scatter pairs (not the encoder
// output's f, an all-reduce either way) move the same values: each half of
// a ring all-reduce's steps, the reduce-scatter's in fp32 and the
// all-gather's in the model's dtype (bf16 and fp16 as they are).
struct LayerCommunication {
  double forward_ms = 0;
  double backward_ms = 0;
};
LayerCommunication TensorCommunication(const ModelDims& d, const TensorLink& link, uint32_t t,
                                       double b, double s, double encoder_s, bool decoder) {
  const double gathered_bytes =
      link.sequence_parallel && d.dtype_bytes == 2 ? 2.0 : kTensorCollectiveBytes;
  const double values = b * s * d.hidden;
  const double branch = 0.5 * TensorAllReduceMs(link, t, kTensorCollectiveBytes * values) +
                        0.5 * TensorAllReduceMs(link, t, gathered_bytes * values);
  const double branches = decoder ? 3 : 2;
  LayerCommunication c{.forward_ms = branches * branch, .backward_ms = branches * branch};
  if (decoder) {
    // The encoder output enters the tensor region whole (an identity
    // forward), with or without sequence parallelism: its backward is an
    // all-reduce of fp32.
    c.backward_ms += TensorAllReduceMs(link, t, kTensorCollectiveBytes * b * encoder_s * d.hidden);
  }
  return c;
}

CostValues LayerCost(const ModelDims& d, const Hardware& hw, Recompute recompute, double t,
                     double b, double s, double encoder_s, bool decoder, const TensorLink& link) {
  const bool fused = d.attention_kernel == AttentionKernel::kFused;
  const uint32_t tp = static_cast<uint32_t>(t);
  const bool sp = link.sequence_parallel;
  const double stored_none =
      decoder ? DecoderLayerStoredBytes(d, Recompute::kNone, b, s, encoder_s, tp, sp)
              : EncoderLayerStoredBytes(d, Recompute::kNone, b, s, tp, sp);
  const double stored = decoder ? DecoderLayerStoredBytes(d, recompute, b, s, encoder_s, tp, sp)
                                : EncoderLayerStoredBytes(d, recompute, b, s, tp, sp);
  const double tokens = b * s;
  const double overhead_ms = hw.layer_overhead_us * 1e-3;
  const LayerCommunication communication =
      TensorCommunication(d, link, tp, b, s, encoder_s, decoder);
  const double compute_ms = LayerMatrixMs(d, hw, t, b, s, encoder_s, decoder) +
                            MemoryMs(hw, ElementwiseBytes(stored_none)) + overhead_ms;
  const double forward_ms = compute_ms + communication.forward_ms;
  double backward_ms = 2 * (compute_ms - overhead_ms) + overhead_ms + communication.backward_ms;
  if (fused) {
    backward_ms += MatrixMs(hw, d, FusedRecomputeFlops(d, b, s, encoder_s, decoder, t), tokens);
  }
  // Largest transient tensor of the backward pass: the score gradient (a
  // fused kernel instead holds one fp32 value per query row and head,
  // D = rowsum(dO o O)) or the GeLU gradient (LLAMA: the gate and up
  // gradients, which the product's backward produces together).
  const double B = d.dtype_bytes;
  const double score = fused ? kStatBytes * d.heads * s * b / t
                             : B * d.heads * s * (decoder ? std::max(s, encoder_s) : s) * b / t;
  const double mlp_gradient = (d.gated_mlp() ? 2 : 1) * B * s * b * d.ffn / t;
  const double transient = std::max(score, mlp_gradient);
  double peak = stored + transient;
  switch (recompute) {
    case Recompute::kNone:
      break;
    case Recompute::kSelective: {
      // A fused kernel keeps no score tensors: there is nothing to
      // recompute, selective costs what no recomputation does.
      if (fused) break;
      // Recompute QK^T, softmax and dropout of every attention block
      // (LLAMA: no attention dropout, the softmax output alone).
      const double per_score = d.dropout() ? 2 * B + kMaskBytes : B;
      double core = AttentionCoreFlops(d, b, s, s, t);
      double score_bytes = per_score * d.heads * s * s * b / t;
      if (decoder) {
        core += AttentionCoreFlops(d, b, s, encoder_s, t);
        score_bytes += per_score * d.heads * s * encoder_s * b / t;
      }
      backward_ms += MatrixMs(hw, d, core, tokens) + MemoryMs(hw, 2 * score_bytes);
      peak = stored + score_bytes + transient;
      break;
    }
    case Recompute::kFull:
      // Rerun the whole forward pass (its collectives included),
      // materialising its activations.
      backward_ms += forward_ms;
      peak = stored + stored_none + transient;
      break;
  }
  return {forward_ms, backward_ms, stored, peak};
}

// The attention core of one self-attention block without recomputation
// (Component::kAttentionCore): QK^T and P.V, 4*b*s^2*A/t FLOPs forward and
// twice that backward (a fused kernel adds its score recomputation); the
// explicit kernel stores the softmax output, dropout mask and dropout output
// per score element (LLAMA, T5V11: the softmax output alone) and its largest
// transient is the score gradient; a fused kernel stores and holds one fp32
// logsumexp per query row and head. Its launch overhead is a quarter of a
// layer's (four kernels of the layer's ~16), so that a packed row's samples
// each pay one. Q, K, V and the output belong to the layer: they are the
// same whether the core runs over the row or per sample.
CostValues AttentionCoreCost(const ModelDims& d, const Hardware& hw, double t, double b, double s) {
  const bool fused = d.attention_kernel == AttentionKernel::kFused;
  const double B = d.dtype_bytes;
  const double scores = d.heads * s * s * b / t;
  const double per_score = d.dropout() ? 2 * B + kMaskBytes : B;
  const double stored = fused ? kStatBytes * d.heads * s * b / t : per_score * scores;
  const double transient = fused ? kStatBytes * d.heads * s * b / t : B * scores;
  const double overhead_ms = hw.layer_overhead_us * 1e-3 / 4;
  const double core = AttentionCoreFlops(d, b, s, s, t);
  const double forward_ms =
      MatrixMs(hw, d, core, b * s) + MemoryMs(hw, ElementwiseBytes(stored)) + overhead_ms;
  double backward_ms = 2 * (forward_ms - overhead_ms) + overhead_ms;
  if (fused) backward_ms += MatrixMs(hw, d, core / 2, b * s);
  return {forward_ms, backward_ms, stored, stored + transient};
}

CostValues LocalEmbeddingCost(const ModelDims& d, const Hardware& hw, double b, double s);
CostValues LocalPostprocessCost(const ModelDims& d, const Hardware& hw, double t, double b,
                                double s, double n);

// Vocabulary-parallel (t > 1): the ranks' partial rows are all-reduced in
// the forward pass (g).
CostValues EmbeddingCost(const ModelDims& d, const Hardware& hw, double t, double b, double s,
                         const TensorLink& link) {
  CostValues c = LocalEmbeddingCost(d, hw, b, s);
  c.forward_ms +=
      TensorAllReduceMs(link, static_cast<uint32_t>(t), kTensorCollectiveBytes * b * s * d.hidden);
  return c;
}

CostValues LocalEmbeddingCost(const ModelDims& d, const Hardware& hw, double b, double s) {
  const double B = d.dtype_bytes;
  const double out = B * b * s * d.hidden;  // embedding output (vocab-parallel: full width)
  const double overhead_ms = hw.layer_overhead_us * 1e-3;
  if (!d.position_table()) {
    // LLAMA and T5V11 (each stack's first stage looks its tokens up in the
    // one word_embedding): no position table and no dropout: the forward
    // gathers the rows and
    // writes them, the backward reads the gradient and scatter-adds it into
    // the table (read and write); only the token ids are kept.
    const double forward_ms = MemoryMs(hw, 2 * out) + overhead_ms;
    const double backward_ms = MemoryMs(hw, 3 * out) + overhead_ms;
    const double stored = 8.0 * b * s;  // ids
    return {forward_ms, backward_ms, stored, stored + out};
  }
  // Forward: gather rows and write them (plus dropout); backward: scatter-add
  // the gradient into the table.
  const double forward_ms = MemoryMs(hw, 3 * out) + overhead_ms;
  const double backward_ms = MemoryMs(hw, 4 * out) + overhead_ms;
  const double stored = 8.0 * b * s + kMaskBytes * b * s * d.hidden;  // ids, dropout mask
  return {forward_ms, backward_ms, stored, stored + out};
}

// The vocabulary-parallel head and loss (t > 1) over n labelled tokens: f
// on the head's gathered input in the backward pass (n * h values); the
// loss all-gathers one log-sum-exp and all-reduces one target logit per
// labelled token (an all-reduce of 2 * n values bounds both).
CostValues PostprocessCost(const ModelDims& d, const Hardware& hw, double t, double b, double s,
                           double n, const TensorLink& link) {
  CostValues c = LocalPostprocessCost(d, hw, t, b, s, n);
  const uint32_t tp = static_cast<uint32_t>(t);
  c.forward_ms += TensorAllReduceMs(link, tp, kTensorCollectiveBytes * 2 * n);
  c.backward_ms += TensorAllReduceMs(link, tp, kTensorCollectiveBytes * n * d.hidden);
  return c;
}

CostValues LocalPostprocessCost(const ModelDims& d, const Hardware& hw, double t, double b,
                                double s, double n) {
  // The head runs on the n labelled positions only, a chunk at a time
  // (executor/model/chunked_loss_head.h; a grid point has n = b * s, as the
  // profiler measures it), over the rank's vocabulary rows V_r in chunks of
  // c = LossChunkTokens(d.loss_chunk_tokens, V_r) (the job's chunk, or the
  // default).
  const double rows = VocabRows(d, t);
  const double chunk = std::min(n, HeadLossChunkTokens(d, static_cast<uint32_t>(t)));
  const double B = d.dtype_bytes;
  const double logits = 4.0 * n * rows;  // fp32 logits, never held at once
  const double flops = 2 * n * d.hidden * rows;
  const double overhead_ms = hw.layer_overhead_us * 1e-3;
  // Final LayerNorm (LLAMA, T5V11: RMSNorm) and, per chunk, the head GEMM
  // and the fp32 log-sum-exp (forward); the GEMM again, softmax minus one-hot
  // and the input and weight gradient GEMMs (backward: three GEMMs). The
  // same for every architecture, tied head or not (T5: the target tokens).
  const double forward_ms = MatrixMs(hw, d, flops, n) + MemoryMs(hw, 3 * logits) + overhead_ms;
  const double backward_ms = MatrixMs(hw, d, 3 * flops, n) + MemoryMs(hw, 4 * logits) + overhead_ms;
  // Kept: the input [b, s, h] and the labels of every position; per
  // labelled token its gathered rows (the norm's input and the head's) and
  // kHeadTokenBytes.
  const double stored = (B * d.hidden + 8) * b * s + (2.0 * B * d.hidden + kHeadTokenBytes) * n;
  // At the backward's peak: one chunk's logits (HeadChunkTransientBytes).
  // The weight gradient's transient, as every layer's, is the model
  // state's (fp32 gradients).
  const double transient = HeadChunkTransientBytes(d, static_cast<uint32_t>(t), chunk);
  return {forward_ms, backward_ms, stored, stored + transient};
}

std::vector<uint32_t> PowersOfTwo(uint32_t from, uint32_t up_to) {
  std::vector<uint32_t> axis;
  const uint32_t last = std::bit_ceil(std::max(from, up_to));
  for (uint32_t v = from; v <= last; v *= 2) axis.push_back(v);
  return axis;
}

}  // namespace

double EncoderLayerForwardFlops(const ModelDims& d, double b, double s, uint32_t tp) {
  const double t = tp;
  const double h = d.hidden;
  const double A = static_cast<double>(d.attention_width());
  if (d.llama()) {
    // Q projection 2bshA, K and V projections 4bshK (K = key/value heads *
    // kv_channels), output projection 2bsAh; SwiGLU gate and up 4bshf, down
    // 2bsfh; all /t. The attention core is over the query heads, 4 b s^2 A
    // / t, whatever the key/value heads. RMSNorm, rotary, silu and the
    // product are elementwise (memory-bound, counted in bytes).
    const double K = static_cast<double>(d.kv_width());
    return (4 * b * s * h * A + 4 * b * s * h * K + 6 * b * s * h * d.ffn) / t +
           AttentionCoreFlops(d, b, s, s, t);
  }
  // QKV projections 6bshA, output projection 2bsAh, MLP 4bshf (T5V11's
  // gated GELU: gate, up and down, 6bshf), all /t; attention core 4 b s^2
  // A / t. T5V11's position bias add, RMSNorm, GELU and the product are
  // elementwise.
  const double mlp_matrices = d.gated_mlp() ? 3 : 2;
  return (8 * b * s * h * A + 2 * mlp_matrices * b * s * h * d.ffn) / t +
         AttentionCoreFlops(d, b, s, s, t);
}

double DecoderLayerForwardFlops(const ModelDims& d, double b, double s, double encoder_s,
                                uint32_t tp) {
  const double t = tp;
  const double h = d.hidden;
  const double A = static_cast<double>(d.attention_width());
  const double self = EncoderLayerForwardFlops(d, b, s, tp);
  // Cross-attention: Q from the decoder 2bshA, K and V from the encoder
  // output 4 b s_e h A, output projection 2bsAh, core 4 b s s_e A.
  const double cross = (2 * b * s * h * A + 4 * b * encoder_s * h * A + 2 * b * s * A * h) / t +
                       AttentionCoreFlops(d, b, s, encoder_s, t);
  return self + cross;
}

// T5V11 with the fused kernel: the kernel keeps the masked copy of the
// position bias it gets as its float mask, [b, a, s, s] in the compute
// dtype, for its backward (the explicit kernel adds the bias to the scores,
// which keeps nothing).
double T5V11FusedBiasStored(const ModelDims& d, double b, double s, double t) {
  if (!d.t5v11() || d.attention_kernel != AttentionKernel::kFused) return 0;
  return d.dtype_bytes * d.heads * s * s * b / t;
}

double EncoderLayerStoredBytes(const ModelDims& d, Recompute recompute, double b, double s,
                               uint32_t tp, bool sequence_parallel) {
  const double r = SequenceDivisor(tp, sequence_parallel);
  if (recompute == Recompute::kFull) return d.dtype_bytes * s * b * d.hidden / r;  // layer input
  // T5V11's encoder layer keeps what a multi-head LLAMA layer keeps (K = A).
  if (!d.megatron()) {
    return LlamaAttentionStored(d, recompute, b, s, tp, r) + LlamaMlpStored(d, b, s, tp, r) +
           T5V11FusedBiasStored(d, b, s, tp);
  }
  return AttentionStored(d, recompute, b, s, s, false, tp, r) + MlpStored(d, b, s, tp, r);
}

double DecoderLayerStoredBytes(const ModelDims& d, Recompute recompute, double b, double s,
                               double encoder_s, uint32_t tp, bool sequence_parallel) {
  const double r = SequenceDivisor(tp, sequence_parallel);
  if (recompute == Recompute::kFull) {
    // The decoder input (the rank's part of it), the whole encoder output.
    return d.dtype_bytes * b * (s / r + encoder_s) * d.hidden;
  }
  if (d.t5v11()) {
    return LlamaAttentionStored(d, recompute, b, s, tp, r) +
           T5V11CrossAttentionStored(d, recompute, b, s, encoder_s, tp, r) +
           LlamaMlpStored(d, b, s, tp, r) + T5V11FusedBiasStored(d, b, s, tp);
  }
  return AttentionStored(d, recompute, b, s, s, false, tp, r) +
         AttentionStored(d, recompute, b, s, encoder_s, true, tp, r) + MlpStored(d, b, s, tp, r);
}

double TensorAllReduceMs(const TensorLink& link, uint32_t t, double bytes) {
  if (t <= 1 || link.gbps <= 0) return 0;
  const double steps = 2.0 * (t - 1);
  return steps / t * bytes / (link.gbps * 1e9) * 1e3 + steps * kTensorStepLatencyUs * 1e-3;
}

double ComponentParameters(const ModelDims& d, Component component, uint32_t tp,
                           uint32_t positions) {
  const double t = tp;
  const double h = d.hidden;
  const double A = static_cast<double>(d.attention_width());
  const double f = d.ffn;
  if (d.llama()) {
    const double K = static_cast<double>(d.kv_width());
    switch (component) {
      case Component::kEncoderLayer:
        // q [A, h], k and v [K, h], o [h, A]; gate and up [f, h], down
        // [h, f]; no biases; two RMSNorm weights (replicated) 2h.
        return (h * A + 2 * h * K + A * h + 3 * h * f) / t + 2 * h;
      case Component::kDecoderLayer:
        return 0;  // LLAMA is decoder-only: no T5 decoder layers
      case Component::kEmbedding:
        // Token embedding only: rotary positions have no parameters.
        return VocabRows(d, t) * h;
      case Component::kPostprocess:
        // The final RMSNorm and the untied head [V, h] on the last stage.
        // A tied head is word_embedding itself: on one stage the one tensor
        // (and its gradient and optimizer state) is counted with the
        // embedding, not twice; across stages the last stage's replica is
        // added by the memory model (StageLayout::tied_embedding_replica),
        // so model totals still count the embedding once.
        return (d.tied_embeddings ? 0.0 : VocabRows(d, t) * h) + h;
      case Component::kAttentionCore:
        return 0;  // part of a layer
    }
    return 0;
  }
  if (d.t5v11()) {
    // Self-attention q, k, v [A, h], o [h, A]; gate and up [f, h], down
    // [h, f]; no biases.
    const double self_and_mlp = (4 * h * A + 3 * h * f) / t;
    switch (component) {
      case Component::kEncoderLayer:
        return self_and_mlp + 2 * h;  // two RMSNorm weights
      case Component::kDecoderLayer:
        // Cross-attention xq, xk, xv [A, h], xo [h, A]; three RMSNorms.
        return self_and_mlp + 4 * h * A / t + 3 * h;
      case Component::kEmbedding:
        // word_embedding, no position table. One tensor for both stacks:
        // the first decoder stage's replica (another stage at pipeline > 1)
        // is the memory model's (StageLayout::shared_word_embedding).
        return VocabRows(d, t) * h;
      case Component::kPostprocess:
        // The untied head [V, h] and the final RMSNorm. The relative bias
        // tables and the encoder's final RMSNorm belong to stages, not to
        // a component (StageLayout).
        return VocabRows(d, t) * h + h;
      case Component::kAttentionCore:
        return 0;
    }
    return 0;
  }
  // Attention: QKV (3hA + 3A bias), output projection (Ah + h); MLP
  // (hf + f, fh + h); two LayerNorms (4h).
  const double attention = (4 * h * A + 3 * A) / t + h;
  const double layer = attention + (2 * h * f + f) / t + h + 4 * h;
  switch (component) {
    case Component::kEncoderLayer:
      return layer;
    case Component::kDecoderLayer:
      return layer + attention + 2 * h;  // cross-attention and its LayerNorm
    case Component::kEmbedding:
      // Token embedding (vocabulary split over tensor-parallel ranks) and
      // learned position embedding (replicated).
      return VocabRows(d, t) * h + static_cast<double>(positions) * h;
    case Component::kPostprocess:
      // The LM head (a copy of the tied embedding on the last stage) and the
      // final LayerNorm.
      return VocabRows(d, t) * h + 2 * h;
    case Component::kAttentionCore:
      return 0;
  }
  return 0;
}

double LinearParameters(const ModelDims& d, Component component, uint32_t tp) {
  const double h = d.hidden;
  // Norm weights (and LayerNorm biases) per layer: LLAMA two RMSNorms, T5V11
  // two (encoder) or three (decoder) RMSNorms, MEGATRON two (three) LayerNorms.
  const double encoder_norms = d.llama() || d.t5v11() ? 2 * h : 4 * h;
  const double decoder_norms = d.t5v11() ? 3 * h : 6 * h;
  switch (component) {
    case Component::kEncoderLayer:
      return ComponentParameters(d, component, tp, 0) - encoder_norms;
    case Component::kDecoderLayer:
      return d.encoder_decoder() ? ComponentParameters(d, component, tp, 0) - decoder_norms : 0;
    case Component::kPostprocess:
      return VocabRows(d, tp) * h;
    case Component::kEmbedding:
    case Component::kAttentionCore:
      return 0;
  }
  return 0;
}

CostValues AnalyticComponentCost(const ModelDims& dims, const Hardware& hw, Component component,
                                 Recompute recompute, uint32_t tensor_parallel, double b, double s,
                                 double encoder_s, const TensorLink& link) {
  const double t = tensor_parallel;
  switch (component) {
    case Component::kEncoderLayer:
      return LayerCost(dims, hw, recompute, t, b, s, 0, false, link);
    case Component::kDecoderLayer:
      return LayerCost(dims, hw, recompute, t, b, s, encoder_s, true, link);
    case Component::kEmbedding:
      return EmbeddingCost(dims, hw, t, b, s, link);
    case Component::kPostprocess:
      return PostprocessCost(dims, hw, t, b, s, b * s, link);
    case Component::kAttentionCore:
      (void)recompute;  // tabulated without recomputation (cost_model.h)
      return AttentionCoreCost(dims, hw, t, b, s);
  }
  return {};
}

CostValues AnalyticHeadCost(const ModelDims& dims, const Hardware& hw, uint32_t tensor_parallel,
                            double b, double s, double labelled, const TensorLink& link) {
  return PostprocessCost(dims, hw, tensor_parallel, b, s, labelled, link);
}

double HeadLossChunkTokens(const ModelDims& d, uint32_t tensor_parallel) {
  return static_cast<double>(LossChunkTokens(
      d.loss_chunk_tokens, static_cast<int64_t>(VocabRows(d, std::max<uint32_t>(1, tensor_parallel)))));
}

double HeadChunkTransientBytes(const ModelDims& d, uint32_t tensor_parallel, double tokens) {
  // fp32 logits, and below fp32 the GEMM's output and the gradient cast
  // back.
  const double per_logit = 4.0 + (d.dtype_bytes < 4 ? 2.0 * d.dtype_bytes : 0.0);
  return tokens * VocabRows(d, std::max<uint32_t>(1, tensor_parallel)) * per_logit;
}

double HeadLabelledTokenBytes(const ModelDims& d) {
  return 2.0 * d.dtype_bytes * d.hidden + kHeadTokenBytes;
}

absl::StatusOr<CostModel> BuildAnalyticCostModel(const ModelDims& dims, const Hardware& hw,
                                                 const AnalyticGridOptions& options) {
  if (dims.hidden == 0 || dims.heads == 0 || dims.kv_channels == 0 || dims.ffn == 0 ||
      dims.vocab == 0 || dims.encoder_layers == 0) {
    return absl::InvalidArgumentError("analytic cost model: model dimensions must be positive");
  }
  if (dims.heads % dims.key_value_heads() != 0) {
    return absl::InvalidArgumentError(
        "analytic cost model: key/value heads must divide the attention heads");
  }
  if (dims.llama() && dims.encoder_decoder()) {
    return absl::InvalidArgumentError("analytic cost model: LLAMA models are decoder-only");
  }
  if (dims.t5v11() && !dims.encoder_decoder()) {
    return absl::InvalidArgumentError(
        "analytic cost model: T5V11 models are encoder-decoder (kind T5)");
  }
  if (dims.t5v11() && dims.relative_attention_buckets == 0) {
    return absl::InvalidArgumentError(
        "analytic cost model: T5V11 needs relative position bias buckets");
  }
  if (options.tensor_parallel_degrees.empty()) {
    return absl::InvalidArgumentError("analytic cost model: no tensor-parallel degree requested");
  }
  const std::vector<uint32_t> b_axis = PowersOfTwo(1, options.max_micro_batch_size);
  const std::vector<uint32_t> s_axis = PowersOfTwo(8, options.max_seq_len);
  if (b_axis.size() > ProfileGrid::kMaxAxisPoints || s_axis.size() > ProfileGrid::kMaxAxisPoints) {
    return absl::InvalidArgumentError("analytic cost model: grid too large");
  }
  CostModel model;
  model.set_description(absl::StrCat(
      "analytic model on ", hw.name, ", ", AttentionKernelName(dims.attention_kernel), " attention",
      dims.megatron() ? "" : ", ", dims.megatron() ? "" : ArchitectureName(dims.architecture),
      dims.megatron() ? "" : " layers"));
  std::vector<Component> components = {Component::kEncoderLayer, Component::kEmbedding,
                                       Component::kPostprocess};
  if (dims.encoder_decoder()) components.push_back(Component::kDecoderLayer);
  for (uint32_t tp : options.tensor_parallel_degrees) {
    if (tp == 0) return absl::InvalidArgumentError("analytic cost model: tensor parallel 0");
    for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      std::vector<Component> mode_components = components;
      if (mode == Recompute::kNone) mode_components.push_back(Component::kAttentionCore);
      for (Component c : mode_components) {
        const bool decoder = c == Component::kDecoderLayer;
        std::vector<CostValues> values;
        for (uint32_t b : b_axis) {
          for (uint32_t e : decoder ? s_axis : std::vector<uint32_t>{0}) {
            for (uint32_t s : s_axis) {
              values.push_back(
                  AnalyticComponentCost(dims, hw, c, mode, tp, b, s, e, options.tensor_link));
            }
          }
        }
        absl::StatusOr<ProfileGrid> grid = ProfileGrid::Create(
            b_axis, s_axis, decoder ? s_axis : std::vector<uint32_t>{}, std::move(values),
            absl::StrCat("analytic ", ComponentName(c), " (", RecomputeName(mode), ")"));
        if (!grid.ok()) return grid.status();
        if (auto status = model.SetGrid(c, mode, tp, *std::move(grid)); !status.ok()) {
          return status;
        }
      }
    }
  }
  // The position embedding has one row per position up to the job's longest
  // sequence (options.max_seq_len, before rounding to the grid); LLAMA has
  // none (ComponentParameters ignores the count).
  for (uint32_t tp : options.tensor_parallel_degrees) {
    for (Component c : components) {
      model.SetParameters(c, ComponentParameters(dims, c, tp, options.max_seq_len), tp);
      model.SetParameters(c, ComponentParameters(dims, c, 1, options.max_seq_len), 1);
    }
  }
  model.set_profiled_dims(dims);
  return model;
}

}  // namespace varipipe::planner
