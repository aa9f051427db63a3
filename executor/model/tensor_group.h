// The tensor-parallel group of one rank: the ranks that shard the same
// pipeline stages (docs/executor.md, "Tensor parallelism"), and the
// collectives its layers run on tensors. Ranks are laid out tensor
// innermost: the group of global rank g is g - g % size .. g - g % size +
// size - 1, and g % size is g's index in it (which part of each sharded
// parameter it holds, tensor_shard.h).
//
// The collectives run on the transport's groups in fp32 (a tensor of another
// dtype is cast, and the result cast back), block until done and throw
// c10::Error naming the collective and the transport's status on failure:
// they run inside the autograd graph, and the plan interpreter turns a
// LibTorch exception into the rank's error.
//
// Every rank of the group must call the same collectives in the same order
// with tensors of the same shape: each runs the same plan on stages of the
// same shapes, and autograd orders a backward pass by its graph alone.
#ifndef VARIPIPE_EXECUTOR_MODEL_TENSOR_GROUP_H_
#define VARIPIPE_EXECUTOR_MODEL_TENSOR_GROUP_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "executor/comm/transport.h"

namespace varipipe::executor {

class TensorGroup {
 public:
  // No tensor parallelism: size 1, every collective the identity.
  TensorGroup() = default;
  // Global rank `global_rank` in groups of `size`; `sequence_parallel` as
  // ParallelismConfig.sequence_parallel.
  TensorGroup(int global_rank, int size, bool sequence_parallel);

  int size() const { return size_; }
  int index() const { return index_; }
  bool sequence_parallel() const { return sequence_parallel_ && size_ > 1; }
  const std::vector<int>& ranks() const { return ranks_; }  // global, ascending

  // The transport whose global ranks ranks() names (not owned); set before
  // the first collective of a group larger than one.
  void set_transport(Transport* transport) { transport_ = transport; }

  // The elementwise sum over the group (a new tensor).
  torch::Tensor AllReduceSum(const torch::Tensor& x) const;
  // The ranks' tensors concatenated along `dim` in rank order.
  torch::Tensor AllGather(const torch::Tensor& x, int64_t dim) const;
  // x summed over the group, then this rank's part of `dim` (split in
  // size() equal parts: size() must divide x.size(dim)).
  torch::Tensor ReduceScatter(const torch::Tensor& x, int64_t dim) const;

 private:
  // Runs `collective` on a contiguous fp32 copy of `x` (CUDA work finished
  // first: the transport's stream does not wait for the compute stream).
  torch::Tensor Run(const torch::Tensor& x, const char* what,
                    absl::Status (Transport::*collective)(std::span<float>,
                                                          const std::vector<int>&)) const;

  int size_ = 1;
  int index_ = 0;
  bool sequence_parallel_ = false;
  std::vector<int> ranks_ = {0};
  Transport* transport_ = nullptr;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_TENSOR_GROUP_H_
