// The executor's monitoring endpoint: StatusService.GetExecutorStatus (rank,
// iteration, last loss, tokens/s, memory, and the instruction the rank is in
// with how long it has been there, which shows where a stuck rank waits) and
// the standard gRPC health service, on --status_host:--status_port + local
// rank. The other StatusService methods belong to planner daemons and answer
// UNIMPLEMENTED here.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_EXECUTOR_STATUS_SERVICE_H_
#define VARIPIPE_EXECUTOR_RUNTIME_EXECUTOR_STATUS_SERVICE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "executor/runtime/instruction_progress.h"
#include "grpcpp/grpcpp.h"
#include "varipipe/v1/plan.pb.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::executor {

// What the training loop tells the status service; thread-safe.
class ExecutorStatusBoard {
 public:
  // Identity fields (job, ranks, device) of every snapshot.
  explicit ExecutorStatusBoard(v1::ExecutorStatus identity);

  // The plan the interpreter is about to run; kept alive for the snapshots.
  void BeginIteration(std::shared_ptr<const v1::ExecutionPlan> plan);
  void EndIteration(double loss, double tokens_per_second, uint64_t memory_allocated_bytes,
                    uint64_t peak_memory_bytes);
  // This rank's measured model state (ExecutorStatus.parameter_bytes,
  // optimizer_state_bytes).
  void SetModelState(uint64_t parameter_bytes, uint64_t optimizer_state_bytes);

  // Passed to the interpreter (InterpreterOptions::progress).
  InstructionProgress* progress() { return &progress_; }

  v1::ExecutorStatus Snapshot() const;

 private:
  mutable absl::Mutex mu_;
  v1::ExecutorStatus status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const v1::ExecutionPlan> plan_ ABSL_GUARDED_BY(mu_);
  InstructionProgress progress_;
};

class ExecutorStatusServer {
 public:
  // Listens on host:port (port 0: a free one). With a `token`,
  // GetExecutorStatus calls must carry it (common/grpc/call_token.h;
  // UNAUTHENTICATED otherwise); the health service answers everyone.
  static absl::StatusOr<std::unique_ptr<ExecutorStatusServer>> Start(
      const std::string& host, int port, const ExecutorStatusBoard* board,
      const std::string& token = "");
  ~ExecutorStatusServer();

  int port() const { return port_; }

 private:
  class Service;
  ExecutorStatusServer() = default;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_EXECUTOR_STATUS_SERVICE_H_
