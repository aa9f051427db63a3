// The tensor-parallel group of one rank: the ranks that shard the same
// pipeline stages (docs/executor.md, "Tensor parallelism"), and the
// collectives its layers run on tensors. Ranks are laid out tensor
// innermost: the group of global rank g is g - g % size .. g - g % size +
// size - 1, and g % size is g's index in it (which part of each sharded
// parameter it holds, tensor_shard.h).
//
// The collectives run on the transport's groups in fp32 (a tensor of another
// dtype is cast, and the result cast back; an all-gather of 2-byte elements
// sends them as they are, two per word, AllGather) through
// Transport::StartDeviceOrdered. Where the transport orders them on the
// device (NCCL: the tensor group's stream after the compute stream, the
// compute stream then waiting on the collective's event) the host does not
// wait: the collective stays pending in the group until Drain, which the
// plan interpreter calls where the host waits anyway (before the
// iteration's one device read), and which reports a failure naming the
// group and the collective. Elsewhere (Gloo, CPUs) each collective blocks
// until done. A failure known at once throws c10::Error naming the
// collective and the transport's status: the collectives run inside the
// autograd graph, and the plan interpreter turns a LibTorch exception into
// the rank's error.
//
// Every rank of the group must call the same collectives in the same order
// with tensors of the same shape: each runs the same plan on stages of the
// same shapes, and autograd orders a backward pass by its graph alone.
#ifndef VARIPIPE_EXECUTOR_MODEL_TENSOR_GROUP_H_
#define VARIPIPE_EXECUTOR_MODEL_TENSOR_GROUP_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "executor/comm/transport.h"

namespace varipipe::executor {

class TensorGroup {
 public:
  // No tensor parallelism: size 1, every collective the identity.
  TensorGroup() = default;
  // Global rank `global_rank` in groups of `size`; `sequence_parallel` as
  // ParallelismConfig.sequence_parallel.
  TensorGroup(int global_rank, int size, bool sequence_parallel);
  // A group of the global ranks `ranks` (ascending, at least one), this rank
  // being ranks[index]; `kind` names it in errors ("context-parallel": a
  // context group of one tensor index, common/config/rank_layout.h). No
  // sequence parallelism.
  TensorGroup(std::vector<int> ranks, int index, std::string kind);

  int size() const { return size_; }
  int index() const { return index_; }
  bool sequence_parallel() const { return sequence_parallel_ && size_ > 1; }
  const std::vector<int>& ranks() const { return ranks_; }  // global, ascending

  // The transport whose global ranks ranks() names (not owned); set before
  // the first collective of a group larger than one.
  void set_transport(Transport* transport) { transport_ = transport; }

  // The elementwise sum over the group (a new tensor).
  torch::Tensor AllReduceSum(const torch::Tensor& x) const;
  // The ranks' tensors concatenated along `dim` in rank order. 2-byte
  // elements (bf16, fp16) travel as they are, two per 4-byte word of the
  // transport's fp32 collective (half an fp32 copy's bytes; the gather only
  // copies, so they arrive bit for bit); other dtypes as an fp32 copy.
  torch::Tensor AllGather(const torch::Tensor& x, int64_t dim) const;
  // x summed over the group, then this rank's part of `dim` (split in
  // size() equal parts: size() must divide x.size(dim)).
  torch::Tensor ReduceScatter(const torch::Tensor& x, int64_t dim) const;

  // Waits (until `deadline`, abortable through the transport) for every
  // collective still pending on the device; the first failure names the
  // group and the collective. Call it at least once per iteration (pending
  // collectives hold their buffers), where the host waits anyway.
  absl::Status Drain(absl::Time deadline);
  // Collectives pending since the last Drain (tests).
  size_t pending() const;

  // Waits (bounded) for what is still pending.
  ~TensorGroup();

 private:
  // A collective the device orders and the host has not waited for.
  struct Pending {
    // Not its buffer: the compute stream waits for the collective before
    // anything queued after it, so the caching allocator hands the buffer
    // to later compute-stream work only once the collective is done (or its
    // communicator aborted); keeping every buffer until Drain would hold
    // one activation-sized copy per collective for the whole iteration.
    std::unique_ptr<Transfer> transfer;
    const char* what;
  };
  // Runs `kind` on a contiguous fp32 copy of `x` (the transport orders it
  // after the compute stream's queued work).
  torch::Tensor Run(const torch::Tensor& x, const char* what,
                    Transport::DeviceCollective kind) const;
  // Runs `kind` in place on `words`: contiguous fp32 (or 4-byte words of
  // another dtype's bytes, for an all-gather, which only copies).
  void RunInPlace(const torch::Tensor& words, const char* what,
                  Transport::DeviceCollective kind) const;

  int size_ = 1;
  int index_ = 0;
  bool sequence_parallel_ = false;
  std::string kind_ = "tensor-parallel";
  std::vector<int> ranks_ = {0};
  Transport* transport_ = nullptr;
  // The collectives run from const methods (inside autograd functions, on
  // the autograd engine's threads): guarded by mu_.
  mutable std::mutex mu_;
  mutable std::vector<Pending> pending_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_TENSOR_GROUP_H_
