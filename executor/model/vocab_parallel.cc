#include "executor/model/vocab_parallel.h"

#include "executor/model/tensor_parallel_ops.h"

namespace varipipe::executor {
namespace {

// Which ids this rank's rows hold, and each one's row (0 where it holds
// none).
struct LocalLabels {
  torch::Tensor held;    // [n] bool
  torch::Tensor column;  // [n] int64
};
LocalLabels LocalLabelsOf(const torch::Tensor& labels, int64_t begin, int64_t rows) {
  const torch::Tensor held = (labels >= begin) & (labels < begin + rows);
  return {.held = held, .column = torch::where(held, labels - begin, torch::zeros_like(labels))};
}

}  // namespace

torch::Tensor VocabParallelEmbedding(const torch::Tensor& tokens, const torch::Tensor& weight,
                                     int64_t begin, const TensorGroup& group) {
  if (group.size() == 1) return torch::embedding(weight, tokens);
  const LocalLabels local = LocalLabelsOf(tokens, begin, weight.size(0));
  const torch::Tensor rows =
      torch::embedding(weight, local.column) * local.held.unsqueeze(-1).to(weight.dtype());
  return ReduceFromTensorRegion(rows, group);
}

}  // namespace varipipe::executor
