#include "executor/model/deferred_linear.h"


#include "executor/model/cuda_autocast.h"
#include "executor/model/weight_cast_cache.h"
#include "executor/model/weight_grad_store.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// LibTorch's Functions take no undefined tensor as an input, so the layer
// without a bias (the LM head) is the overload without one.
class LinearWithDeferredWeight : public torch::autograd::Function<LinearWithDeferredWeight> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, WeightGradStore* store) {
    return Forward(ctx, x, weight, torch::Tensor(), store);
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               WeightGradStore* store) {
    return Forward(ctx, x, weight, bias, store);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    tensor_list grads(has_bias ? 4 : 3);
    const torch::Tensor& grad = grad_outputs[0];
    if (!grad.defined()) return grads;
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];     // in the compute dtype
    const torch::Tensor& weight = saved[1];    // the parameter
    const torch::Tensor& operand = saved[2];   // the weight in the compute dtype
    const torch::Tensor g = grad.to(input.scalar_type());
    if (ctx->needs_input_grad(0)) {
      grads[0] = g.matmul(operand).to(
          static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    if (ctx->needs_input_grad(1)) {
      reinterpret_cast<WeightGradStore*>(ctx->saved_data["store"].toInt())->Add(weight, input, g);
    }
    if (has_bias && ctx->needs_input_grad(2)) {
      grads[2] = g.reshape({-1, g.size(-1)})
                     .sum(0)
                     .to(static_cast<torch::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    }
    return grads;
  }

 private:
  // Runs without autograd (as every Function's forward).
  static torch::Tensor Forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               WeightGradStore* store) {
    const torch::ScalarType dtype = ComputeDtype(x);
    const torch::Tensor input = x.to(dtype);
    // The iteration's one copy of the weight in the compute dtype (the
    // parameter itself when it has that dtype).
    const torch::Tensor operand = ParameterIn(weight, dtype);
    ctx->save_for_backward({input, weight, operand});
    ctx->saved_data["store"] = reinterpret_cast<int64_t>(store);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["has_bias"] = bias.defined();
    if (bias.defined()) ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return torch::linear(input, operand, bias.defined() ? ParameterIn(bias, dtype) : bias);
  }
};

}  // namespace

torch::Tensor DeferredLinear(const torch::Tensor& x, const torch::Tensor& weight,
                             const torch::Tensor& bias) {
  WeightGradStore* store = CurrentWeightGradStore();
  if (store != nullptr && torch::GradMode::is_enabled()) {
    if (bias.defined()) return LinearWithDeferredWeight::apply(x, weight, bias, store);
    return LinearWithDeferredWeight::apply(x, weight, store);
  }
  const torch::ScalarType dtype = ComputeDtype(x);
  if (dtype == weight.scalar_type()) return torch::linear(x, weight, bias);
  // Mixed precision: x and the cached copies in the compute dtype; the
  // weight gradient grad_y^T x in it, accumulated into the fp32 grad().
  return torch::linear(x.to(dtype), ParameterIn(weight, dtype),
                       bias.defined() ? ParameterIn(bias, dtype) : bias);
}

}  // namespace varipipe::executor
