#include "executor/model/tensor_group.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::executor {

TensorGroup::TensorGroup(int global_rank, int size, bool sequence_parallel)
    : size_(size), index_(global_rank % size), sequence_parallel_(sequence_parallel) {
  ranks_.clear();
  for (int i = 0; i < size; ++i) ranks_.push_back(global_rank - index_ + i);
}

TensorGroup::TensorGroup(std::vector<int> ranks, int index, std::string kind)
    : size_(static_cast<int>(ranks.size())),
      index_(index),
      kind_(std::move(kind)),
      ranks_(std::move(ranks)) {
  TORCH_CHECK(size_ >= 1 && index_ >= 0 && index_ < size_, kind_, " group of ", size_,
              " ranks with index ", index_);
}

TensorGroup::~TensorGroup() {
  // A failed run's error was reported where it happened.
  Drain(absl::Now() + absl::Seconds(30)).IgnoreError();
}

torch::Tensor TensorGroup::Run(const torch::Tensor& x, const char* what,
                               Transport::DeviceCollective kind) const {
  // One fresh fp32 copy, which the collective overwrites in place.
  torch::Tensor data = x.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true).contiguous();
  RunInPlace(data, what, kind);
  return data.to(x.scalar_type());
}

void TensorGroup::RunInPlace(const torch::Tensor& words, const char* what,
                             Transport::DeviceCollective kind) const {
  TORCH_CHECK(transport_ != nullptr, kind_, " group ", absl::StrJoin(ranks_, ","),
              ": no transport for its ", what);
  TORCH_CHECK(words.scalar_type() == torch::kFloat32 && words.is_contiguous(), kind_, " ", what,
              ": the transport moves contiguous 4-byte words");
  absl::StatusOr<std::unique_ptr<Transfer>> started = transport_->StartDeviceOrdered(
      kind, std::span<float>(words.data_ptr<float>(), static_cast<size_t>(words.numel())), ranks_);
  absl::Status status = started.status();
  if (started.ok()) {
    if (const auto* finished = dynamic_cast<const FinishedTransfer*>(started->get());
        finished != nullptr) {
      status = finished->status();
    } else {
      // Ordered on the device: the host goes on; Drain waits for it.
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({*std::move(started), what});
    }
  }
  TORCH_CHECK(status.ok(), kind_, " ", what, " over ranks ", absl::StrJoin(ranks_, ","), ": ",
              status.ToString());
}

absl::Status TensorGroup::Drain(absl::Time deadline) {
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  absl::Status first;
  for (Pending& p : pending) {
    const absl::Status status = p.transfer->Wait(deadline);
    if (!status.ok() && first.ok()) {
      first = absl::Status(status.code(),
                           absl::StrCat(kind_, " ", p.what, " over ranks ",
                                        absl::StrJoin(ranks_, ","), ": ", status.message()));
    }
  }
  return first;
}

size_t TensorGroup::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

torch::Tensor TensorGroup::AllReduceSum(const torch::Tensor& x) const {
  if (size_ == 1) return x;
  return Run(x, "all-reduce", Transport::DeviceCollective::kAllReduceSum);
}

torch::Tensor TensorGroup::AllGather(const torch::Tensor& x, int64_t dim) const {
  if (size_ == 1) return x;
  // [size, ...x]: this rank's slot filled, the others gathered into theirs.
  std::vector<int64_t> shape = {size_};
  for (int64_t d : x.sizes()) shape.push_back(d);
  torch::Tensor slots = torch::zeros(shape, x.options());
  slots[index_].copy_(x);
  if (x.element_size() == 2 && x.numel() % 2 == 0) {
    // Each rank's slot is a whole number of 4-byte words: gathered in place.
    RunInPlace(slots.view({-1}).view(torch::kFloat32), "all-gather",
               Transport::DeviceCollective::kAllGather);
    return torch::cat(slots.unbind(0), dim);
  }
  const torch::Tensor gathered = Run(slots, "all-gather", Transport::DeviceCollective::kAllGather);
  return torch::cat(gathered.unbind(0), dim);
}

torch::Tensor TensorGroup::ReduceScatter(const torch::Tensor& x, int64_t dim) const {
  if (size_ == 1) return x;
  TORCH_CHECK(x.size(dim) % size_ == 0, kind_, " reduce-scatter of ", x.size(dim), " rows over ",
              size_, " ranks");
  const torch::Tensor slots = torch::stack(x.chunk(size_, dim), 0);
  const torch::Tensor summed =
      Run(slots, "reduce-scatter", Transport::DeviceCollective::kReduceScatterSum);
  return summed[index_].contiguous();
}

}  // namespace varipipe::executor
