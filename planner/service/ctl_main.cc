// varipipe-ctl: talks to planner daemons over gRPC.
//   status                          planner and job status
//   plan --iteration N --rank R     a rank's plan, one instruction per line
//   trace --iteration N [--out F]   Chrome trace of the predicted timeline
//   executor --address host:port    an executor's status endpoint
#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth/job_token.h"
#include "common/binary_main.h"
#include "common/config/cost_model_device.h"
#include "common/grpc/client_channel.h"
#include "common/plan_contract/instruction_text.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "varipipe/v1/service.grpc.pb.h"

ABSL_FLAG(std::string, planner, "127.0.0.1:50051", "Planner daemon address (host:port).");
ABSL_FLAG(std::string, job, "", "Job id (default: the daemon's job).");
ABSL_FLAG(int64_t, iteration, 0, "Iteration for 'plan' and 'trace'.");
ABSL_FLAG(int, rank, 0, "Rank for 'plan'.");
ABSL_FLAG(std::string, out, "", "Output file for 'trace' (default: standard output).");
ABSL_FLAG(std::string, address, "",
          "Executor status endpoint (host:port) for 'executor': --status_port + local rank.");
ABSL_FLAG(int, timeout_s, 30, "Seconds to wait for an answer (a plan may not be published yet).");
ABSL_FLAG(std::string, token_file, "",
          "File holding the job token (first line; not readable by other users).");
ABSL_FLAG(std::string, store_file, "",
          "A planner daemon's --store_file: the job token is read from FILE.token beside it.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates to verify a TLS daemon with (its --tls_cert's issuer).");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for a daemon that requires one.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(bool, tls, false, "Speak TLS, verifying the daemon with the system's CA roots.");

namespace {

constexpr char kUsage[] =
    "Queries a Varipipe planner daemon.\n"
    "\n"
    "Usage: varipipe-ctl [--planner host:port] status\n"
    "       varipipe-ctl [--planner host:port] plan --iteration N --rank R\n"
    "       varipipe-ctl [--planner host:port] trace --iteration N [--out trace.json]\n"
    "       varipipe-ctl executor --address host:port   (an executor's status)\n"
    "\n"
    "Calls carry the job token from --token_file, or from the file beside a daemon's\n"
    "--store_file (--store_file FILE reads FILE.token); --tls_ca, --tls_cert and --tls_key\n"
    "for a daemon that serves TLS (docs/security.md).";

// A median prediction error above this gets a hint in `status`.
constexpr double kFarOffPredictionError = 0.5;

int Fail(const std::string& what, const grpc::Status& s) {
  std::fprintf(stderr, "varipipe-ctl: %s: %s (%d)\n", what.c_str(), s.error_message().c_str(),
               static_cast<int>(s.error_code()));
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ? varipipe::kExitFailure
                                                         : varipipe::kExitFailure;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
  return context;
}

// A channel carrying the job token (and TLS when asked), or nullptr after
// printing why not.
std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  absl::StatusOr<std::string> token =
      varipipe::ClientJobToken(absl::GetFlag(FLAGS_token_file), absl::GetFlag(FLAGS_store_file));
  if (!token.ok()) {
    std::fprintf(stderr, "varipipe-ctl: %s\n", std::string(token.status().message()).c_str());
    return nullptr;
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      varipipe::CreateClientChannel(address,
                                    {.token = *token,
                                     .tls = {.cert_file = absl::GetFlag(FLAGS_tls_cert),
                                             .key_file = absl::GetFlag(FLAGS_tls_key),
                                             .ca_file = absl::GetFlag(FLAGS_tls_ca),
                                             .force = absl::GetFlag(FLAGS_tls)}},
                                    channel_args);
  if (!channel.ok()) {
    std::fprintf(stderr, "varipipe-ctl: %s\n", std::string(channel.status().message()).c_str());
    return nullptr;
  }
  return *channel;
}

// An executor's StatusService and health service; exits 1 unless SERVING.
int ExecutorStatus(const std::string& address) {
  auto channel = Channel(address);
  if (channel == nullptr) return varipipe::kExitUsage;
  auto status = varipipe::v1::StatusService::NewStub(channel);
  varipipe::v1::ExecutorStatus e;
  grpc::Status s = status->GetExecutorStatus(Context().get(), {}, &e);
  if (!s.ok()) return Fail(absl::StrCat("executor status at ", address), s);
  // grpc.health.v1.Health/Check with an empty request (the whole server);
  // SERVING encodes as the bytes 08 01.
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty(std::string(""));
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status call) { done.set_value(call); });
  const grpc::Status health = done.get_future().get();
  std::string bytes;
  std::vector<grpc::Slice> slices;
  if (health.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  const bool serving = bytes == std::string("\x08\x01", 2);
  std::printf("executor rank %d (dp %d, pp %d) of job %s on %s: %s\n", e.rank(), e.dp_rank(),
              e.pp_rank(), e.job_id().c_str(), e.device().c_str(),
              serving ? "SERVING" : "NOT SERVING");
  std::printf("  iteration %llu, last loss %.4f, %.0f tokens/s, memory %.1f MiB (peak %.1f MiB)\n",
              static_cast<unsigned long long>(e.iteration()), e.last_loss(), e.tokens_per_second(),
              static_cast<double>(e.memory_allocated_bytes()) / 1048576.0,
              static_cast<double>(e.peak_memory_bytes()) / 1048576.0);
  if (!e.current_instruction_text().empty()) {
    std::printf("  in instruction #%u for %.3f s: %s\n", e.current_instruction(),
                e.current_instruction_s(), e.current_instruction_text().c_str());
  } else {
    std::printf("  between iterations\n");
  }
  return serving ? varipipe::kExitOk : varipipe::kExitFailure;
}

