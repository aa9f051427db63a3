// varipipe-planner: the planner daemon (planner/service/planner_daemon.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
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
          "Write the gRPC port to this file once serving (for scripts; written after the "
          "--store_file files).");
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
    "SIGTERM or SIGINT stops it gracefully.";

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
  varipipe::ShutdownSignal shutdown;
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
    if (!valid.ok()) {
      std::fprintf(stderr, "varipipe-planner: %s\n", std::string(valid.message()).c_str());
      return varipipe::kExitUsage;
    }
    options.token = *token;
  }
  absl::StatusOr<std::unique_ptr<varipipe::service::PlannerDaemon>> daemon =
      varipipe::service::PlannerDaemon::Start(*config, options);
  if (!daemon.ok()) {
    spdlog::error("cannot start: {}", daemon.status().message());
    return absl::IsInvalidArgument(daemon.status()) || absl::IsFailedPrecondition(daemon.status())
               ? varipipe::kExitUsage
               : varipipe::kExitFailure;
  }
  if (const std::string file = absl::GetFlag(FLAGS_store_file); !file.empty()) {
    // The token file first: a reader that sees the store file finds both.
    absl::Status s =
        varipipe::WriteSecretFile(varipipe::TokenFileBeside(file), (*daemon)->token() + "\n");
    if (s.ok()) {
      s = varipipe::WriteSecretFile(
          file, absl::StrCat((*daemon)->store_address(), " ", (*daemon)->store_password(), "\n"));
    }
    if (!s.ok()) {
      spdlog::error("--store_file: {}", s.message());
      (*daemon)->Shutdown();
      return varipipe::kExitFailure;
    }
  }
  absl::StatusOr<std::unique_ptr<varipipe::service::PlannerMetricsEndpoint>> metrics =
      varipipe::service::PlannerMetricsEndpoint::Start(absl::GetFlag(FLAGS_metrics_listen),
                                                       daemon->get());
  if (!metrics.ok()) {
    spdlog::error("{}", metrics.status().message());
    (*daemon)->Shutdown();
    return varipipe::kExitUsage;
  }
  // The port file last: once it exists, the store and token files do too.
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_port_file)) << (*daemon)->port() << "\n";
  }
  if (absl::GetFlag(FLAGS_exit_when_done)) {
    std::thread waiter([&] {
      (*daemon)->WaitUntilAllPublished();
      shutdown.Request();
    });
    shutdown.WaitFor(absl::InfiniteDuration());
    (*daemon)->Shutdown();
    waiter.join();
  } else {
    shutdown.WaitFor(absl::InfiniteDuration());
    (*daemon)->Shutdown();
  }
  return varipipe::kExitOk;
}
