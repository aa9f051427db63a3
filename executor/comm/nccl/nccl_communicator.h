// One NCCL communicator, owned for its whole life, following NCCL's rules
// for failure (NCCL user guide: "Fault tolerance", ncclCommAbort,
// ncclCommGetAsyncError, ncclCommInitRankConfig with blocking = 0):
//
// - It is created non-blocking (config.blocking = 0): creation returns at
//   once and the communicator is ready when ncclCommGetAsyncError reports
//   ncclSuccess instead of ncclInProgress. Every wait polls that state with
//   a deadline (and a cancellation check), so a peer that never comes or
//   dies cannot hang this rank inside NCCL.
// - Operations on a non-blocking communicator may also return
//   ncclInProgress; the next NCCL call on it waits until the state is
//   ncclSuccess again (WaitReady).
// - On an error, a deadline or a cancellation the communicator is aborted:
//   ncclCommAbort stops its kernels and frees it, so the handle is dead and
//   is never passed to NCCL again (in particular never to ncclCommDestroy).
// - A communicator that is still healthy at the end is finalized
//   (ncclCommFinalize, waited for with a deadline) and destroyed; one whose
//   finalization fails or times out is aborted instead.
// - The object owns the handle from the moment NCCL returns one, so a
//   creation that fails half-way leaks nothing.
//
// Thread safety: one thread (NCCL communicators are not thread-safe).
#ifndef VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <nccl.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varipipe::executor {

class NcclCommunicator {
 public:
  // Checked while waiting: true cancels the wait (CANCELLED) and aborts.
  using CancelCheck = std::function<bool()>;

  // Creates rank `rank` of `nranks` from `id` and waits (until `deadline`)
  // for every rank to join. On failure nothing is left allocated.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int nranks,
                                                                  const ncclUniqueId& id, int rank,
                                                                  absl::Time deadline,
                                                                  const CancelCheck& cancelled,
                                                                  const std::string& what);
  ~NcclCommunicator();  // finalize + destroy, or abort (see above)
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // The handle for enqueuing operations; REQUIRES: !aborted().
  ncclComm_t get() const { return comm_; }
  bool aborted() const { return comm_ == nullptr; }

  // Checks a call's result: ncclSuccess is OK, ncclInProgress waits (until
  // `deadline`) for the communicator to be ready, anything else aborts it.
  absl::Status Check(ncclResult_t result, absl::Time deadline, const CancelCheck& cancelled,
                     const std::string& what);
  // The communicator's asynchronous state: OK, or (after aborting it) the
  // error it reported. Polled while waiting for its operations.
  absl::Status AsyncError(const std::string& what);
  // Aborts the communicator (idempotent): its operations stop, the handle is
  // freed and never used again.
  void Abort();

 private:
  explicit NcclCommunicator(ncclComm_t comm) : comm_(comm) {}
  // Polls the state until it leaves ncclInProgress.
  absl::Status WaitReady(absl::Time deadline, const CancelCheck& cancelled,
                         const std::string& what);

  ncclComm_t comm_;  // nullptr once aborted or destroyed
  std::string what_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_COMM_NCCL_NCCL_COMMUNICATOR_H_
