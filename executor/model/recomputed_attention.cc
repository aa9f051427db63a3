#include "executor/model/recomputed_attention.h"

#include "executor/model/attention_mask.h"
#include "executor/model/recompute_precision.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

class RecomputedAttention : public torch::autograd::Function<RecomputedAttention> {
 public:
  // Runs without autograd (as every custom Function's forward): nothing of
  // the core is kept. `mask` comes by pointer: it may be undefined (causal),
  // which a Function does not take as a tensor input.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor* mask, int64_t heads) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["has_mask"] = mask->defined();
    if (mask->defined()) ctx->saved_data["mask"] = *mask;
    ctx->saved_data["heads"] = heads;
    // The recomputation must see the forward's precision (CUDA autocast).
    SaveForwardPrecision(ctx);
    return MaskedAttention(q, k, v, *mask, heads);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const torch::Tensor mask =
        ctx->saved_data["has_mask"].toBool() ? ctx->saved_data["mask"].toTensor() : torch::Tensor();
    torch::Tensor q = saved[0].detach().requires_grad_(true);
    torch::Tensor k = saved[1].detach().requires_grad_(true);
    torch::Tensor v = saved[2].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable_grad(true);
      const RecomputePrecisionScope precision(ctx);
      out = MaskedAttention(q, k, v, mask, heads);
    }
    const tensor_list grads = torch::autograd::grad({out}, {q, k, v}, {grad_outputs[0]});
    // One gradient per input of forward: none for the mask and the head count.
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RecomputedMaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const torch::Tensor& mask,
                                        int64_t heads) {
  return RecomputedAttention::apply(q, k, v, &mask, heads);
}

}  // namespace varipipe::executor
