// Test-only fault injection: makes one rank fail at a chosen point, so that
// tests can check that every failure ends every peer promptly and that a
// relaunch resumes correctly (docs/operations.md, "Fault injection"). Off
// unless the environment variable VARIPIPE_FAULT_INJECTION is set:
//
//   VARIPIPE_FAULT_INJECTION="rank=R,point=P,action=A[,iteration=I]"
//
//   P: before_rendezvous, after_rendezvous, before_all_reduce, in_send,
//      in_receive, in_all_reduce, in_sharded_collective, in_checkpoint_write,
//      between_iterations, in_report (the reporter's job for iteration I,
//      before its all-reduce: iteration_reporter.h), in_context_gather (a
//      split micro-batch's all-gather of keys or values over the context
//      group, context_parallel_attention.h)
//   A: kill (SIGKILL, no report), sigterm (the process signals itself and
//      stops as on a real SIGTERM), error (the point fails with INTERNAL
//      "injected failure ...")
//   I: the iteration the fault fires in (points inside an iteration; default:
//      the first iteration this launch runs). The rendezvous points ignore it.
//
// A fault fires at most once per process, at the first time rank R reaches
// P in iteration I. Before it acts it logs "injecting fault: ..." with the
// wall-clock time in microseconds ("at_us=..."), for the tests' timings.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_FAULT_INJECTION_H_
#define VARIPIPE_EXECUTOR_RUNTIME_FAULT_INJECTION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace varipipe::executor {

enum class FaultPoint {
  kBeforeRendezvous,
  kAfterRendezvous,
  kBeforeAllReduce,
  kInSend,
  kInReceive,
  kInAllReduce,
  kInShardedCollective,
  kInCheckpointWrite,
  kBetweenIterations,
  kInReport,
  kInContextGather,
};

// The name a point has in VARIPIPE_FAULT_INJECTION ("in_send").
absl::string_view FaultPointName(FaultPoint point);

// Reads VARIPIPE_FAULT_INJECTION for this process's `rank`. OK when the
// variable is unset or empty; INVALID_ARGUMENT naming the variable and the
// bad part otherwise. Call once at start-up, before any point is reached.
absl::Status ConfigureFaultInjection(int rank);

// The iteration this process runs now (the executor's loop sets it before
// each plan); points inside an iteration match against it.
void SetFaultIteration(uint64_t iteration);
// The first iteration of this launch: the default iteration of a fault.
void SetFirstFaultIteration(uint64_t iteration);

// At `point`: does nothing (OK) unless the configured fault names this
// rank, this point and the current iteration and has not fired yet. Then:
// kill never returns, sigterm raises SIGTERM and returns OK (the shutdown
// signal then aborts the rank's waits), error returns INTERNAL.
absl::Status MaybeInjectFault(FaultPoint point);
// The same for a point reached on another thread on behalf of iteration
// `iteration` (the reporter's), matched against it instead of the current
// one.
absl::Status MaybeInjectFault(FaultPoint point, std::optional<uint64_t> iteration);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_FAULT_INJECTION_H_
