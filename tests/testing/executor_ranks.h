// Real executor and planner daemon processes for integration tests: ranks
// get RANK/WORLD_SIZE/LOCAL_RANK as torchrun would set them, write their logs
// to DIR/rank<r>.log, their pid to DIR/rank<r>.pid and, once they exit, their
// exit status to DIR/rank<r>.exit. Every process is SIGKILLed after 300 s, so
// a failing test never leaves one behind for long (the pid files name the
// processes themselves, so tests can signal them).
#ifndef VARIPIPE_TESTS_TESTING_EXECUTOR_RANKS_H_
#define VARIPIPE_TESTS_TESTING_EXECUTOR_RANKS_H_

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/testing/command.h"

namespace varipipe::testing {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::filesystem::path FreshDirectory(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("varipipe-", name, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A small integer a process wrote to `path` (pid, port, exit status).
inline std::optional<int> ReadNumber(const std::filesystem::path& path) {
  int value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(path)), &value)) return std::nullopt;
  return value;
}

inline std::string RankLogs(const std::filesystem::path& dir, int ranks) {
  std::string logs;
  for (int r = 0; r < ranks; ++r) {
    absl::StrAppend(&logs, "--- rank ", r, "\n", ReadFile(dir / absl::StrCat("rank", r, ".log")));
  }
  return logs;
}

// A shell fragment that SIGKILLs process `pid` after 300 s unless it exited
// (it polls, so nothing of it outlives the process by more than a second).
inline std::string KillLater(const std::string& pid) {
  return absl::StrCat("(i=0; while kill -0 ", pid, " 2>/dev/null; do i=$((i+1)); ",
                      "[ $i -gt 300 ] && kill -9 ", pid,
                      " 2>/dev/null; sleep 1; done) < /dev/null > /dev/null 2>&1 &");
}

// Starts `ranks` executor processes with `flags` in `dir` in the background
// (the Redis password in the environment variable the test configs name).
inline void StartRanks(const std::filesystem::path& dir, int ranks, const std::string& password,
                       const std::string& flags) {
  for (int r = 0; r < ranks; ++r) {
    std::filesystem::remove(dir / absl::StrCat("rank", r, ".exit"));
    std::filesystem::remove(dir / absl::StrCat("rank", r, ".pid"));
  }
  // Status endpoints on free loopback ports unless the test chooses.
  const std::string status_flags =
      absl::StrContains(flags, "--status_port") ? "" : " --status_port 0 --status_host 127.0.0.1";
  RunCommand(absl::StrCat(
      "cd '", dir.string(), "' && export VARIPIPE_TEST_REDIS_PASSWORD='", password,
      "'; for r in $(seq 0 ", ranks - 1, "); do (RANK=$r WORLD_SIZE=", ranks, " LOCAL_RANK=$r ",
      Bin("varipipe-executor"), " ", flags, status_flags, " > rank$r.log 2>&1 & pid=$!; ",
      KillLater("$pid"),
      " echo $pid > rank$r.pid; wait $pid; echo $? > rank$r.exit) > /dev/null 2>&1 & done"));
  // The pid files exist once every rank started (up to a minute on a loaded
  // machine).
  for (int i = 0; i < 3000; ++i) {
    bool all = true;
    for (int r = 0; r < ranks; ++r) {
      all = all && ReadNumber(dir / absl::StrCat("rank", r, ".pid")).has_value();
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Starts only rank `rank` of `world` with `flags` in `dir`, as StartRanks
// starts each (its files are rank<rank>.*); returns once its pid file exists.
inline void StartRank(const std::filesystem::path& dir, int rank, int world,
                      const std::string& password, const std::string& flags) {
  const std::string name = absl::StrCat("rank", rank);
  std::filesystem::remove(dir / (name + ".exit"));
  std::filesystem::remove(dir / (name + ".pid"));
  const std::string status_flags =
      absl::StrContains(flags, "--status_port") ? "" : " --status_port 0 --status_host 127.0.0.1";
  RunCommand(absl::StrCat("cd '", dir.string(), "' && export VARIPIPE_TEST_REDIS_PASSWORD='",
                          password, "'; (RANK=", rank, " WORLD_SIZE=", world, " LOCAL_RANK=", rank,
                          " ", Bin("varipipe-executor"), " ", flags, status_flags, " > ", name,
                          ".log 2>&1 & pid=$!; ", KillLater("$pid"), " echo $pid > ", name,
                          ".pid; wait $pid; echo $? > ", name, ".exit) > /dev/null 2>&1 &"));
  for (int i = 0; i < 3000 && !ReadNumber(dir / (name + ".pid")).has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Exit status of rank `r` once it exited, nullopt while it runs.
inline std::optional<int> RankExit(const std::filesystem::path& dir, int r) {
  return ReadNumber(dir / absl::StrCat("rank", r, ".exit"));
}

// Waits for every rank to exit (at most `timeout`); 0 when all exited 0.
inline int WaitForRanks(const std::filesystem::path& dir, int ranks,
                        std::chrono::seconds timeout = std::chrono::seconds(300)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int exited = 0;
    int rc = 0;
    for (int r = 0; r < ranks; ++r) {
      if (std::optional<int> e = RankExit(dir, r)) {
        ++exited;
        if (*e != 0) rc = 1;
      }
    }
    if (exited == ranks) return rc;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

// Starts `ranks` executors and waits for all; the exit status (0 when every
// rank exited 0) and the ranks' logs.
inline CommandResult LaunchRanks(const std::filesystem::path& dir, int ranks,
                                 const std::string& password, const std::string& flags) {
  StartRanks(dir, ranks, password, flags);
  CommandResult result;
  result.exit_code = WaitForRanks(dir, ranks);
  result.output = RankLogs(dir, ranks);
  return result;
}

// Starts a planner daemon in `dir` with `flags` (--config ... ) listening on
// a free loopback port; `name` names its log, pid and port files. Returns the
// address "127.0.0.1:PORT", or "" when it did not come up (see NAME.log).
inline std::string StartPlannerDaemon(const std::filesystem::path& dir, const std::string& name,
                                      const std::string& password, const std::string& flags) {
  RunCommand(absl::StrCat("cd '", dir.string(), "' && export VARIPIPE_TEST_REDIS_PASSWORD='",
                          password, "' && (", Bin("varipipe-planner"), " ", flags,
                          " --listen 127.0.0.1:0 --port_file ", name, ".port > ", name,
                          ".log 2>&1 & pid=$!; ", KillLater("$pid"), " echo $pid > ", name,
                          ".pid) > /dev/null 2>&1"));
  for (int i = 0; i < 2400; ++i) {  // up to 2 minutes on a loaded machine
    if (std::optional<int> port = ReadNumber(dir / (name + ".port")); port && *port > 0) {
      return absl::StrCat("127.0.0.1:", *port);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

// Sends `signal` to the process whose pid is in DIR/NAME.pid.
inline void Signal(const std::filesystem::path& dir, const std::string& name, int signal) {
  if (std::optional<int> pid = ReadNumber(dir / (name + ".pid"))) ::kill(*pid, signal);
}

// " --token_file 'DIR/token'": the job token every daemon and executor of a
// test shares (docs/security.md), written once as a 0600 file in DIR.
inline std::string TokenFileFlag(const std::filesystem::path& dir) {
  const std::filesystem::path token = dir / "token";
  if (!std::filesystem::exists(token)) {
    std::ofstream(token) << "test-token-0123456789abcdef0123456789abcdef\n";
    std::filesystem::permissions(
        token, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  return absl::StrCat(" --token_file '", token.string(), "'");
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_EXECUTOR_RANKS_H_
