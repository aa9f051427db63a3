#include "executor/model/norm.h"

#include <vector>

#include "executor/model/cuda_autocast.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The fp32 normalisations (x, weight and bias fp32).
torch::Tensor LayerNorm32(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, double epsilon) {
  return torch::layer_norm(x, {x.size(-1)}, weight, bias, epsilon);
}
torch::Tensor RmsNorm32(const torch::Tensor& x, const torch::Tensor& weight, double epsilon) {
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + epsilon) * weight;
}

// The gradients of the fp32 normalisation `norm` of saved x (in the compute
// dtype) and `parameters` (fp32), recomputed: x's in x's dtype.
template <typename Norm>
tensor_list RecomputedGradients(const torch::Tensor& x, const std::vector<torch::Tensor>& parameters,
                                const torch::Tensor& grad, const Norm& norm) {
  std::vector<torch::Tensor> leaves{x.detach().to(torch::kFloat32).requires_grad_(true)};
  for (const torch::Tensor& p : parameters) leaves.push_back(p.detach().requires_grad_(true));
  torch::Tensor y;
  {
    torch::AutoGradMode enable_grad(true);
    y = norm(leaves);
  }
  tensor_list grads = torch::autograd::grad({y}, leaves, {grad.to(torch::kFloat32)});
  grads[0] = grads[0].to(x.scalar_type());
  return grads;
}

class LowPrecisionLayerNorm : public torch::autograd::Function<LowPrecisionLayerNorm> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               double epsilon) {
    ctx->save_for_backward({x, weight, bias});
    ctx->saved_data["epsilon"] = epsilon;
    return LayerNorm32(x.to(torch::kFloat32), weight, bias, epsilon).to(x.scalar_type());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const double epsilon = ctx->saved_data["epsilon"].toDouble();
    tensor_list grads = RecomputedGradients(
        saved[0], {saved[1], saved[2]}, grad_outputs[0],
        [&](const std::vector<torch::Tensor>& l) { return LayerNorm32(l[0], l[1], l[2], epsilon); });
    grads.push_back(torch::Tensor());  // epsilon
    return grads;
  }
};

class LowPrecisionRmsNorm : public torch::autograd::Function<LowPrecisionRmsNorm> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double epsilon) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["epsilon"] = epsilon;
    return RmsNorm32(x.to(torch::kFloat32), weight, epsilon).to(x.scalar_type());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const double epsilon = ctx->saved_data["epsilon"].toDouble();
    tensor_list grads = RecomputedGradients(
        saved[0], {saved[1]}, grad_outputs[0],
        [&](const std::vector<torch::Tensor>& l) { return RmsNorm32(l[0], l[1], epsilon); });
    grads.push_back(torch::Tensor());  // epsilon
    return grads;
  }
};

// Whether x normalises in the mixed-precision path: x or the compute dtype
// below fp32.
bool LowPrecision(const torch::Tensor& x, torch::ScalarType dtype) {
  return dtype != torch::kFloat32 || x.scalar_type() != torch::kFloat32;
}

}  // namespace

torch::Tensor LayerNormalization(const torch::Tensor& x, const torch::Tensor& weight,
                                 const torch::Tensor& bias, double epsilon) {
  const torch::ScalarType dtype = ComputeDtype(x);
  if (!LowPrecision(x, dtype)) return LayerNorm32(x, weight, bias, epsilon);
  TORCH_CHECK(bias.defined(), "LayerNormalization: mixed precision needs the norm's bias");
  return LowPrecisionLayerNorm::apply(x.to(dtype), weight, bias, epsilon);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double epsilon) {
  const torch::ScalarType dtype = ComputeDtype(x);
  if (!LowPrecision(x, dtype)) {
    // The graph of the fp32 models, unchanged.
    const torch::Tensor x32 = x.to(torch::kFloat32);
    const torch::Tensor normed =
        x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + epsilon);
    return normed.to(x.scalar_type()) * weight;
  }
  return LowPrecisionRmsNorm::apply(x.to(dtype), weight, epsilon);
}

}  // namespace varipipe::executor
