// NCCL results as absl::Status, and the NCCL library's version. Compiled only
// when CUDA and NCCL are found (VARIPIPE_WITH_CUDA).
#ifndef VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_STATUS_H_
#define VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_STATUS_H_

#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace varipipe::executor {

// OK for ncclSuccess; otherwise `what` plus NCCL's error string and its last
// error message. Remote and system errors are UNAVAILABLE (a peer or the
// network failed), invalid arguments INVALID_ARGUMENT, the rest INTERNAL.
absl::Status NcclToStatus(ncclResult_t result, absl::string_view what);

// Version of the NCCL library loaded at run time ("2.28.9"), which may differ
// from the headers the build used.
std::string NcclRuntimeVersion();

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_STATUS_H_