// The job's cost model and, when the predictions are far off, why they may
// be (common/config/cost_model_device.h). Nothing when GetJob fails.
void PrintCostModel(varipipe::v1::PlanService::Stub& plans, const std::string& job,
                    const varipipe::v1::PlannerStatus& planner) {
  varipipe::v1::GetJobRequest request;
  request.set_job_id(job);
  varipipe::v1::GetJobResponse response;
  if (!plans.GetJob(Context().get(), request, &response).ok()) return;
  const varipipe::CostModelDevice device = varipipe::CostModelDeviceOf(response.config());
  std::printf("  cost model: %s\n", device.source.c_str());
  if (planner.prediction_error_iterations() > 0 &&
      planner.prediction_error_p50() > kFarOffPredictionError) {
    std::printf(
        "  the predictions are off by %.0f%%: does the cost model describe the executors' "
        "device? %s\n",
        100 * planner.prediction_error_p50(), varipipe::HowToProfile().c_str());
  }
}

int PlannerStatusCommand(varipipe::v1::StatusService::Stub& status,
                         varipipe::v1::PlanService::Stub& plans, const std::string& job) {
  varipipe::v1::PlannerStatus planner;
  grpc::Status s = status.GetPlannerStatus(Context().get(), {}, &planner);
  if (!s.ok()) return Fail("planner status", s);
  varipipe::v1::GetJobStatusRequest job_request;
  job_request.set_job_id(job);
  varipipe::v1::JobStatus job_status;
  s = status.GetJobStatus(Context().get(), job_request, &job_status);
  if (!s.ok()) return Fail("job status", s);
  std::printf("planner %s on %s: job %s, %u workers (%.0f%% busy), up %.0f s, store %s\n",
              planner.planner_id().c_str(), planner.host().c_str(), planner.job_id().c_str(),
              planner.worker_threads(), 100 * planner.worker_utilization(), planner.uptime_s(),
              planner.store_healthy() ? "healthy" : "UNHEALTHY");
  std::printf("  planned here %llu; published %llu, acknowledged %llu of %llu; queue %u\n",
              static_cast<unsigned long long>(planner.iterations_planned()),
              static_cast<unsigned long long>(planner.iterations_published()),
              static_cast<unsigned long long>(planner.iterations_acknowledged()),
              static_cast<unsigned long long>(job_status.total_iterations()),
              planner.queue_depth());
  std::printf("  plan time p50 %.2f ms, p99 %.2f ms; errors %llu%s%s\n", planner.plan_time_p50_ms(),
              planner.plan_time_p99_ms(), static_cast<unsigned long long>(planner.errors()),
              planner.last_error().empty() ? "" : " (last: ",
              planner.last_error().empty() ? "" : (planner.last_error() + ")").c_str());
  if (planner.prediction_error_iterations() > 0) {
    std::printf("  prediction error p50 %.1f%%, p90 %.1f%% (last %u iterations)\n",
                100 * planner.prediction_error_p50(), 100 * planner.prediction_error_p90(),
                planner.prediction_error_iterations());
  } else {
    std::printf("  prediction error: no iteration reported yet\n");
  }
  PrintCostModel(plans, job, planner);
  std::printf("  calibration version %llu (%llu iterations): %s\n",
              static_cast<unsigned long long>(planner.calibration().version()),
              static_cast<unsigned long long>(planner.calibration().iterations()),
              planner.calibration_scales().c_str());
  std::printf("  executors: %d ranks reported, %.0f tokens/s\n", job_status.ranks_size(),
              job_status.tokens_per_second());
  for (const auto& r : job_status.ranks()) {
    std::printf("    rank %d: iteration %llu, loss %.4f, %.0f tokens/s\n", r.rank(),
                static_cast<unsigned long long>(r.last_iteration()), r.last_loss(),
                r.tokens_per_second());
  }
  return varipipe::kExitOk;
}

