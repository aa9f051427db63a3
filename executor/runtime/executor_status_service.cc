#include "executor/runtime/executor_status_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc/call_token.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace varipipe::executor {

ExecutorStatusBoard::ExecutorStatusBoard(v1::ExecutorStatus identity)
    : status_(std::move(identity)) {}

void ExecutorStatusBoard::BeginIteration(std::shared_ptr<const v1::ExecutionPlan> plan) {
  absl::MutexLock lock(&mu_);
  status_.set_iteration(plan->iteration());
  plan_ = std::move(plan);
}

void ExecutorStatusBoard::EndIteration(double loss, double tokens_per_second,
                                       uint64_t memory_allocated_bytes,
                                       uint64_t peak_memory_bytes) {
  absl::MutexLock lock(&mu_);
  status_.set_last_loss(loss);
  status_.set_tokens_per_second(tokens_per_second);
  status_.set_memory_allocated_bytes(memory_allocated_bytes);
  status_.set_peak_memory_bytes(peak_memory_bytes);
}

void ExecutorStatusBoard::SetModelState(uint64_t parameter_bytes, uint64_t optimizer_state_bytes) {
  absl::MutexLock lock(&mu_);
  status_.set_parameter_bytes(parameter_bytes);
  status_.set_optimizer_state_bytes(optimizer_state_bytes);
}

v1::ExecutorStatus ExecutorStatusBoard::Snapshot() const {
  v1::ExecutorStatus status;
  std::shared_ptr<const v1::ExecutionPlan> plan;
  {
    absl::MutexLock lock(&mu_);
    status = status_;
    plan = plan_;
  }
  const int index = progress_.index.load(std::memory_order_acquire);
  const int64_t started_ns = progress_.started_ns.load(std::memory_order_relaxed);
  if (plan != nullptr && index >= 0 && index < plan->instructions_size() &&
      plan->iteration() == status.iteration()) {
    const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
    status.set_current_instruction(static_cast<uint32_t>(index));
    status.set_current_instruction_text(plan->instructions(index).ShortDebugString());
    status.set_current_instruction_s(static_cast<double>(now_ns - started_ns) * 1e-9);
  }
  return status;
}

class ExecutorStatusServer::Service final : public v1::StatusService::Service {
 public:
  Service(const ExecutorStatusBoard* board, std::string token)
      : board_(board), verifier_(std::move(token)) {}
  grpc::Status GetExecutorStatus(grpc::ServerContext* context, const v1::GetExecutorStatusRequest*,
                                 v1::ExecutorStatus* response) override {
    if (grpc::Status s = verifier_.Verify(*context); !s.ok()) return s;
    *response = board_->Snapshot();
    return grpc::Status::OK;
  }

 private:
  const ExecutorStatusBoard* board_;
  CallTokenVerifier verifier_;
};

absl::StatusOr<std::unique_ptr<ExecutorStatusServer>> ExecutorStatusServer::Start(
    const std::string& host, int port, const ExecutorStatusBoard* board, const std::string& token) {
  std::unique_ptr<ExecutorStatusServer> server(new ExecutorStatusServer());
  server->service_ = std::make_unique<Service>(board, token);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // A port another process holds is an error, not shared (gRPC's default
  // SO_REUSEPORT would let two jobs' executors answer on one port).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const std::string address = absl::StrCat(
      host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host, ":", port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve the status endpoint on ", address,
        " (port in use? choose another base with --status_port, 0 for free ports, -1 for none)"));
  }
  return server;
}

ExecutorStatusServer::~ExecutorStatusServer() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace varipipe::executor
