#include "executor/comm/tensor_rank_transport.h"

#include "absl/strings/str_cat.h"

namespace varipipe::executor {

TensorRankTransport::TensorRankTransport(Transport* global, int tensor)
    : global_(global), tensor_(tensor), index_(global->rank() % tensor) {}

std::vector<int> TensorRankTransport::GlobalGroup(const std::vector<int>& group) const {
  std::vector<int> out;
  out.reserve(group.size());
  for (int r : group) out.push_back(GlobalRank(r));
  return out;
}

absl::StatusOr<std::unique_ptr<Transfer>> TensorRankTransport::StartSend(int peer, void* data,
                                                                         size_t bytes) {
  return global_->StartSend(GlobalRank(peer), data, bytes);
}

absl::StatusOr<std::unique_ptr<Transfer>> TensorRankTransport::StartRecv(int peer, void* data,
                                                                         size_t bytes) {
  return global_->StartRecv(GlobalRank(peer), data, bytes);
}

absl::Status TensorRankTransport::AllReduceMean(std::span<float> data,
                                                const std::vector<int>& group) {
  return global_->AllReduceMean(data, GlobalGroup(group));
}

absl::StatusOr<std::unique_ptr<Transfer>> TensorRankTransport::StartAllReduceMean(
    std::span<float> data, const std::vector<int>& group) {
  return global_->StartAllReduceMean(data, GlobalGroup(group));
}

absl::Status TensorRankTransport::AllReduceSum(std::span<float> data,
                                               const std::vector<int>& group) {
  return global_->AllReduceSum(data, GlobalGroup(group));
}

absl::Status TensorRankTransport::ReduceScatterSum(std::span<float> data,
                                                   const std::vector<int>& group) {
  return global_->ReduceScatterSum(data, GlobalGroup(group));
}

absl::Status TensorRankTransport::AllGather(std::span<float> data, const std::vector<int>& group) {
  return global_->AllGather(data, GlobalGroup(group));
}

absl::StatusOr<std::unique_ptr<Transfer>> TensorRankTransport::StartReduceScatterSum(
    std::span<float> data, const std::vector<int>& group) {
  return global_->StartReduceScatterSum(data, GlobalGroup(group));
}

absl::StatusOr<std::unique_ptr<Transfer>> TensorRankTransport::StartAllGather(
    std::span<float> data, const std::vector<int>& group) {
  return global_->StartAllGather(data, GlobalGroup(group));
}

absl::StatusOr<std::unique_ptr<Transfer>> TensorRankTransport::StartDeviceOrdered(
    DeviceCollective kind, std::span<float> data, const std::vector<int>& group) {
  return global_->StartDeviceOrdered(kind, data, GlobalGroup(group));
}

std::string TensorRankTransport::Describe() const {
  return absl::StrCat(global_->Describe(), ", tensor index ", index_, " of ", tensor_);
}

}  // namespace varipipe::executor
