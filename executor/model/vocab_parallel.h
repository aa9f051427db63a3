// The vocabulary-parallel embedding and cross-entropy (Megatron-LM: Shoeybi
// et al. 2019, section 3, "input embedding" and the fused output loss): a
// tensor rank holds the rows [begin, begin + rows) of the embedding and LM
// head (tensor_shard.h's RangeOfPart), and no rank ever holds the logits of
// the whole vocabulary. The head's vocabulary-parallel cross-entropy is
// chunked_loss_head.h's.
#ifndef VARIPIPE_EXECUTOR_MODEL_VOCAB_PARALLEL_H_
#define VARIPIPE_EXECUTOR_MODEL_VOCAB_PARALLEL_H_

#include <torch/torch.h>

#include <cstdint>

#include "executor/model/tensor_group.h"

namespace varipipe::executor {

// The embeddings of `tokens` [b, s] from this rank's rows `weight` [rows, h]
// (the rows of vocabulary ids begin .. begin + rows - 1), summed over the
// group: each token's row comes from the rank that holds it, zeros from the
// others. Returns [b, s, h], the same on every rank; the backward adds each
// token's gradient to the row of the rank holding it. `sum` reduces the
// ranks' partial embeddings (ReduceFromTensorRegion without sequence
// parallelism).
torch::Tensor VocabParallelEmbedding(const torch::Tensor& tokens, const torch::Tensor& weight,
                                     int64_t begin, const TensorGroup& group);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_VOCAB_PARALLEL_H_
