// The pipeline-rank view of a tensor-parallel rank's transport.
//
// Ranks are laid out tensor innermost (docs/executor.md, "Tensor
// parallelism"): global rank = pipeline rank * tensor + tensor index. Every
// tensor rank of a pipeline rank runs the same plan, whose transfers and
// groups name pipeline ranks; tensor index i exchanges activations and
// reduces gradients only with the tensor index i of the other pipeline
// ranks. This view maps pipeline rank p to global rank p * tensor + i for
// every call, so the plan interpreter, the optimizer's sharding and the
// shared-parameter sums work unchanged in pipeline ranks:
//
//   TensorRankTransport view(gloo.get(), /*tensor=*/2, /*index=*/1);
//   view.rank();                          // global rank 5 -> pipeline rank 2
//   view.StartSend(3, data, bytes);       // to global rank 7
//   view.AllReduceMean(grads, {0, 2});    // over global ranks 1 and 5
//
// The tensor group's own collectives (tensor_group.h) use the global
// transport directly. With tensor = 1 the view is the identity.
#ifndef VARIPIPE_EXECUTOR_COMM_TENSOR_RANK_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_TENSOR_RANK_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "executor/comm/transport.h"

namespace varipipe::executor {

class TensorRankTransport final : public Transport {
 public:
  // `global` (not owned) must outlive the view; its size is a multiple of
  // `tensor` and its rank's tensor index is `global->rank() % tensor`.
  TensorRankTransport(Transport* global, int tensor);

  // The global rank of pipeline rank `pipeline_rank` at this rank's tensor
  // index.
  int GlobalRank(int pipeline_rank) const { return pipeline_rank * tensor_ + index_; }

  int rank() const override { return global_->rank() / tensor_; }
  int size() const override { return global_->size() / tensor_; }
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override;
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllReduceMean(
      std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllReduceSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status ReduceScatterSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllGather(std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartReduceScatterSum(
      std::span<float> data, const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllGather(std::span<float> data,
                                                           const std::vector<int>& group) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartDeviceOrdered(
      DeviceCollective kind, std::span<float> data, const std::vector<int>& group) override;
  std::string Describe() const override;
  void Abort(const std::string& reason) override { global_->Abort(reason); }

 private:
  std::vector<int> GlobalGroup(const std::vector<int>& group) const;

  Transport* global_;
  int tensor_;
  int index_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_TENSOR_RANK_TRANSPORT_H_
