#include "executor/model/chunked_loss_head.h"

#include <algorithm>
#include <vector>

#include "executor/model/cuda_autocast.h"
#include "executor/model/weight_cast_cache.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows [start, start + count) of `t`.
torch::Tensor Chunk(const torch::Tensor& t, int64_t start, int64_t count) {
  return t.narrow(0, start, count);
}

class ChunkedHead : public torch::autograd::Function<ChunkedHead> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& labels,
                               int64_t begin, int64_t chunk_tokens, const TensorGroup* group) {
    const torch::ScalarType dtype = ComputeDtype(x);
    const torch::Tensor input = x.to(dtype).contiguous();
    // The iteration's one copy in the compute dtype (weight_cast_cache.h),
    // or the parameter itself.
    const torch::Tensor w = ParameterIn(weight, dtype);
    const int64_t n = input.size(0);
    const int64_t rows = w.size(0);
    const auto fp32 = input.options().dtype(torch::kFloat32);
    // This rank's columns: which labels it holds and their column (0 where
    // it holds none).
    const torch::Tensor held = (labels >= begin) & (labels < begin + rows);
    const torch::Tensor column = torch::where(held, labels - begin, torch::zeros_like(labels));
    torch::Tensor lse = torch::empty({n}, fp32);
    torch::Tensor target = torch::empty({n}, fp32);
    for (int64_t start = 0; start < n; start += chunk_tokens) {
      const int64_t count = std::min(chunk_tokens, n - start);
      torch::Tensor z = torch::matmul(Chunk(input, start, count), w.t()).to(torch::kFloat32);
      Chunk(target, start, count)
          .copy_(z.gather(1, Chunk(column, start, count).unsqueeze(1)).squeeze(1));
      // log sum exp z = m + log sum exp(z - m), in place in z.
      const torch::Tensor m = std::get<0>(z.max(1, /*keepdim=*/true));
      z.sub_(m).exp_();
      Chunk(lse, start, count).copy_(z.sum(1).log_().add_(m.squeeze(1)));
    }
    target.mul_(held.to(torch::kFloat32));
    if (group->size() > 1 && n > 0) {
      // log sum_v exp(z_v) = log sum_ranks exp(lse_rank); the target logit
      // from the rank holding it.
      lse = torch::logsumexp(group->AllGather(lse.unsqueeze(0), 0), 0);
      target = group->AllReduceSum(target);
    }
    const torch::Tensor valid = (labels >= 0).to(torch::kFloat32);
    ctx->save_for_backward({input, weight, column, held, valid, lse, w});
    ctx->saved_data["chunk"] = chunk_tokens;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return ((lse - target) * valid).sum();
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    tensor_list grads(6);
    const torch::Tensor& grad = grad_outputs[0];
    if (!grad.defined()) return grads;
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];   // in the compute dtype
    const torch::Tensor& weight = saved[1];  // the parameter
    const torch::Tensor& column = saved[2];
    const torch::Tensor held = saved[3].to(torch::kFloat32);
    const torch::Tensor scale = saved[4] * grad.to(torch::kFloat32);  // valid * d loss
    const torch::Tensor& lse = saved[5];
    const torch::Tensor& w = saved[6];  // the weight in the compute dtype
    const int64_t chunk_tokens = ctx->saved_data["chunk"].toInt();
    const torch::ScalarType dtype = input.scalar_type();
    const bool want_x = ctx->needs_input_grad(0);
    const bool want_w = ctx->needs_input_grad(1);
    const int64_t n = input.size(0);
    torch::Tensor grad_x = want_x ? torch::empty_like(input) : torch::Tensor();
    torch::Tensor grad_w =
        want_w ? torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32))
               : torch::Tensor();
    for (int64_t start = 0; start < n; start += chunk_tokens) {
      const int64_t count = std::min(chunk_tokens, n - start);
      const torch::Tensor xc = Chunk(input, start, count);
      // d loss / d z_v = (softmax_v - [v == label]) * valid * grad, in fp32.
      torch::Tensor p = torch::matmul(xc, w.t()).to(torch::kFloat32);
      p.sub_(Chunk(lse, start, count).unsqueeze(1)).exp_();
      p.scatter_add_(1, Chunk(column, start, count).unsqueeze(1),
                     -Chunk(held, start, count).unsqueeze(1));
      p.mul_(Chunk(scale, start, count).unsqueeze(1));
      const torch::Tensor g = p.to(dtype);
      p = torch::Tensor();
      if (want_x) {
        torch::Tensor out = Chunk(grad_x, start, count);
        torch::mm_out(out, g, w);
      }
      if (want_w) {
        if (dtype == torch::kFloat32) {
          grad_w.addmm_(g.t(), xc);
        } else {
          grad_w.add_(torch::mm(g.t(), xc));
        }
      }
    }
    if (want_x)
      grads[0] = grad_x.to(static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    if (want_w) grads[1] = grad_w.to(weight.scalar_type());
    return grads;
  }
};

}  // namespace

torch::Tensor ChunkedLinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight,
                                        const torch::Tensor& labels, int64_t begin,
                                        const TensorGroup& group, int64_t chunk_tokens) {
  TORCH_CHECK(chunk_tokens >= 1, "ChunkedLinearCrossEntropy: chunk_tokens ", chunk_tokens,
              " must be at least 1");
  TORCH_CHECK(x.dim() == 2 && labels.dim() == 1 && labels.size(0) == x.size(0),
              "ChunkedLinearCrossEntropy: x [n, h] and labels [n] expected");
  return ChunkedHead::apply(x, weight, labels, begin, chunk_tokens, &group);
}

}  // namespace varipipe::executor
