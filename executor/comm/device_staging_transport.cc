#include "executor/comm/device_staging_transport.h"

#include <exception>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "torch/cuda.h"

namespace varipipe::executor {
namespace {

// The device's queued work, finished: kernels on any of its streams may
// have produced (or still read) the buffer.
void SynchronizeDevice(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// `bytes` of device memory at `data`, as a tensor that does not own it.
torch::Tensor DeviceBytes(void* data, size_t bytes, const torch::Device& device) {
  return torch::from_blob(data, {static_cast<int64_t>(bytes)},
                          torch::TensorOptions().dtype(torch::kUInt8).device(device));
}

// A fresh host copy of device memory (a real copy also when the device is
// the CPU: the host transport must never see the caller's buffer).
torch::Tensor ToHost(void* data, size_t bytes, const torch::Device& device) {
  SynchronizeDevice(device);
  torch::Tensor host = torch::empty({static_cast<int64_t>(bytes)}, torch::kUInt8);
  host.copy_(DeviceBytes(data, bytes, device));
  return host;
}

void ToDevice(const torch::Tensor& host, void* data, size_t bytes, const torch::Device& device) {
  DeviceBytes(data, bytes, device).copy_(host);
  SynchronizeDevice(device);
}

// LibTorch reports failures as exceptions; the transport interface as status.
absl::Status Guarded(const std::string& what, const std::function<absl::Status()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(what, ": copy between device and host failed: ", e.what()));
  }
}

class StagedTransfer final : public Transfer {
 public:
  // A receive copies `host` to `device_data` once the host transfer is done;
  // a send (device_data == nullptr) only keeps `host` alive until then.
  StagedTransfer(std::unique_ptr<Transfer> host_transfer, torch::Tensor host, void* device_data,
                 torch::Device device)
      : host_transfer_(std::move(host_transfer)),
        host_(std::move(host)),
        device_data_(device_data),
        device_(device) {}

  absl::Status Wait(absl::Time deadline) override {
    absl::Status done = host_transfer_->Wait(deadline);
    if (!done.ok() || device_data_ == nullptr) return done;
    return Guarded("receive", [&] {
      ToDevice(host_, device_data_, static_cast<size_t>(host_.numel()), device_);
      return absl::OkStatus();
    });
  }

 private:
  std::unique_ptr<Transfer> host_transfer_;
  torch::Tensor host_;
  void* device_data_;
  torch::Device device_;
};

// Runs `collective` on a host copy of `data` and copies the result back.
absl::Status StagedCollective(const char* what, std::span<float> data, const torch::Device& device,
                              const std::function<absl::Status(std::span<float>)>& collective) {
  const size_t bytes = data.size_bytes();
  torch::Tensor host;
  VP_RETURN_IF_ERROR(Guarded(what, [&] {
    host = ToHost(data.data(), bytes, device);
    return absl::OkStatus();
  }));
  VP_RETURN_IF_ERROR(
      collective(std::span<float>(static_cast<float*>(host.data_ptr()), data.size())));
  return Guarded(what, [&] {
    ToDevice(host, data.data(), bytes, device);
    return absl::OkStatus();
  });
}

}  // namespace

DeviceStagingTransport::DeviceStagingTransport(std::unique_ptr<Transport> host,
                                               torch::Device device)
    : host_(std::move(host)), device_(device) {}

absl::StatusOr<std::unique_ptr<Transfer>> DeviceStagingTransport::StartSend(int peer, void* data,
                                                                            size_t bytes) {
  torch::Tensor host;
  VP_RETURN_IF_ERROR(Guarded(absl::StrCat("send to rank ", peer), [&] {
    host = ToHost(data, bytes, device_);
    return absl::OkStatus();
  }));
  absl::StatusOr<std::unique_ptr<Transfer>> t = host_->StartSend(peer, host.data_ptr(), bytes);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Transfer>(
      std::make_unique<StagedTransfer>(*std::move(t), std::move(host), nullptr, device_));
}

absl::StatusOr<std::unique_ptr<Transfer>> DeviceStagingTransport::StartRecv(int peer, void* data,
                                                                            size_t bytes) {
  torch::Tensor host = torch::empty({static_cast<int64_t>(bytes)}, torch::kUInt8);
  absl::StatusOr<std::unique_ptr<Transfer>> t = host_->StartRecv(peer, host.data_ptr(), bytes);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Transfer>(
      std::make_unique<StagedTransfer>(*std::move(t), std::move(host), data, device_));
}

absl::Status DeviceStagingTransport::AllReduceMean(std::span<float> data,
                                                   const std::vector<int>& group) {
  return StagedCollective("all-reduce", data, device_,
                          [&](std::span<float> host) { return host_->AllReduceMean(host, group); });
}

absl::Status DeviceStagingTransport::AllReduceSum(std::span<float> data,
                                                  const std::vector<int>& group) {
  return StagedCollective("all-reduce", data, device_,
                          [&](std::span<float> host) { return host_->AllReduceSum(host, group); });
}

absl::Status DeviceStagingTransport::ReduceScatterSum(std::span<float> data,
                                                      const std::vector<int>& group) {
  return StagedCollective("reduce-scatter", data, device_, [&](std::span<float> host) {
    return host_->ReduceScatterSum(host, group);
  });
}

absl::Status DeviceStagingTransport::AllGather(std::span<float> data,
                                               const std::vector<int>& group) {
  return StagedCollective("all-gather", data, device_,
                          [&](std::span<float> host) { return host_->AllGather(host, group); });
}

std::string DeviceStagingTransport::Describe() const {
  return absl::StrCat(host_->Describe(), " staging ", device_.str());
}

}  // namespace varipipe::executor
