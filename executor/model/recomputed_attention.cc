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
                               const torch::Tensor& v, const torch::Tensor* mask, int64_t heads,
                               bool scaled) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["has_mask"] = mask->defined();
    if (mask->defined()) ctx->saved_data["mask"] = *mask;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scaled"] = scaled;
    // The recomputation must see the forward's precision (CUDA autocast).
    SaveForwardPrecision(ctx);
    return MaskedAttention(q, k, v, *mask, heads, torch::Tensor(), scaled);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const bool scaled = ctx->saved_data["scaled"].toBool();
    const torch::Tensor mask =
        ctx->saved_data["has_mask"].toBool() ? ctx->saved_data["mask"].toTensor() : torch::Tensor();
    torch::Tensor q = saved[0].detach().requires_grad_(true);
    torch::Tensor k = saved[1].detach().requires_grad_(true);
    torch::Tensor v = saved[2].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable_grad(true);
      const RecomputePrecisionScope precision(ctx);
      out = MaskedAttention(q, k, v, mask, heads, torch::Tensor(), scaled);
    }
    const tensor_list grads = torch::autograd::grad({out}, {q, k, v}, {grad_outputs[0]});
    // One gradient per input of forward: none for the mask, the head count
    // and the scaling.
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// T5V11's self-attention: the score bias is an input too (its gradient
// reaches the stack's relative bias table), and the scores are unscaled.
class RecomputedBiasedAttention : public torch::autograd::Function<RecomputedBiasedAttention> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& bias,
                               const torch::Tensor* mask, int64_t heads, bool scaled) {
    ctx->save_for_backward({q, k, v, bias});
    ctx->saved_data["has_mask"] = mask->defined();
    if (mask->defined()) ctx->saved_data["mask"] = *mask;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scaled"] = scaled;
    SaveForwardPrecision(ctx);
    return MaskedAttention(q, k, v, *mask, heads, bias, scaled);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const bool scaled = ctx->saved_data["scaled"].toBool();
    const torch::Tensor mask =
        ctx->saved_data["has_mask"].toBool() ? ctx->saved_data["mask"].toTensor() : torch::Tensor();
    torch::Tensor q = saved[0].detach().requires_grad_(true);
    torch::Tensor k = saved[1].detach().requires_grad_(true);
    torch::Tensor v = saved[2].detach().requires_grad_(true);
    torch::Tensor bias = saved[3].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable_grad(true);
      const RecomputePrecisionScope precision(ctx);
      out = MaskedAttention(q, k, v, mask, heads, bias, scaled);
    }
    const tensor_list grads = torch::autograd::grad({out}, {q, k, v, bias}, {grad_outputs[0]});
    return {grads[0],        grads[1],        grads[2],       grads[3],
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RecomputedMaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const torch::Tensor& mask,
                                        int64_t heads, const torch::Tensor& bias, bool scaled) {
  if (bias.defined()) return RecomputedBiasedAttention::apply(q, k, v, bias, &mask, heads, scaled);
  return RecomputedAttention::apply(q, k, v, &mask, heads, scaled);
}

}  // namespace varipipe::executor
