#include "executor/model/attention_mask.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <limits>
#include <vector>

namespace varipipe::executor {

torch::Tensor SelfAttentionMask(const torch::Tensor& lengths, int64_t padded, bool causal) {
  const auto options = torch::TensorOptions().dtype(torch::kInt64).device(lengths.device());
  const torch::Tensor positions = torch::arange(padded, options);
  // keys[b, k]: key k is real.
  const torch::Tensor keys = positions.unsqueeze(0) < lengths.unsqueeze(1);
  torch::Tensor mask = keys.unsqueeze(1).unsqueeze(1).expand({lengths.size(0), 1, padded, padded});
  if (causal) {
    const torch::Tensor lower = positions.unsqueeze(1) >= positions.unsqueeze(0);  // [q, k]
    mask = mask.logical_and(lower.unsqueeze(0).unsqueeze(0));
  }
  return mask;
}

torch::Tensor CrossAttentionMask(const torch::Tensor& key_lengths, int64_t queries,
                                 int64_t padded_keys) {
  const auto options = torch::TensorOptions().dtype(torch::kInt64).device(key_lengths.device());
  const torch::Tensor keys =
      torch::arange(padded_keys, options).unsqueeze(0) < key_lengths.unsqueeze(1);
  return keys.unsqueeze(1).unsqueeze(1).expand({key_lengths.size(0), 1, queries, padded_keys});
}

torch::Tensor SegmentSelfAttentionMask(const torch::Tensor& segments, bool causal) {
  const torch::Tensor queries = segments.unsqueeze(2);  // [b, q, 1]
  const torch::Tensor keys = segments.unsqueeze(1);     // [b, 1, k]
  torch::Tensor mask = queries == keys;
  if (causal) {
    const int64_t s = segments.size(1);
    const auto options = torch::TensorOptions().dtype(torch::kInt64).device(segments.device());
    const torch::Tensor positions = torch::arange(s, options);
    mask = mask.logical_and((positions.unsqueeze(1) >= positions.unsqueeze(0)).unsqueeze(0));
  }
  return mask.logical_or(queries < 0).unsqueeze(1);
}

torch::Tensor SegmentCrossAttentionMask(const torch::Tensor& query_segments,
                                        const torch::Tensor& key_segments) {
  const torch::Tensor queries = query_segments.unsqueeze(2);  // [b, t, 1]
  const torch::Tensor mask = (queries == key_segments.unsqueeze(1)).logical_or(queries < 0);
  return mask.unsqueeze(1);
}

namespace {

// Split sizes for positions [0, size) of one row: one run per entry of
// `runs` (begin, length), which follow each other from 0 in that order, and
// the rest.
std::vector<int64_t> SplitSizes(const std::vector<std::pair<int64_t, int64_t>>& runs,
                                int64_t size) {
  std::vector<int64_t> sizes;
  int64_t covered = 0;
  for (const auto& [begin, length] : runs) {
    TORCH_CHECK(begin == covered, "packed row: a sample does not follow the previous one");
    sizes.push_back(length);
    covered += length;
  }
  if (covered < size) sizes.push_back(size - covered);
  return sizes;
}

}  // namespace

torch::Tensor PerSampleAttention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const VariableLengthLayout& layout,
                                 const torch::Tensor& bias, const AttentionCore& core) {
  const int64_t b = q.size(0);
  const int64_t sq = q.size(1);
  const int64_t sk = k.size(1);
  TORCH_CHECK(b == layout.rows() && sq == layout.query_length() && sk == layout.key_length(),
              "per-sample attention: q ", q.sizes(), ", k ", k.sizes(), " for a layout of ",
              layout.rows(), " rows of ", layout.query_length(), " and ", layout.key_length(),
              " positions");
  // Each tensor is split once per row and once per sample along the
  // sequence (views whose backward concatenates), so the backward does work
  // in the size of the tensors, not once per sample.
  const std::vector<torch::Tensor> q_rows = q.unbind(0);
  const std::vector<torch::Tensor> k_rows = k.unbind(0);
  const std::vector<torch::Tensor> v_rows = v.unbind(0);
  std::vector<torch::Tensor> bias_rows;
  if (bias.defined()) bias_rows = bias.unbind(0);
  const std::vector<VariableLengthLayout::Sample>& samples = layout.samples();
  // A sample that sees all its keys gets this one element expanded to its
  // [1, 1, lq, lk]: a core that keeps its mask for backward (selective
  // recomputation) keeps one byte, not lq * lk.
  const torch::Tensor all_keys =
      torch::ones({1, 1, 1, 1}, torch::TensorOptions().dtype(torch::kBool).device(q.device()));
  std::vector<torch::Tensor> rows;
  size_t first = 0;  // the row's first sample
  for (int64_t row = 0; row < b; ++row) {
    size_t end = first;
    while (end < samples.size() && samples[end].row == row) ++end;
    // Queries in sample order; keys in position order (a row's two sides
    // may order its samples differently).
    std::vector<std::pair<int64_t, int64_t>> query_runs, key_runs;
    for (size_t i = first; i < end; ++i) {
      query_runs.emplace_back(samples[i].query_begin, samples[i].query_length);
      key_runs.emplace_back(samples[i].key_begin, samples[i].key_length);
    }
    std::sort(key_runs.begin(), key_runs.end());
    const std::vector<int64_t> query_sizes = SplitSizes(query_runs, sq);
    const std::vector<int64_t> key_sizes = SplitSizes(key_runs, sk);
    const std::vector<torch::Tensor> q_pieces = q_rows[row].split_with_sizes(query_sizes, 0);
    const std::vector<torch::Tensor> k_pieces = k_rows[row].split_with_sizes(key_sizes, 0);
    const std::vector<torch::Tensor> v_pieces = v_rows[row].split_with_sizes(key_sizes, 0);
    // T5V11's bias [B, heads, sq, sk]: this row's (B == 1: the shared one),
    // split by query then by key runs.
    std::vector<torch::Tensor> bias_pieces;
    if (bias.defined()) {
      bias_pieces = bias_rows[bias_rows.size() == 1 ? 0 : row].split_with_sizes(query_sizes, 1);
    }
    std::vector<torch::Tensor> pieces;
    for (size_t i = first; i < end; ++i) {
      const VariableLengthLayout::Sample& sample = samples[i];
      const size_t j = static_cast<size_t>(
          std::find(key_runs.begin(), key_runs.end(),
                    std::make_pair(sample.key_begin, sample.key_length)) -
          key_runs.begin());
      // Causal, or all of the sample's keys.
      AttentionInput input =
          layout.causal() ? AttentionInput::Causal()
                          : AttentionInput::DenseMask(
                                all_keys.expand({1, 1, sample.query_length, sample.key_length}));
      if (bias.defined()) {
        input = input.WithBias(
            bias_pieces[i - first].split_with_sizes(key_sizes, 2)[j].unsqueeze(0));
      }
      pieces.push_back(core(q_pieces[i - first].unsqueeze(0), k_pieces[j].unsqueeze(0),
                            v_pieces[j].unsqueeze(0), input));
    }
    if (query_sizes.size() > end - first) {  // padding after the samples
      const torch::TensorOptions options = pieces.empty() ? q.options() : pieces.back().options();
      pieces.push_back(torch::zeros({1, query_sizes.back(), q.size(2)}, options));
    }
    rows.push_back(torch::cat(pieces, 1));
    first = end;
  }
  return torch::cat(rows, 0);
}

