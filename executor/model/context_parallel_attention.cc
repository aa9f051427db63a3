#include "executor/model/context_parallel_attention.h"

#include <limits>
#include <vector>

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

torch::Tensor ToTensor(const std::vector<int64_t>& values, torch::Device device) {
  return torch::tensor(at::ArrayRef<int64_t>(values), torch::kLong).to(device);
}

// Forward: pad to `count` rows, all-gather along rows. Backward:
// reduce-scatter along rows, this rank's first `local` rows.
class GatherContext : public torch::autograd::Function<GatherContext> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t count,
                               const TensorGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["local"] = x.size(0);
    std::vector<int64_t> padding(2 * x.dim(), 0);
    padding.back() = count - x.size(0);  // rows appended after the last
    return group->AllGather(torch::constant_pad_nd(x, padding), 0);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const auto* group = reinterpret_cast<const TensorGroup*>(ctx->saved_data["group"].toInt());
    const int64_t local = ctx->saved_data["local"].toInt();
    const torch::Tensor mine = group->ReduceScatter(grad[0].contiguous(), 0);
    return {mine.narrow(0, 0, local), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ContextParallelIndex ContextParallelIndex::Of(const ContextParallelSplit& split,
                                              torch::Device device) {
  return {.local_tokens = ToTensor(split.local_tokens(), device),
          .local_positions = ToTensor(split.local_positions(), device),
          .key_index = ToTensor(split.key_index(), device),
          .gathered_index = ToTensor(split.gathered_index(), device)};
}

torch::Tensor AllGatherContext(const torch::Tensor& x, const ContextParallelSplit& split,
                               const TensorGroup* group) {
  TORCH_CHECK(group != nullptr && group->size() == split.group_size() &&
                  group->index() == split.index(),
              "context-parallel all-gather: the group (", group == nullptr ? 0 : group->size(),
              " ranks) is not the split's (", split.group_size(), " ranks, index ", split.index(),
              ")");
  TORCH_CHECK(x.size(0) == split.local_count(), "context-parallel all-gather of ", x.size(0),
              " rows for ", split.local_count(), " local tokens");
  return GatherContext::apply(x, split.all_gather_count(), group);
}

torch::Tensor GatherKeyPrefixes(const torch::Tensor& gathered, const ContextParallelIndex& index) {
  return gathered.index_select(0, index.key_index);
}

torch::Tensor ReferenceContextParallelAttention(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v,
                                                const ContextParallelSplit& split, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.size(0) == split.local_count(), "context-parallel attention: q ",
              q.sizes(), " for ", split.local_count(), " local tokens");
  TORCH_CHECK(k.size(0) == split.key_offsets().back() && v.size(0) == k.size(0),
              "context-parallel attention: k ", k.sizes(), ", v ", v.sizes(), " for ",
              split.key_offsets().back(), " prefix keys");
  std::vector<torch::Tensor> outputs;
  const auto& qo = split.query_offsets();
  const auto& ko = split.key_offsets();
  for (size_t c = 0; c + 1 < qo.size(); ++c) {
    const int64_t lq = qo[c + 1] - qo[c];
    const int64_t lk = ko[c + 1] - ko[c];
    // [heads, lq, d] and [heads, lk, d].
    const torch::Tensor qc = q.slice(0, qo[c], qo[c + 1]).transpose(0, 1).to(torch::kFloat32);
    const torch::Tensor kc = k.slice(0, ko[c], ko[c + 1]).transpose(0, 1).to(torch::kFloat32);
    const torch::Tensor vc = v.slice(0, ko[c], ko[c + 1]).transpose(0, 1).to(torch::kFloat32);
    torch::Tensor scores = torch::matmul(qc, kc.transpose(1, 2)) * scale;
    // Bottom-right causal: query t sees keys up to lk - lq + t.
    const torch::Tensor hidden =
        torch::ones({lq, lk}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
            .triu(lk - lq + 1);
    scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
    outputs.push_back(torch::matmul(torch::softmax(scores, -1), vc).transpose(0, 1));
  }
  if (outputs.empty()) return torch::zeros_like(q);
  return torch::cat(outputs, 0).to(q.scalar_type());
}

}  // namespace varipipe::executor
