#include "executor/comm/nccl/nccl_status.h"

#include "absl/strings/str_cat.h"

namespace varipipe::executor {

absl::Status NcclToStatus(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", ncclGetErrorString(result), " (", ncclGetLastError(nullptr), ")");
  switch (result) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclInProgress:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string NcclRuntimeVersion() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return absl::StrCat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

}  // namespace varipipe::executor