AttentionInput SelfAttentionMaskFor(v1::AttentionKernel kernel, const torch::Tensor& lengths,
                                    int64_t padded, bool causal) {
  if (kernel == v1::FUSED && causal) return AttentionInput::Causal();
  return AttentionInput::DenseMask(SelfAttentionMask(lengths, padded, causal));
}

namespace {

// [b, s, heads*d] -> [b, heads, s, d] (a view).
torch::Tensor Heads(const torch::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

// [b, heads, s, d] -> [b, s, heads*d].
torch::Tensor Merge(const torch::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// The causal mask [1, 1, s, s] an undefined mask stands for.
torch::Tensor CausalMask(int64_t s, torch::Device device) {
  const torch::Tensor positions =
      torch::arange(s, torch::TensorOptions().dtype(torch::kInt64).device(device));
  return (positions.unsqueeze(1) >= positions.unsqueeze(0)).unsqueeze(0).unsqueeze(0);
}

}  // namespace

torch::Tensor MaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, int64_t heads,
                              const torch::Tensor& bias, bool scaled) {
  const int64_t sq = q.size(1);
  const int64_t d = q.size(2) / heads;
  const torch::Tensor qh = Heads(q, heads);
  const torch::Tensor kh = Heads(k, heads);
  const torch::Tensor vh = Heads(v, heads);
  torch::Tensor scores = torch::matmul(qh, kh.transpose(-2, -1));
  if (scaled) scores = scores / std::sqrt(static_cast<double>(d));
  if (bias.defined()) scores = scores + bias;
  const torch::Tensor allowed = mask.defined() ? mask : CausalMask(sq, q.device());
  // Every query row keeps at least one key (lengths >= 1), so no row is all
  // -inf and softmax stays finite.
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  // Softmax in fp32 whatever the compute dtype (as CUDA autocast runs it);
  // the probabilities meet v in v's dtype.
  const torch::Tensor probs = scores.scalar_type() == torch::kFloat32
                                  ? torch::softmax(scores, -1)
                                  : torch::softmax(scores, -1, torch::kFloat32);
  return Merge(torch::matmul(probs.to(vh.scalar_type()), vh));
}

bool FusedAttentionAvailable() { return TORCH_VERSION_MAJOR >= 2; }

torch::Tensor FusedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, int64_t heads, const torch::Tensor& bias,
                             bool scaled) {
#if TORCH_VERSION_MAJOR >= 2
  torch::Tensor qh = Heads(q, heads);
  const torch::Tensor kh = Heads(k, heads);
  const torch::Tensor vh = Heads(v, heads);
  // Unscaled scores (T5V11): the kernel divides by sqrt(d), so q is
  // multiplied by it first.
  if (!scaled) qh = qh * std::sqrt(static_cast<double>(qh.size(-1)));
  if (bias.defined()) {
    // The bias with -inf where attention is not allowed, in the kernel's dtype.
    const torch::Tensor allowed = mask.defined() ? mask : CausalMask(q.size(1), q.device());
    const torch::Tensor float_mask =
        bias.to(qh.scalar_type())
            .masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    return Merge(at::scaled_dot_product_attention(qh, kh, vh, float_mask));
  }
  // Default scale 1 / sqrt(d); a boolean mask is true where attention is
  // allowed, as ours.
  const torch::Tensor out =
      mask.defined() ? at::scaled_dot_product_attention(qh, kh, vh, mask)
                     : at::scaled_dot_product_attention(qh, kh, vh, /*attn_mask=*/{},
                                                        /*dropout_p=*/0.0, /*is_causal=*/true);
  return Merge(out);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)heads, (void)bias, (void)scaled;
  TORCH_CHECK(false, "model.attention_kernel FUSED needs LibTorch 2.0 or newer (built with ",
              TORCH_VERSION, ")");
  return {};
#endif
}

}  // namespace varipipe::executor
