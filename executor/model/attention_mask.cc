#include "executor/model/attention_mask.h"

#include <torch/version.h>

#include <cmath>
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

torch::Tensor SegmentMask(const torch::Tensor& query_segments, const torch::Tensor& key_segments,
                          bool causal) {
  const int64_t b = query_segments.size(0);
  const int64_t sq = query_segments.size(1);
  const int64_t sk = key_segments.size(1);
  const int64_t n = std::max(sq, sk);
  // On the CPU, where PerSampleAttention reads it: one copy per stage
  // forward rather than one per layer.
  torch::Tensor mask = torch::full({b, 3, n}, -1, torch::TensorOptions().dtype(torch::kInt64));
  mask.select(1, 0).narrow(1, 0, sq).copy_(query_segments.to(torch::kCPU));
  mask.select(1, 1).narrow(1, 0, sk).copy_(key_segments.to(torch::kCPU));
  mask.select(1, 2).fill_(causal ? 1 : 0);
  return mask;
}

bool IsSegmentMask(const torch::Tensor& mask) {
  return mask.defined() && mask.scalar_type() == torch::kInt64 && mask.dim() == 3 &&
         mask.size(1) == 3;
}

namespace {

// One sample's contiguous run of positions in a row.
struct Run {
  int64_t segment = -1;
  int64_t begin = 0;
  int64_t length = 0;
};

// The runs of one row's segment ids (-1 ends the real positions), checked
// to be contiguous.
std::vector<Run> RunsOf(const int64_t* ids, int64_t n) {
  std::vector<Run> runs;
  for (int64_t i = 0; i < n && ids[i] >= 0; ++i) {
    if (runs.empty() || runs.back().segment != ids[i]) {
      for (const Run& r : runs) {
        TORCH_CHECK(r.segment != ids[i], "packed row: sample ", ids[i],
                    " is not one contiguous run of positions");
      }
      runs.push_back({ids[i], i, 0});
    }
    ++runs.back().length;
  }
  return runs;
}

}  // namespace

namespace {

// The lengths that split `size` positions into `runs` (which start at 0 and
// follow each other) and the rest.
std::vector<int64_t> SplitSizes(const std::vector<Run>& runs, int64_t size) {
  std::vector<int64_t> sizes;
  int64_t covered = 0;
  for (const Run& r : runs) {
    sizes.push_back(r.length);
    covered += r.length;
  }
  if (covered < size) sizes.push_back(size - covered);
  return sizes;
}

}  // namespace

torch::Tensor PerSampleAttention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const torch::Tensor& segments,
                                 const torch::Tensor& bias, const AttentionCore& core) {
  const int64_t b = q.size(0);
  const int64_t sq = q.size(1);
  const int64_t sk = k.size(1);
  // SegmentMask keeps the segments on the CPU: no device copy per layer.
  const torch::Tensor ids = segments.to(torch::kCPU).contiguous();
  const int64_t n = ids.size(2);
  const bool causal = ids.index({0, 2, 0}).item<int64_t>() == 1;
  // Each tensor is split once per row and once per sample along the
  // sequence (views whose backward concatenates), so the backward does work
  // in the size of the tensors, not once per sample.
  const std::vector<torch::Tensor> q_rows = q.unbind(0);
  const std::vector<torch::Tensor> k_rows = k.unbind(0);
  const std::vector<torch::Tensor> v_rows = v.unbind(0);
  std::vector<torch::Tensor> bias_rows;
  if (bias.defined()) bias_rows = bias.unbind(0);
  std::vector<torch::Tensor> rows;
  for (int64_t row = 0; row < b; ++row) {
    const int64_t* row_ids = ids.data_ptr<int64_t>() + row * 3 * n;
    const std::vector<Run> queries = RunsOf(row_ids, std::min(n, sq));
    const std::vector<Run> keys = RunsOf(row_ids + n, std::min(n, sk));
    int64_t covered = 0;
    for (const Run& query : queries) {
      TORCH_CHECK(query.begin == covered, "packed row ", row, ": sample ", query.segment,
                  " does not follow the previous one");
      covered += query.length;
    }
    covered = 0;
    for (const Run& key : keys) {
      TORCH_CHECK(key.begin == covered, "packed row ", row, ": sample ", key.segment,
                  " does not follow the previous one");
      covered += key.length;
    }
    const std::vector<int64_t> query_sizes = SplitSizes(queries, sq);
    const std::vector<int64_t> key_sizes = SplitSizes(keys, sk);
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
    for (size_t i = 0; i < queries.size(); ++i) {
      const Run& query = queries[i];
      size_t j = 0;
      while (j < keys.size() && keys[j].segment != query.segment) ++j;
      TORCH_CHECK(j < keys.size(), "packed row ", row, ": sample ", query.segment,
                  " has queries but no keys");
      const Run& key = keys[j];
      TORCH_CHECK(!causal || key.length == query.length, "packed row ", row, ": sample ",
                  query.segment, " attends causally to keys of another length");
      // Causal: an undefined mask (the cores' convention); otherwise all
      // of the sample's keys.
      const torch::Tensor mask =
          causal ? torch::Tensor()
                 : torch::ones({1, 1, query.length, key.length},
                               torch::TensorOptions().dtype(torch::kBool).device(q.device()));
      torch::Tensor sample_bias;
      if (bias.defined()) {
        sample_bias = bias_pieces[i].split_with_sizes(key_sizes, 2)[j].unsqueeze(0);
      }
      pieces.push_back(core(q_pieces[i].unsqueeze(0), k_pieces[j].unsqueeze(0),
                            v_pieces[j].unsqueeze(0), mask, sample_bias));
    }
    if (query_sizes.size() > queries.size()) {  // padding after the samples
      const torch::TensorOptions options = pieces.empty() ? q.options() : pieces.back().options();
      pieces.push_back(torch::zeros({1, query_sizes.back(), q.size(2)}, options));
    }
    rows.push_back(torch::cat(pieces, 1));
  }
  return torch::cat(rows, 0);
}

torch::Tensor SelfAttentionMaskFor(v1::AttentionKernel kernel, const torch::Tensor& lengths,
                                   int64_t padded, bool causal) {
  if (kernel == v1::FUSED && causal) return {};
  return SelfAttentionMask(lengths, padded, causal);
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
  const torch::Tensor probs = torch::softmax(scores, -1);
  return Merge(torch::matmul(probs, vh));
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
