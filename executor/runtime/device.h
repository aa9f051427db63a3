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

// Sets PYTORCH_CUDA_ALLOC_CONF's expandable_segments for the CUDA caching
// allocator (training.cuda_expandable_segments, default on) unless the
// variable already names it, before anything touches CUDA. Returns what the
// allocator will use, for the start-up log ("expandable_segments:True (set
// by the job)", "... (from PYTORCH_CUDA_ALLOC_CONF)", or why not).
std::string ConfigureCudaAllocator(bool expandable_segments);

// Picks cuda:local_rank when CUDA devices are visible (failing when
// local_rank has no device), else the CPU. LibTorch exceptions are caught and
// returned as Internal errors.
absl::StatusOr<DeviceChoice> ChooseDevice(int local_rank);

// Peak memory so far: the CUDA caching allocator's peak allocated bytes on
// a GPU (when LibTorch has CUDA), the process's peak resident set on the CPU.
int64_t PeakMemoryBytes(const DeviceChoice& device);

// The caching allocator's peak reserved bytes on a GPU (allocated plus what
// it holds for reuse: what the device really gave up); PeakMemoryBytes on the
// CPU.
int64_t PeakReservedBytes(const DeviceChoice& device);

// Memory in use now: the caching allocator's allocated bytes on a GPU, the
// process's resident set on the CPU.
int64_t CurrentMemoryBytes(const DeviceChoice& device);

// LibTorch's CUDA synchronisation debug mode: while on, LibTorch warns
// (on standard error, "called a synchronizing CUDA operation") at every call
// that makes the host wait for the device. False when this LibTorch has no
// CUDA (nothing to count).
bool SetCudaSyncWarnings(bool on);

// LibTorch's version string, e.g. "1.13.1".
std::string TorchVersion();

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_DEVICE_H_
