#include "executor/runtime/device.h"

#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/version.h>
// Debian's CPU-only LibTorch ships the header without its generated macros.
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#define VARIPIPE_TORCH_HAS_CUDA_ALLOCATOR 1
#endif

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace varipipe::executor {

#ifdef VARIPIPE_TORCH_HAS_CUDA_ALLOCATOR
// The caching allocator's aggregate statistic (StatType::AGGREGATE, first in
// every LibTorch; newer ones declare StatType outside CUDACachingAllocator).
constexpr size_t kAggregateStat = 0;
#endif

std::string ConfigureCudaAllocator(bool expandable_segments) {
  constexpr char kVariable[] = "PYTORCH_CUDA_ALLOC_CONF";
  const char* current = std::getenv(kVariable);
  const std::string conf = current != nullptr ? current : "";
  if (absl::StrContains(conf, "expandable_segments")) {
    return absl::StrCat(conf, " (from ", kVariable, ")");
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (expandable_segments) {
    const std::string value =
        conf.empty() ? "expandable_segments:True" : absl::StrCat(conf, ",expandable_segments:True");
    setenv(kVariable, value.c_str(), /*overwrite=*/1);
    return absl::StrCat(value, " (set from training.cuda_expandable_segments)");
  }
  return absl::StrCat(conf.empty() ? "default segments" : conf,
                      " (training.cuda_expandable_segments is false)");
#else
  (void)expandable_segments;
  return absl::StrCat(conf.empty() ? "default segments" : conf, " (LibTorch ", TORCH_VERSION,
                      " has no expandable segments)");
#endif
}

absl::StatusOr<DeviceChoice> ChooseDevice(int local_rank) {
  try {
    DeviceChoice choice;
    choice.cuda_devices_visible =
        torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    if (choice.cuda_devices_visible == 0) {
      choice.name = "cpu";
      return choice;
    }
    if (local_rank >= choice.cuda_devices_visible) {
      return absl::FailedPreconditionError(
          absl::StrCat("local rank ", local_rank, " has no GPU: only ", choice.cuda_devices_visible,
                       " CUDA device(s) are visible (check CUDA_VISIBLE_DEVICES and "
                       "--nproc-per-node)"));
    }
    const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
    choice.name = device.str();
    choice.is_cuda = true;
    return choice;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("LibTorch failed while choosing a device: ", e.what()));
  }
}

std::string TorchVersion() { return TORCH_VERSION; }

bool SetCudaSyncWarnings(bool on) {
#ifdef VARIPIPE_TORCH_HAS_CUDA_ALLOCATOR
  c10::cuda::warning_state().set_sync_debug_mode(on ? c10::cuda::SyncDebugMode::L_WARN
                                                    : c10::cuda::SyncDebugMode::L_DISABLED);
  return true;
#else
  (void)on;
  return false;
#endif
}

int64_t PeakMemoryBytes(const DeviceChoice& device) {
#ifdef VARIPIPE_TORCH_HAS_CUDA_ALLOCATOR
  if (device.is_cuda) {
    const int index = std::stoi(device.name.substr(device.name.find(':') + 1));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return stats
        .allocated_bytes[kAggregateStat]
        .peak;
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t PeakReservedBytes(const DeviceChoice& device) {
#ifdef VARIPIPE_TORCH_HAS_CUDA_ALLOCATOR
  if (device.is_cuda) {
    const int index = std::stoi(device.name.substr(device.name.find(':') + 1));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return stats.reserved_bytes[kAggregateStat].peak;
  }
#endif
  return PeakMemoryBytes(device);
}

int64_t CurrentMemoryBytes(const DeviceChoice& device) {
#ifdef VARIPIPE_TORCH_HAS_CUDA_ALLOCATOR
  if (device.is_cuda) {
    const int index = std::stoi(device.name.substr(device.name.find(':') + 1));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return stats
        .allocated_bytes[kAggregateStat]
        .current;
  }
#endif
  (void)device;
  // /proc/self/statm: total and resident pages.
  std::ifstream statm("/proc/self/statm");
  int64_t total_pages = 0;
  int64_t resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace varipipe::executor
