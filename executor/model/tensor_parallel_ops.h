// The communication operators of tensor-parallel layers, as autograd
// functions (Megatron-LM: Shoeybi et al. 2019, section 3, figure 3; sequence
// parallelism: Korthikanti et al. 2022, section 4.2.2, figure 6). Each is the
// identity, with no autograd node, on a group of one rank.
//
//   region               forward                 backward
//   CopyToTensorRegion   identity                all-reduce        (f)
//   ReduceFromTensorRegion all-reduce            identity          (g)
//   ScatterToSequence    this rank's part        all-gather
//   GatherFromSequence   all-gather              reduce-scatter, or this
//                                                rank's part
//   ReduceScatterToSequence reduce-scatter       all-gather
//
// The sequence operators act on dim 1 of [b, s, hidden] tensors. A
// sequence that the group's size does not divide is padded with zero rows
// to the next multiple before it is split, and the padding is dropped again
// when it is gathered: padded rows hold no token, take no part in attention
// (which runs on the gathered sequence) and get zero gradients.
#ifndef VARIPIPE_EXECUTOR_MODEL_TENSOR_PARALLEL_OPS_H_
#define VARIPIPE_EXECUTOR_MODEL_TENSOR_PARALLEL_OPS_H_

#include <torch/torch.h>

#include <cstdint>

#include "executor/model/tensor_group.h"

namespace varipipe::executor {

torch::Tensor CopyToTensorRegion(const torch::Tensor& x, const TensorGroup& group);
torch::Tensor ReduceFromTensorRegion(const torch::Tensor& x, const TensorGroup& group);
// x [b, s, h] -> [b, ceil(s / size), h].
torch::Tensor ScatterToSequence(const torch::Tensor& x, const TensorGroup& group);
// x [b, ceil(length / size), h] -> [b, length, h]. `reduce_grad`: the
// consumers are tensor-parallel (each rank's gradient is a partial sum, so
// backward reduce-scatters); otherwise they are replicated (each rank holds
// the whole gradient, so backward keeps this rank's part).
torch::Tensor GatherFromSequence(const torch::Tensor& x, const TensorGroup& group, int64_t length,
                                 bool reduce_grad);
// x [b, s, h] (partial sums) -> [b, ceil(s / size), h].
torch::Tensor ReduceScatterToSequence(const torch::Tensor& x, const TensorGroup& group);

// The two ends of a tensor-parallel region inside a layer: its input enters
// column-parallel projections (f, or with sequence parallelism the
// all-gather of the rank's sequence part to `length` rows) and its output
// leaves row-parallel ones (g, or the reduce-scatter to sequence parts).
torch::Tensor EnterTensorRegion(const torch::Tensor& x, const TensorGroup& group, int64_t length);
torch::Tensor LeaveTensorRegion(const torch::Tensor& x, const TensorGroup& group);

// A replicated parameter used on the rank's part of the sequence (a norm's
// weight, a row-parallel bias under sequence parallelism): its gradient on
// each rank covers only that part, so backward sums it over the group
// (f applied to the parameter; Korthikanti et al.'s all-reduce of the
// sequence-parallel parameters' gradients). Without sequence parallelism
// the parameter itself.
torch::Tensor SequenceParallelParameter(const torch::Tensor& p, const TensorGroup& group);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_TENSOR_PARALLEL_OPS_H_
