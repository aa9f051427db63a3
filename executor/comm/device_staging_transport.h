// A host-memory transport (Gloo) for ranks whose tensors live on a device:
// every buffer the interpreter passes is device memory, copied to a host
// buffer before a send or collective and back after a receive or
// collective. With it, ranks that cannot use NCCL run on a GPU: several ranks
// sharing one GPU (NCCL refuses two ranks of one communicator on a device),
// or a GPU job debugged over TCP. Slow by design (every transfer
// synchronizes the device and goes through the host): for correctness
// checks, not for training speed.
//
// Ordering: a send's device-to-host copy happens in StartSend after the
// device finished its queued work (the producers of the buffer); a receive's
// host-to-device copy happens in Wait, which returns once the copy is done.
// The transport.h contract (the buffer stays untouched until Wait) is what
// makes both copies safe.
#ifndef VARIPIPE_EXECUTOR_COMM_DEVICE_STAGING_TRANSPORT_H_
#define VARIPIPE_EXECUTOR_COMM_DEVICE_STAGING_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "executor/comm/transport.h"
#include "torch/types.h"

namespace varipipe::executor {

class DeviceStagingTransport final : public Transport {
 public:
  // `host` moves host memory; every buffer given to this transport is
  // memory of `device` (the CPU too: then the copies are plain memcpys,
  // which the unit tests use).
  DeviceStagingTransport(std::unique_ptr<Transport> host, torch::Device device);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override;
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllReduceSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status ReduceScatterSum(std::span<float> data, const std::vector<int>& group) override;
  absl::Status AllGather(std::span<float> data, const std::vector<int>& group) override;
  // "<host transport> staging <device>".
  std::string Describe() const override;
  void Abort(const std::string& reason) override { host_->Abort(reason); }

 private:
  std::unique_ptr<Transport> host_;
  torch::Device device_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_DEVICE_STAGING_TRANSPORT_H_