int PlanCommand(varipipe::v1::PlanService::Stub& plans, const std::string& job) {
  varipipe::v1::GetPlanRequest request;
  request.set_job_id(job);
  request.set_iteration(absl::GetFlag(FLAGS_iteration));
  request.set_rank(absl::GetFlag(FLAGS_rank));
  varipipe::v1::PlanEnvelope envelope;
  grpc::Status s = plans.GetPlan(Context().get(), request, &envelope);
  if (!s.ok()) return Fail("plan", s);
  const varipipe::v1::ExecutionPlan& plan = envelope.plan();
  std::printf(
      "iteration %llu rank %d (dp %d, pp %d): %d micro-batches, schedule %s, %s, "
      "recompute %s, predicted %.2f ms, planned by %s in %.2f ms\n",
      static_cast<unsigned long long>(plan.iteration()), plan.rank(), plan.dp_rank(),
      plan.pp_rank(), plan.micro_batches_size(), plan.schedule().c_str(),
      plan.partition_method().c_str(), plan.recompute().c_str(), plan.predicted_iteration_ms(),
      envelope.planner_id().c_str(), envelope.planning_ms());
  for (const auto& mb : plan.micro_batches()) {
    std::printf("  micro-batch %u: %d samples, padded %u%s\n", mb.id(), mb.sample_ids_size(),
                mb.input_len(),
                mb.target_len() ? absl::StrFormat("+%u", mb.target_len()).c_str() : "");
  }
  for (int i = 0; i < plan.instructions_size(); ++i) {
    std::printf("%4d: %s\n", i,
                varipipe::plan_contract::FormatInstruction(plan.instructions(i)).c_str());
  }
  return varipipe::kExitOk;
}

int TraceCommand(varipipe::v1::StatusService::Stub& status, const std::string& job) {
  varipipe::v1::GetTraceRequest request;
  request.set_job_id(job);
  request.set_iteration(absl::GetFlag(FLAGS_iteration));
  varipipe::v1::TraceResponse trace;
  grpc::Status s = status.GetTrace(Context().get(), request, &trace);
  if (!s.ok()) return Fail("trace", s);
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::fputs(trace.chrome_trace_json().c_str(), stdout);
  } else {
    std::ofstream(absl::GetFlag(FLAGS_out)) << trace.chrome_trace_json();
    std::fprintf(stderr, "wrote %s\n", absl::GetFlag(FLAGS_out).c_str());
  }
  return varipipe::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = varipipe::InitBinary(argc, argv, "varipipe-ctl", kUsage);
  if (args.size() != 1 ||
      (args[0] != "status" && args[0] != "plan" && args[0] != "trace" && args[0] != "executor")) {
    std::fprintf(stderr,
                 "varipipe-ctl: expected one command: status, plan, trace or executor (try "
                 "--help)\n");
    return varipipe::kExitUsage;
  }
  if (args[0] == "executor") {
    if (absl::GetFlag(FLAGS_address).empty()) {
      std::fprintf(stderr, "varipipe-ctl: executor needs --address host:port\n");
      return varipipe::kExitUsage;
    }
    return ExecutorStatus(absl::GetFlag(FLAGS_address));
  }
  auto channel = Channel(absl::GetFlag(FLAGS_planner));
  if (channel == nullptr) return varipipe::kExitUsage;
  auto plans = varipipe::v1::PlanService::NewStub(channel);
  auto status = varipipe::v1::StatusService::NewStub(channel);
  const std::string job = absl::GetFlag(FLAGS_job);
  if (args[0] == "status") return PlannerStatusCommand(*status, *plans, job);
  if (args[0] == "plan") return PlanCommand(*plans, job);
  return TraceCommand(*status, job);
}
