// Which part of each parameter a tensor-parallel rank holds (Megatron-LM's
// layout, Shoeybi et al. 2019, section 3): column-parallel weights and
// biases (the Q/K/V, cross-attention and MLP input projections) split their
// output rows, row-parallel weights (the attention and MLP output
// projections) their input columns, the vocabulary-parallel embeddings and
// LM head their vocabulary rows, and T5V11's relative bias tables their
// heads. Norms, row-parallel biases and learned position tables are
// replicated. One table (ShardOfParameter) serves the model's
// initialisation, checkpoints, the Hugging Face import and the tests.
//
// A split into n parts gives part i the rows [i * c, min(size, (i + 1) * c)),
// c = ceil(size / n): even where n divides the size (heads and MLP widths
// must, ModelSpecFromConfig checks), the last part shorter for a vocabulary
// that n does not divide.
#ifndef VARIPIPE_EXECUTOR_MODEL_TENSOR_SHARD_H_
#define VARIPIPE_EXECUTOR_MODEL_TENSOR_SHARD_H_

#include <torch/torch.h>

#include <cstdint>
#include <string_view>

namespace varipipe::executor {

struct TensorShard {
  // The dimension split over the tensor ranks; -1: replicated.
  int64_t dim = -1;
  // Fused projections hold `blocks` equal blocks along `dim` (Megatron's
  // QKV: 3, its cross-attention KV: 2), each split on its own, so a rank's
  // part is its piece of every block, in block order.
  int64_t blocks = 1;
  bool replicated() const { return dim < 0; }
};

// The sharding of a parameter by its name (a named_parameters() key; the
// part after the last '.' decides).
TensorShard ShardOfParameter(std::string_view name);

// [begin, end) of part `index` of `size` rows split `parts` ways.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange RangeOfPart(int64_t size, int64_t parts, int64_t index);

// Part `index` of `full` split `parts` ways as `shard` says (a copy; `full`
// itself when replicated or parts == 1).
torch::Tensor ShardOf(const torch::Tensor& full, TensorShard shard, int64_t parts, int64_t index);

// The inverse: `pieces[i]` is part i; returns the whole tensor.
torch::Tensor UnshardOf(const std::vector<torch::Tensor>& pieces, TensorShard shard);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_TENSOR_SHARD_H_
