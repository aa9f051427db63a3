#include "executor/model/vocab_parallel.h"

#include "executor/model/tensor_parallel_ops.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Which labels this rank's columns hold, and each one's column (0 where it
// holds none).
struct LocalLabels {
  torch::Tensor held;    // [n] bool
  torch::Tensor column;  // [n] int64
};
LocalLabels LocalLabelsOf(const torch::Tensor& labels, int64_t begin, int64_t rows) {
  const torch::Tensor held = (labels >= begin) & (labels < begin + rows);
  return {.held = held, .column = torch::where(held, labels - begin, torch::zeros_like(labels))};
}

class CrossEntropy : public torch::autograd::Function<CrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& labels, int64_t begin,
                               const TensorGroup* group) {
    const LocalLabels local = LocalLabelsOf(labels, begin, logits.size(1));
    // log sum_v exp(z_v) = log sum_ranks exp(lse_rank).
    const torch::Tensor ranks_lse = group->AllGather(torch::logsumexp(logits, 1).unsqueeze(0), 0);
    const torch::Tensor lse = torch::logsumexp(ranks_lse, 0);
    const torch::Tensor picked =
        logits.gather(1, local.column.unsqueeze(1)).squeeze(1) * local.held.to(logits.dtype());
    const torch::Tensor target = group->AllReduceSum(picked);
    const torch::Tensor valid = (labels != -1).to(logits.dtype());
    ctx->save_for_backward({logits, lse, local.column, local.held, valid});
    return (lse - target) * valid;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor& logits = saved[0];
    // d loss / d z_v = softmax_v - [v == label].
    torch::Tensor g = torch::exp(logits - saved[1].unsqueeze(1));
    g.scatter_add_(1, saved[2].unsqueeze(1), -saved[3].to(g.dtype()).unsqueeze(1));
    g.mul_((grad[0] * saved[4]).unsqueeze(1));
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor VocabParallelEmbedding(const torch::Tensor& tokens, const torch::Tensor& weight,
                                     int64_t begin, const TensorGroup& group) {
  if (group.size() == 1) return torch::embedding(weight, tokens);
  const LocalLabels local = LocalLabelsOf(tokens, begin, weight.size(0));
  const torch::Tensor rows =
      torch::embedding(weight, local.column) * local.held.unsqueeze(-1).to(weight.dtype());
  return ReduceFromTensorRegion(rows, group);
}

torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                        int64_t begin, const TensorGroup& group) {
  return CrossEntropy::apply(logits, labels, begin, &group);
}

}  // namespace varipipe::executor
