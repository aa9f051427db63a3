#include "common/redis/redis_server_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "hiredis/hiredis.h"

#ifndef VARIPIPE_REDIS_SERVER_PATH
#define VARIPIPE_REDIS_SERVER_PATH "redis-server"
#endif

namespace varipipe {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

std::string RandomPassword() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device device;
  std::string password(32, 'x');
  for (char& c : password) c = kAlphabet[device() % (sizeof(kAlphabet) - 1)];
  return password;
}

// A value for redis.conf: double-quoted, every byte but letters, digits and
// a few safe characters as \xHH, so no password or path can end the value.
std::string ConfigString(absl::string_view value) {
  std::string quoted = "\"";
  for (const char c : value) {
    if (absl::ascii_isalnum(c) || c == '/' || c == '.' || c == '-' || c == '_') {
      quoted.push_back(c);
    } else {
      absl::StrAppend(&quoted, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    }
  }
  quoted.push_back('"');
  return quoted;
}

// Connects, authenticates and asks for the server version. Unavailable while
// the server is not yet accepting connections.
absl::StatusOr<std::string> PingAndGetVersion(const std::string& host, int port,
                                              const std::string& password) {
  const timeval timeout{1, 0};
  ContextPtr context(redisConnectWithTimeout(host.c_str(), port, timeout));
  if (context == nullptr || context->err != 0) {
    return absl::UnavailableError(context ? context->errstr : "cannot allocate redis context");
  }
  ReplyPtr auth(static_cast<redisReply*>(redisCommand(context.get(), "AUTH %s", password.c_str())));
  if (auth == nullptr || auth->type == REDIS_REPLY_ERROR) {
    return absl::UnavailableError(
        absl::StrCat("AUTH failed: ", auth ? auth->str : context->errstr));
  }
  ReplyPtr info(static_cast<redisReply*>(redisCommand(context.get(), "INFO server")));
  if (info == nullptr || info->type != REDIS_REPLY_STRING) {
    return absl::UnavailableError("INFO server failed");
  }
  for (absl::string_view line : absl::StrSplit(absl::string_view(info->str, info->len), "\r\n")) {
    if (absl::ConsumePrefix(&line, "redis_version:")) return std::string(line);
  }
  return std::string("unknown");
}

}  // namespace

absl::StatusOr<int> PickFreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoToStatus(error, "bind 127.0.0.1:0");
  }
  close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

