// varipipe-planner: the planner daemon (planner/service/planner_daemon.h).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth/job_token.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/logging.h"
#include "common/secret_file.h"
#include "common/shutdown_signal.h"
#include "planner/service/planner_daemon.h"
#include "planner/service/planner_metrics.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(bool, check_config, false,
          "Validate the config, print it with defaults filled in, and exit 0.");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address (host:port; port 0 picks a free one). Loopback by default: give "
          "this host's address (or 0.0.0.0) for executors on other hosts. A port another "
          "process holds is an error.");
ABSL_FLAG(int, max_calls, 1024,
          "Most GetPlan/WatchPlans calls waiting at once (two per executor rank served); "
          "more get RESOURCE_EXHAUSTED. Bounds the server's threads and store connections.");
ABSL_FLAG(int, threads, 0, "Planning worker threads (0: planner.threads, else cores - 1).");
ABSL_FLAG(std::string, port_file, "",
          "Write the gRPC port to this file once ready to serve (for scripts; written after the "
          "--store_file files). The port itself is bound first, before the slow start-up.");
ABSL_FLAG(std::string, store_file, "",
          "Write 'host:port password' of the instruction store to this file, and the job token "
          "to FILE.token, both created with mode 0600, once serving: how local executors and "
          "varipipe-ctl find an embedded redis-server and the token.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the job token clients must present (first line; not readable by other "
          "users). Default: the token the store holds for the job, generated at registration.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates: require client certificates signed by them (mutual TLS).");
ABSL_FLAG(int, progress_interval_s, 10, "Seconds between progress lines (0: none).");
ABSL_FLAG(int, lease_ms, 30000,
          "How long a claimed iteration stays reserved for this daemon; a crashed daemon's "
          "claims are taken over after it.");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT: 127.0.0.1; port 0: "
          "a free one, logged). Empty: no metrics endpoint (docs/operations.md).");
ABSL_FLAG(bool, exit_when_done, false,
          "Exit once every iteration of the job is published (instead of serving until "
          "SIGTERM).");
ABSL_FLAG(bool, keep_serving, false,
          "Keep serving after the job is complete (every executor rank reported its last "
          "iteration), e.g. for varipipe-ctl status, trace and plan, until SIGTERM. Without it "
          "the daemon logs \"job complete\" and exits 0 then; each of several daemons sharing "
          "a job does so on its own.");

namespace {

constexpr char kUsage[] =
    "The Varipipe planner daemon: plans training iterations ahead of the executors,\n"
    "publishes the execution plans into the Redis instruction store and serves them\n"
    "over gRPC (PlanService, StatusService, health, reflection).\n"
    "\n"
    "Usage: varipipe-planner --config job.json [--listen 127.0.0.1:50051] [--threads N]\n"
    "                        [--token_file FILE] [--tls_cert F --tls_key F [--tls_ca F]]\n"
    "\n"
    "With an empty store.redis_address the daemon starts a private redis-server\n"
    "(single-machine mode). Several daemons (on several hosts) with the same config and\n"
    "store share a job. Calls must carry the job's token (docs/security.md).\n"
    "Once every executor rank reported the job's last iteration the daemon logs\n"
    "\"job complete\" and exits 0 (--keep_serving: serves on). SIGTERM or SIGINT\n"
    "stops it gracefully.";

// How long a stop requested during start-up may take: Initialize() stops at
// its next step, but one step may block longer (an unreachable Redis, a large
// dataset).
constexpr absl::Duration kStartupStopGrace = absl::Seconds(2);

// Watches start-up for SIGTERM/SIGINT: asks the daemon to stop at its next
// start-up step at once, and ends the process (128 + signal) if start-up is
// still running kStartupStopGrace later. Destroy it once start-up returned.
class StartupGuard {
 public:
  StartupGuard(varipipe::ShutdownSignal& shutdown, varipipe::service::PlannerDaemon* daemon)
      : shutdown_(shutdown), daemon_(daemon) {
    subscription_ = shutdown.OnShutdown([this] {
      daemon_->CancelStartup();
      absl::MutexLock lock(&mu_);
      requested_ = true;
    });
    thread_ = std::thread([this] { Watch(); });
  }
  ~StartupGuard() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
    subscription_.reset();
  }
  StartupGuard(const StartupGuard&) = delete;
  StartupGuard& operator=(const StartupGuard&) = delete;

 private:
  void Watch() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &StartupGuard::DoneOrRequested));
    if (done_ || mu_.AwaitWithTimeout(absl::Condition(&done_), kStartupStopGrace)) return;
    const int signal_number = shutdown_.signal_number() != 0 ? shutdown_.signal_number() : SIGTERM;
    spdlog::error(
        "start-up did not stop within {} of the signal (still {}); exiting now with status {}",
        absl::FormatDuration(kStartupStopGrace), daemon_->startup_step(), 128 + signal_number);
    spdlog::default_logger()->flush();
    std::_Exit(128 + signal_number);
  }

  bool DoneOrRequested() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || requested_; }

  varipipe::ShutdownSignal& shutdown_;
  varipipe::service::PlannerDaemon* const daemon_;
  absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<varipipe::ShutdownSignal::Subscription> subscription_;
  std::thread thread_;
};

int ExitCodeFor(const absl::Status& status) {
  return absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status)
             ? varipipe::kExitUsage
             : varipipe::kExitFailure;
}

// Writes `text` to `path` through a temporary file and a rename, so a reader
// never sees it half-written.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string temporary = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", temporary));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", temporary, " to ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

