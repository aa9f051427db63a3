// A varipipe-planner process for tests: started with fork/exec in a test
// directory (standard error to NAME.log, the port to NAME.port), waited for by
// polling with deadlines, and always killed when the object goes away.
//
//   auto daemon = PlannerProcess::Spawn(dir, "a", {"--config", config});
//   const int port = daemon->WaitForPort();  // 0: it exited or never served
#ifndef VARIPIPE_TESTS_TESTING_PLANNER_PROCESS_H_
#define VARIPIPE_TESTS_TESTING_PLANNER_PROCESS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace varipipe::testing {

class PlannerProcess {
 public:
  // Runs bin/varipipe-planner ARGS --port_file DIR/NAME.port
  // --progress_interval_s 0 (no --listen unless ARGS has one).
  static std::unique_ptr<PlannerProcess> Spawn(const std::filesystem::path& dir,
                                               const std::string& name,
                                               std::vector<std::string> args) {
    std::unique_ptr<PlannerProcess> p(new PlannerProcess());
    p->log_ = dir / (name + ".log");
    p->port_file_ = dir / (name + ".port");
    std::filesystem::remove(p->port_file_);
    const std::string bin = absl::StrCat(VARIPIPE_BINARY_DIR, "/bin/varipipe-planner");
    args.insert(args.begin(), bin);
    args.insert(args.end(), {"--port_file", p->port_file_.string(), "--progress_interval_s", "0"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = p->log_.string();
    p->pid_ = fork();
    if (p->pid_ == 0) {
      if (std::freopen(log.c_str(), "w", stderr) == nullptr) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return p;
  }

  ~PlannerProcess() {
    if (pid_ > 0 && !exit_code_.has_value()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The gRPC port once the daemon serves; 0 when it exited first or the
  // deadline passed (a loaded machine may need a minute or two).
  int WaitForPort(absl::Duration timeout = absl::Minutes(2)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::ifstream in(port_file_);
      int port = 0;
      if (in >> port && port > 0) return port;
      if (Exited()) return 0;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return 0;
  }

  // The exit code (128 + signal when killed) once it exited within
  // `timeout`; nullopt while it runs.
  std::optional<int> WaitForExit(absl::Duration timeout = absl::Minutes(2)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!Exited() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    return exit_code_;
  }

  // SIGTERM, then the exit code.
  std::optional<int> Stop() {
    if (!exit_code_.has_value()) kill(pid_, SIGTERM);
    return WaitForExit();
  }

 private:
  PlannerProcess() = default;
  bool Exited() {
    if (exit_code_.has_value()) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::filesystem::path log_;
  std::filesystem::path port_file_;
};

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_PLANNER_PROCESS_H_