namespace {

// The redis-server binary: $VARIPIPE_REDIS_SERVER, else the one found at
// configure time.
std::string RedisServerBinary() {
  const char* binary = std::getenv("VARIPIPE_REDIS_SERVER");
  return binary != nullptr && *binary ? binary : VARIPIPE_REDIS_SERVER_PATH;
}

// Starts `binary -` with `config` on its standard input and returns its pid.
// The configuration, password included, goes through a socket, never the
// command line, which every local user can read in /proc/PID/cmdline. The
// child dies with this process.
absl::StatusOr<pid_t> SpawnWithConfig(std::string binary, const std::string& config) {
  std::string stdin_argument = "-";
  char* argv[] = {binary.data(), stdin_argument.data(), nullptr};
  // A socket pair rather than a pipe: send() with MSG_NOSIGNAL cannot raise
  // SIGPIPE when the server died before reading.
  int config_socket[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, config_socket) != 0) {
    return ErrnoToStatus(errno, "socketpair");
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(config_socket[0]);
    close(config_socket[1]);
    return ErrnoToStatus(error, "fork");
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // The signal mask and ignored signals survive exec: a parent that
    // blocks SIGTERM for sigwait() (ShutdownSignal) would leave the server
    // deaf to Stop()'s SIGTERM, killed only after the 5 s grace. The
    // server gets the defaults.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (const int signal_number : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGUSR1}) {
      sigaction(signal_number, &default_action, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const int devnull = open("/dev/null", O_RDWR);
    dup2(config_socket[0], STDIN_FILENO);  // dup2 clears O_CLOEXEC on the copy
    dup2(devnull, STDOUT_FILENO);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(config_socket[0]);
  // A few hundred bytes: the socket buffer takes them whether or not the
  // server reads yet. A failure (the server died) shows as its exit later.
  for (size_t sent = 0; sent < config.size();) {
    const ssize_t n =
        send(config_socket[1], config.data() + sent, config.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  close(config_socket[1]);
  return pid;
}

}  // namespace

absl::Status RedisServer::WaitUntilAnswering(absl::Duration timeout, const std::string& binary) {
  absl::Status last_error = absl::DeadlineExceededError("no answer yet");
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int wait_status = 0;
    if (waitpid(pid_, &wait_status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat(
          binary, " exited with status ",
          WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status),
          WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 127
              ? " (not found? install it with deploy/install-deps.sh)"
              : "",
          "; log:\n", ReadLog()));
    }
    absl::StatusOr<std::string> version = PingAndGetVersion(host_, port_, password_);
    if (version.ok()) {
      version_ = *version;
      return absl::OkStatus();
    }
    last_error = version.status();
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Alive but not answering in time: give up.
  return absl::DeadlineExceededError(absl::StrCat(
      "redis-server on port ", port_, " did not answer within ", absl::FormatDuration(timeout),
      ": ", last_error.message(), "; log:\n", ReadLog()));
}

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(Options options) {
  std::unique_ptr<RedisServer> server(new RedisServer());
  server->password_ = options.password.empty() ? RandomPassword() : options.password;
  char directory_template[] = "/tmp/varipipe-redis-XXXXXX";
  if (mkdtemp(directory_template) == nullptr) return ErrnoToStatus(errno, "mkdtemp");
  server->directory_ = directory_template;

  // A port picked now may be taken before redis binds it; retry a few times.
  absl::Status last_error;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (options.port != 0) {
      server->port_ = options.port;
    } else {
      VP_ASSIGN_OR_RETURN(server->port_, PickFreeLoopbackPort());
    }
    const std::string log_file = server->directory_ + "/redis.log";
    std::filesystem::remove(log_file);
    const std::string config =
        absl::StrCat("port ", server->port_, "\nbind ", server->host_, "\nrequirepass ",
                     ConfigString(server->password_), "\nsave \"\"\nappendonly no\ndir ",
                     ConfigString(server->directory_), "\nlogfile ", ConfigString(log_file),
                     "\ndaemonize no\nprotected-mode yes\n");
    const std::string binary = RedisServerBinary();
    VP_ASSIGN_OR_RETURN(server->pid_, SpawnWithConfig(binary, config));
    last_error = server->WaitUntilAnswering(options.startup_timeout, binary);
    if (last_error.ok()) return server;
    if (absl::IsDeadlineExceeded(last_error)) return last_error;
    if (options.port != 0 || !absl::StrContains(last_error.message(), "Address already in use")) {
      break;
    }
  }
  return last_error;
}

RedisServer::~RedisServer() {
  (void)Stop();
  if (!directory_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }
}

std::string RedisServer::address() const { return absl::StrCat(host_, ":", port_); }

std::string RedisServer::ReadLog() const {
  absl::StatusOr<std::string> log = ReadFileToString(directory_ + "/redis.log");
  return log.ok() ? *log : std::string("(no log)");
}

absl::Status RedisServer::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  const pid_t pid = pid_;
  pid_ = -1;
  kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  int wait_status = 0;
  while (absl::Now() < deadline) {
    const pid_t done = waitpid(pid, &wait_status, WNOHANG);
    if (done == pid) {
      if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return absl::OkStatus();
      return absl::InternalError(
          absl::StrCat("redis-server exited with wait status ", wait_status));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &wait_status, 0);
  return absl::DeadlineExceededError("redis-server ignored SIGTERM for 5 s and was killed");
}

}  // namespace varipipe
