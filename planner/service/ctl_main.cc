// varipipe-ctl: talks to planner daemons over gRPC.
//   status                          planner and job status
//   plan --iteration N --rank R     a rank's plan, one instruction per line
//   trace --iteration N [--out F]   Chrome trace of the predicted timeline
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/binary_main.h"
#include "grpcpp/grpcpp.h"
#include "planner/plan/validator.h"
#include "varipipe/v1/service.grpc.pb.h"

ABSL_FLAG(std::string, planner, "127.0.0.1:50051", "Planner daemon address (host:port).");
ABSL_FLAG(std::string, job, "", "Job id (default: the daemon's job).");
ABSL_FLAG(int64_t, iteration, 0, "Iteration for 'plan' and 'trace'.");
ABSL_FLAG(int, rank, 0, "Rank for 'plan'.");
ABSL_FLAG(std::string, out, "", "Output file for 'trace' (default: standard output).");
ABSL_FLAG(int, timeout_s, 30, "Seconds to wait for an answer (a plan may not be published yet).");

namespace {

constexpr char kUsage[] =
    "Queries a Varipipe planner daemon.\n"
    "\n"
    "Usage: varipipe-ctl [--planner host:port] status\n"
    "       varipipe-ctl [--planner host:port] plan --iteration N --rank R\n"
    "       varipipe-ctl [--planner host:port] trace --iteration N [--out trace.json]";

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

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = varipipe::InitBinary(argc, argv, "varipipe-ctl", kUsage);
  if (args.size() != 1 || (args[0] != "status" && args[0] != "plan" && args[0] != "trace")) {
    std::fprintf(stderr,
                 "varipipe-ctl: expected one command: status, plan or trace (try --help)\n");
    return varipipe::kExitUsage;
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_planner),
                                           grpc::InsecureChannelCredentials(), channel_args);
  auto plans = varipipe::v1::PlanService::NewStub(channel);
  auto status = varipipe::v1::StatusService::NewStub(channel);
  const std::string job = absl::GetFlag(FLAGS_job);
  if (args[0] == "status") {
    varipipe::v1::PlannerStatus planner;
    grpc::Status s = status->GetPlannerStatus(Context().get(), {}, &planner);
    if (!s.ok()) return Fail("planner status", s);
    varipipe::v1::GetJobStatusRequest job_request;
    job_request.set_job_id(job);
    varipipe::v1::JobStatus job_status;
    s = status->GetJobStatus(Context().get(), job_request, &job_status);
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
    std::printf("  plan time p50 %.2f ms, p99 %.2f ms; errors %llu%s%s\n",
                planner.plan_time_p50_ms(), planner.plan_time_p99_ms(),
                static_cast<unsigned long long>(planner.errors()),
                planner.last_error().empty() ? "" : " (last: ",
                planner.last_error().empty() ? "" : (planner.last_error() + ")").c_str());
    std::printf("  executors: %d ranks reported, %.0f tokens/s\n", job_status.ranks_size(),
                job_status.tokens_per_second());
    for (const auto& r : job_status.ranks()) {
      std::printf("    rank %d: iteration %llu, loss %.4f, %.0f tokens/s\n", r.rank(),
                  static_cast<unsigned long long>(r.last_iteration()), r.last_loss(),
                  r.tokens_per_second());
    }
    return varipipe::kExitOk;
  }
  if (args[0] == "plan") {
    varipipe::v1::GetPlanRequest request;
    request.set_job_id(job);
    request.set_iteration(absl::GetFlag(FLAGS_iteration));
    request.set_rank(absl::GetFlag(FLAGS_rank));
    varipipe::v1::PlanEnvelope envelope;
    grpc::Status s = plans->GetPlan(Context().get(), request, &envelope);
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
                  varipipe::planner::FormatInstruction(plan.instructions(i)).c_str());
    }
    return varipipe::kExitOk;
  }
  varipipe::v1::GetTraceRequest request;
  request.set_job_id(job);
  request.set_iteration(absl::GetFlag(FLAGS_iteration));
  varipipe::v1::TraceResponse trace;
  grpc::Status s = status->GetTrace(Context().get(), request, &trace);
  if (!s.ok()) return Fail("trace", s);
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::fputs(trace.chrome_trace_json().c_str(), stdout);
  } else {
    std::ofstream(absl::GetFlag(FLAGS_out)) << trace.chrome_trace_json();
    std::fprintf(stderr, "wrote %s\n", absl::GetFlag(FLAGS_out).c_str());
  }
  return varipipe::kExitOk;
}
