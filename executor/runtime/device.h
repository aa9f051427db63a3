// The device an executor computes on: cuda:LOCAL_RANK when LibTorch sees
// CUDA devices, otherwise the CPU.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_DEVICE_H_
#define VARIPIPE_EXECUTOR_RUNTIME_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace varipipe::executor {

struct DeviceChoice {
  // "cpu" or "cuda:N".
  std::string name;
  bool is_cuda = false;
  int cuda_devices_visible = 0;
};

// Picks cuda:local_rank when CUDA devices are visible (failing when
// local_rank has no device), else the CPU. LibTorch exceptions are caught and
// returned as Internal errors.
absl::StatusOr<DeviceChoice> ChooseDevice(int local_rank);

// Peak memory so far: the CUDA caching allocator's peak allocated bytes on
// a GPU (when LibTorch has CUDA), the process's peak resident set on the CPU.
int64_t PeakMemoryBytes(const DeviceChoice& device);

// Memory in use now: the caching allocator's allocated bytes on a GPU, the
// process's resident set on the CPU.
int64_t CurrentMemoryBytes(const DeviceChoice& device);

// LibTorch's version string, e.g. "1.13.1".
std::string TorchVersion();

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_DEVICE_H_
