// A private redis-server process: started on a free loopback port with a
// random password and no persistence, stopped (and its files removed) when
// the object is destroyed. The planner daemon's single-machine mode and the
// tests' Redis fixture use it. The server reads its configuration, password
// included, from standard input ("redis-server -"): its command line, which
// every local user can read, holds no secret.
//
//   absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
//   if (!redis.ok()) return redis.status();
//   ... connect to (*redis)->host(), (*redis)->port() with (*redis)->password()
//
// The server process is killed when the thread that called Start() exits
// (PR_SET_PDEATHSIG follows the starting thread), so a crashed test leaves
// nothing running. It starts with no blocked signals and default signal
// dispositions, whatever the caller's (e.g. SIGTERM blocked by
// ShutdownSignal), so Stop()'s SIGTERM ends it at once. The binary is the
// one CMake found at configure time, else `redis-server` on PATH
// (VARIPIPE_REDIS_SERVER overrides both).
//
// Thread safety: call Start() from a thread that outlives the server (the
// test's main thread); the accessors may be used from any thread.
#ifndef VARIPIPE_COMMON_REDIS_REDIS_SERVER_PROCESS_H_
#define VARIPIPE_COMMON_REDIS_REDIS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varipipe {

class RedisServer {
 public:
  struct Options {
    // Empty: a random 32-character password.
    std::string password;
    // 0: a free loopback port.
    int port = 0;
    // Time allowed for the server to answer PING.
    absl::Duration startup_timeout = absl::Seconds(10);
  };

  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(Options options);
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start() { return Start(Options()); }

  // Stops the server (SIGTERM, then SIGKILL after 5 s) and removes its
  // directory.
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // "127.0.0.1:PORT".
  std::string address() const;
  const std::string& password() const { return password_; }
  pid_t pid() const { return pid_; }
  // The server's version as it reports it in INFO ("7.0.15").
  const std::string& version() const { return version_; }
  // Contents of the server's log file (for failure messages).
  std::string ReadLog() const;

  // Stops the server now; the destructor then does nothing. Returns an error
  // if it had to be killed or exited with a failure status.
  absl::Status Stop();

 private:
  RedisServer() = default;

  // Waits until the server started as pid_ answers a PING: OK; UNAVAILABLE
  // when it exited (with its log); DEADLINE_EXCEEDED when it is alive but
  // silent past `timeout`.
  absl::Status WaitUntilAnswering(absl::Duration timeout, const std::string& binary);

  std::string host_ = "127.0.0.1";
  int port_ = 0;
  std::string password_;
  std::string directory_;
  std::string version_;
  pid_t pid_ = -1;
};

// A free TCP port on 127.0.0.1 at the time of the call (bound and released).
absl::StatusOr<int> PickFreeLoopbackPort();

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_REDIS_REDIS_SERVER_PROCESS_H_