// The daemon's options from the flags; the token file checked.
absl::StatusOr<varipipe::service::DaemonOptions> DaemonOptionsFromFlags() {
  varipipe::service::DaemonOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.worker_threads = absl::GetFlag(FLAGS_threads);
  options.max_calls = absl::GetFlag(FLAGS_max_calls);
  options.progress_interval = absl::Seconds(absl::GetFlag(FLAGS_progress_interval_s));
  options.lease = absl::Milliseconds(std::max(100, absl::GetFlag(FLAGS_lease_ms)));
  options.tls = {.cert_file = absl::GetFlag(FLAGS_tls_cert),
                 .key_file = absl::GetFlag(FLAGS_tls_key),
                 .ca_file = absl::GetFlag(FLAGS_tls_ca)};
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    absl::StatusOr<std::string> token = varipipe::ReadSecretFile(file, "--token_file");
    absl::Status valid =
        token.ok() ? varipipe::CheckJobToken(*token, "--token_file " + file) : token.status();
    if (!valid.ok()) return valid;
    options.token = *token;
  }
  return options;
}

// --store_file, with the token file beside it first: a reader that sees the
// store file finds both.
absl::Status WriteStoreFiles(const varipipe::service::PlannerDaemon& daemon) {
  const std::string file = absl::GetFlag(FLAGS_store_file);
  if (file.empty()) return absl::OkStatus();
  absl::Status s =
      varipipe::WriteSecretFile(varipipe::TokenFileBeside(file), daemon.token() + "\n");
  if (!s.ok()) return s;
  return varipipe::WriteSecretFile(
      file, absl::StrCat(daemon.store_address(), " ", daemon.store_password(), "\n"));
}

// Serves until a signal or the end the flags choose: every iteration
// published (--exit_when_done), else the job complete (unless
// --keep_serving, which only logs it); then shuts down.
void Serve(varipipe::ShutdownSignal& shutdown, varipipe::service::PlannerDaemon& daemon) {
  std::thread waiter([&] {
    if (absl::GetFlag(FLAGS_exit_when_done)) {
      daemon.WaitUntilAllPublished();
      shutdown.Request();
      return;
    }
    if (!daemon.WaitUntilJobComplete()) return;  // shut down first
    if (absl::GetFlag(FLAGS_keep_serving)) {
      spdlog::info("serving on (--keep_serving) until SIGTERM");
      return;
    }
    spdlog::info("exiting (--keep_serving keeps the daemon serving after the job)");
    shutdown.Request();
  });
  shutdown.WaitFor(absl::InfiniteDuration());
  daemon.Shutdown();
  waiter.join();
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-planner", kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-planner: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) {
    std::fprintf(stderr, "varipipe-planner: --config is required (try --help)\n");
    return varipipe::kExitUsage;
  }
  absl::StatusOr<varipipe::v1::JobConfig> config = varipipe::LoadJobConfigFile(path);
  if (!config.ok()) {
    std::fprintf(stderr, "varipipe-planner: %s\n", std::string(config.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_check_config)) {
    std::printf("%s\n", varipipe::JobConfigToJson(*config).c_str());
    return varipipe::kExitOk;
  }
  if (absl::GetFlag(FLAGS_exit_when_done) && absl::GetFlag(FLAGS_keep_serving)) {
    std::fprintf(stderr,
                 "varipipe-planner: --exit_when_done and --keep_serving contradict each other\n");
    return varipipe::kExitUsage;
  }
  varipipe::ShutdownSignal shutdown;
  absl::StatusOr<varipipe::service::DaemonOptions> options = DaemonOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "varipipe-planner: %s\n", std::string(options.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  // The port first: a taken one fails here, in milliseconds; calls get
  // UNAVAILABLE ("starting: ...") until Initialize() is done.
  absl::StatusOr<std::unique_ptr<varipipe::service::PlannerDaemon>> daemon =
      varipipe::service::PlannerDaemon::Bind(*config, *options);
  if (!daemon.ok()) {
    spdlog::error("cannot start: {}", daemon.status().message());
    return ExitCodeFor(daemon.status());
  }
  absl::Status initialized;
  {
    const StartupGuard guard(shutdown, daemon->get());
    initialized = (*daemon)->Initialize();
  }
  if (!initialized.ok()) {
    (*daemon)->Shutdown();
    if (shutdown.Requested()) {
      spdlog::info("stopped during start-up ({})", initialized.message());
      return varipipe::kExitOk;
    }
    spdlog::error("cannot start: {}", initialized.message());
    return ExitCodeFor(initialized);
  }
  if (shutdown.Requested()) {  // the signal came after the last start-up step
    (*daemon)->Shutdown();
    return varipipe::kExitOk;
  }
  if (absl::Status s = WriteStoreFiles(**daemon); !s.ok()) {
    spdlog::error("--store_file: {}", s.message());
    (*daemon)->Shutdown();
    return varipipe::kExitFailure;
  }
  absl::StatusOr<std::unique_ptr<varipipe::service::PlannerMetricsEndpoint>> metrics =
      varipipe::service::PlannerMetricsEndpoint::Start(absl::GetFlag(FLAGS_metrics_listen),
                                                       daemon->get());
  if (!metrics.ok()) {
    spdlog::error("{}", metrics.status().message());
    (*daemon)->Shutdown();
    return varipipe::kExitUsage;
  }
  // The port file last: once it exists, the store and token files do too,
  // and the daemon serves.
  if (const std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    if (absl::Status s = WriteFileAtomically(file, absl::StrCat((*daemon)->port(), "\n"));
        !s.ok()) {
      spdlog::error("--port_file: {}", s.message());
      (*daemon)->Shutdown();
      return varipipe::kExitFailure;
    }
  }
  Serve(shutdown, **daemon);
  return varipipe::kExitOk;
}
