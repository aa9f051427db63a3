#include "executor/model/context_parallel_attention.h"

#include <limits>
#include <vector>

#include "executor/model/recompute_precision.h"
#include "executor/runtime/fault_injection.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// On a GPU from pinned memory without waiting (the host never waits for
// the device to build a split's index).
torch::Tensor ToTensor(const std::vector<int64_t>& values, torch::Device device) {
  torch::Tensor host = torch::tensor(at::ArrayRef<int64_t>(values), torch::kLong);
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

// Forward: pad to `count` rows, all-gather along rows. Backward:
// reduce-scatter along rows, this rank's first `local` rows.
class GatherContext : public torch::autograd::Function<GatherContext> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t count,
                               const TensorGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["local"] = x.size(0);
    // Test-only (fault_injection.h): a lane that dies mid-gather.
    const absl::Status fault = MaybeInjectFault(FaultPoint::kInContextGather);
    TORCH_CHECK(fault.ok(), "context-parallel all-gather: ", fault.ToString());
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

// ReferenceContextParallelAttention that keeps only q, k and v (selective
// recomputation): no [heads, lq, lk] scores or probabilities are stored;
// the backward re-runs the core under the forward's precision and
// differentiates it.
class RecomputedReferenceCore : public torch::autograd::Function<RecomputedReferenceCore> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v,
                               const c10::intrusive_ptr<ContextParallelInput>& input,
                               double scale) {
    ctx->save_for_backward({q, k, v});
    // Kept alive with the node.
    ctx->saved_data["input"] =
        c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(input));
    ctx->saved_data["scale"] = scale;
    SaveForwardPrecision(ctx);
    return ReferenceContextParallelAttention(q, k, v, input->split(), scale);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const auto input = c10::static_intrusive_pointer_cast<ContextParallelInput>(
        ctx->saved_data["input"].toCapsule());
    const ContextParallelSplit* split = &input->split();
    std::vector<torch::Tensor> leaves;
    for (const torch::Tensor& t : saved) leaves.push_back(t.detach().requires_grad_(true));
    torch::Tensor out;
    {
      const RecomputePrecisionScope precision(ctx);
      torch::AutoGradMode enable_grad(true);
      out = ReferenceContextParallelAttention(leaves[0], leaves[1], leaves[2], *split,
                                              ctx->saved_data["scale"].toDouble());
    }
    const tensor_list grads = torch::autograd::grad({out}, leaves, {grad[0]});
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ContextParallelInput::ContextParallelInput(ContextParallelSplit split, torch::Device device)
    : split_(std::move(split)), index_(ContextParallelIndex::Of(split_, device)) {
  std::vector<int64_t> positions = split_.local_positions();
  positions.resize(static_cast<size_t>(split_.all_gather_count()), 0);
  positions_ = ToTensor(positions, device).reshape({1, -1});
  layout_ = VariableLengthLayout::FromOffsets(split_.query_offsets(), split_.key_offsets(),
                                              /*causal=*/true);
}

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
  TORCH_CHECK(k.dim() == 3 && k.size(0) == split.key_offsets().back() && v.sizes() == k.sizes() &&
                  k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "context-parallel attention: k ", k.sizes(), ", v ", v.sizes(), " for ",
              split.key_offsets().back(), " prefix keys and ", q.size(1), " query heads");
  // Grouped-query attention: query head i reads key/value head i / group.
  const int64_t group = q.size(1) / k.size(1);
  const auto heads = [group](const torch::Tensor& x) {
    return group == 1 ? x : x.repeat_interleave(group, 0);
  };
  std::vector<torch::Tensor> outputs;
  const auto& qo = split.query_offsets();
  const auto& ko = split.key_offsets();
  for (size_t c = 0; c + 1 < qo.size(); ++c) {
    const int64_t lq = qo[c + 1] - qo[c];
    const int64_t lk = ko[c + 1] - ko[c];
    // [heads, lq, d] and [heads, lk, d].
    const torch::Tensor qc = q.slice(0, qo[c], qo[c + 1]).transpose(0, 1).to(torch::kFloat32);
    const torch::Tensor kc =
        heads(k.slice(0, ko[c], ko[c + 1]).transpose(0, 1).to(torch::kFloat32));
    const torch::Tensor vc =
        heads(v.slice(0, ko[c], ko[c + 1]).transpose(0, 1).to(torch::kFloat32));
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

torch::Tensor ContextParallelSelfAttention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v,
                                           const c10::intrusive_ptr<ContextParallelInput>& input,
                                           const TensorGroup* group, int64_t heads,
                                           int64_t kv_heads, double scale,
                                           const VariableLengthKernel* kernel, bool recompute) {
  const ContextParallelSplit& split = input->split();
  const int64_t local = split.local_count();
  const int64_t width = q.size(2);
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && width % heads == 0,
              "context-parallel attention: ", heads, " query heads over ", kv_heads,
              " key/value heads");
  const int64_t d = width / heads;
  TORCH_CHECK(q.dim() == 3 && q.size(0) == 1 && q.size(1) == split.all_gather_count() &&
                  k.dim() == 3 && k.size(0) == 1 && k.size(1) == q.size(1) &&
                  k.size(2) == kv_heads * d && v.sizes() == k.sizes(),
              "context-parallel attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
              " for one row of ", split.all_gather_count(), " positions, ", heads, " query and ",
              kv_heads, " key/value heads");
  // [local, n, d]: the lane's own tokens (its padding takes no part).
  const auto tokens = [&](const torch::Tensor& x, int64_t n) {
    return x[0].narrow(0, 0, local).reshape({local, n, d});
  };
  // The key prefixes [keys, kv_heads, d]: what the group gathered.
  const ContextParallelIndex& index = input->index();
  const torch::Tensor keys =
      GatherKeyPrefixes(AllGatherContext(tokens(k, kv_heads), split, group), index);
  const torch::Tensor values =
      GatherKeyPrefixes(AllGatherContext(tokens(v, kv_heads), split, group), index);
  const auto tokens_q = [&](const torch::Tensor& x) { return tokens(x, heads); };
  torch::Tensor out;
  if (kernel != nullptr) {
    // One row: the local queries, and the key prefixes back to back, each
    // key/value head repeated for its query heads (the kernel takes as
    // many as queries).
    const auto repeat = [&](const torch::Tensor& x) {
      if (kv_heads == heads) return x.reshape({1, x.size(0), width});
      return x.unsqueeze(2)
          .expand({x.size(0), kv_heads, heads / kv_heads, d})
          .reshape({1, x.size(0), width});
    };
    out = VariableLengthAttention(tokens_q(q).reshape({1, local, width}), repeat(keys),
                                  repeat(values), input->layout(), heads, scale, *kernel)
              .reshape({local, width});
  } else if (recompute) {
    out = RecomputedReferenceCore::apply(tokens_q(q), keys, values, input, scale)
              .reshape({local, width});
  } else {
    out = ReferenceContextParallelAttention(tokens_q(q), keys, values, split, scale)
              .reshape({local, width});
  }
  // Zero rows at the padding.
  return torch::constant_pad_nd(out, {0, 0, 0, q.size(1) - local}).unsqueeze(0);
}

}  // namespace varipipe::executor
