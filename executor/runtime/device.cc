#include "executor/runtime/device.h"

#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace varipipe::executor {

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

}  // namespace varipipe::executor
