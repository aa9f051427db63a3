#include "executor/comm/nccl/nccl_communicator.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "executor/comm/nccl/nccl_status.h"

namespace varipipe::executor {
namespace {

// How long a clean end waits for ncclCommFinalize before aborting.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);
// Between polls of a communicator's state.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int nranks, const ncclUniqueId& id, int rank, absl::Time deadline, const CancelCheck& cancelled,
    const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: creation and operations return at once, so every wait is
  // ours to bound (and to abort).
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclUniqueId copy = id;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, nranks, copy, rank, &config);
  if (comm == nullptr) {
    // Nothing was allocated (NCCL returns a handle whenever it did).
    return NcclToStatus(result == ncclSuccess ? ncclInternalError : result, what);
  }
  // Owned from here: every failure below aborts (and so frees) it.
  std::unique_ptr<NcclCommunicator> owned(new NcclCommunicator(comm));
  owned->what_ = what;
  if (absl::Status s = owned->Check(result, deadline, cancelled, what); !s.ok()) return s;
  return owned;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;  // aborted: NCCL freed it
  // A healthy communicator: flush and quiesce, then free locally. If that
  // fails or does not finish, abort (ncclCommDestroy would wait on work
  // that never completes).
  ncclResult_t result = ncclCommFinalize(comm_);
  const absl::Time deadline = absl::Now() + kFinalizeTimeout;
  while (result == ncclInProgress && absl::Now() < deadline) {
    absl::SleepFor(kPollInterval);
    if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess) result = ncclInternalError;
  }
  if (result == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

void NcclCommunicator::Abort() {
  if (comm_ == nullptr) return;
  // Frees the communicator: the handle must not reach NCCL again.
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status NcclCommunicator::AsyncError(const std::string& what) {
  if (comm_ == nullptr) {
    return absl::AbortedError(absl::StrCat(what, ": the NCCL communicator (", what_,
                                           ") was aborted after an earlier failure"));
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
  if (query != ncclSuccess) state = query;
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  const absl::Status status = NcclToStatus(state, what);
  Abort();
  return status;
}

absl::Status NcclCommunicator::Check(ncclResult_t result, absl::Time deadline,
                                     const CancelCheck& cancelled, const std::string& what) {
  if (comm_ == nullptr) return AsyncError(what);
  if (result == ncclSuccess) return absl::OkStatus();
  if (result == ncclInProgress) return WaitReady(deadline, cancelled, what);
  const absl::Status status = NcclToStatus(result, what);
  Abort();
  return status;
}

absl::Status NcclCommunicator::WaitReady(absl::Time deadline, const CancelCheck& cancelled,
                                         const std::string& what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) state = query;
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      const absl::Status status = NcclToStatus(state, what);
      Abort();
      return status;
    }
    if (cancelled && cancelled()) {
      Abort();
      return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    }
    if (absl::Now() >= deadline) {
      // Still in progress at the deadline (a peer that never came): abort,
      // the only way to stop NCCL's pending work.
      Abort();
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not ready by the deadline; communicator aborted"));
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace varipipe::executor
