// A Redis client over hiredis for the instruction store and the executors'
// rendezvous: one connection, authenticated, with reconnection and
// exponential backoff, pipelined batches, and replies owned by RAII handles.
//
//   absl::StatusOr<std::unique_ptr<RedisClient>> redis =
//       RedisClient::Connect({.host = "127.0.0.1", .port = 6379, .password = pw});
//   VP_ASSIGN_OR_RETURN(RedisReply r, (*redis)->Command({"GET", key}));
//
// Errors: a connection that cannot be (re)established within the retry
// budget is UNAVAILABLE; a rejected password PERMISSION_DENIED; a Redis error
// reply FAILED_PRECONDITION with Redis's message; a reply of an unexpected
// type INTERNAL (from the accessors).
//
// Thread safety: a client is used by one thread at a time (hiredis contexts
// are not thread-safe); give each thread its own.
#ifndef VARIPIPE_COMMON_REDIS_REDIS_CLIENT_H_
#define VARIPIPE_COMMON_REDIS_REDIS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "varipipe/v1/config.pb.h"

struct redisReply;
struct redisContext;

namespace varipipe {

// An owned hiredis reply.
class RedisReply {
 public:
  explicit RedisReply(redisReply* reply);
  ~RedisReply();
  RedisReply(RedisReply&& other) noexcept;
  RedisReply& operator=(RedisReply&& other) noexcept;
  RedisReply(const RedisReply&) = delete;
  RedisReply& operator=(const RedisReply&) = delete;

  bool is_nil() const;
  bool is_string() const;  // bulk string or status
  bool is_integer() const;
  bool is_array() const;
  std::string str() const;  // "" unless a string
  int64_t integer() const;  // 0 unless an integer
  size_t size() const;      // array elements
  // Element `i` of an array reply (a view; owned by this reply).
  const redisReply* element(size_t i) const;
  const redisReply* raw() const { return reply_; }

 private:
  redisReply* reply_;
};

// Helpers for elements of array replies.
std::string ElementString(const redisReply* element);

class RedisClient {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string password;  // empty: no AUTH
    absl::Duration connect_timeout = absl::Seconds(2);
    // Socket timeout for ordinary commands (blocking commands add their
    // own block time).
    absl::Duration command_timeout = absl::Seconds(10);
    // Reconnection attempts per command and the backoff between them
    // (doubling from initial to max).
    int max_attempts = 6;
    absl::Duration backoff_initial = absl::Milliseconds(50);
    absl::Duration backoff_max = absl::Seconds(2);
  };

  static absl::StatusOr<std::unique_ptr<RedisClient>> Connect(const Options& options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command (binary-safe arguments). Reconnects on connection
  // errors. `block` extends the socket timeout for blocking commands.
  absl::StatusOr<RedisReply> Command(const std::vector<std::string>& args,
                                     absl::Duration block = absl::ZeroDuration());
  // Sends commands in one round trip and returns their replies in order. An
  // error reply of one command is returned as that command's reply (check
  // with RedisReplyError); connection errors fail the whole batch.
  absl::StatusOr<std::vector<RedisReply>> Pipeline(
      const std::vector<std::vector<std::string>>& commands);

  const Options& options() const { return options_; }
  std::string address() const;

 private:
  explicit RedisClient(const Options& options) : options_(options) {}
  absl::Status Reconnect();
  absl::Status ConnectOnce();

  Options options_;
  redisContext* context_ = nullptr;
};

// The error carried by a reply, or OK.
absl::Status RedisReplyError(const RedisReply& reply, absl::string_view command);

// "host:port" -> (host, port).
absl::StatusOr<std::pair<std::string, int>> ParseHostPort(absl::string_view address);

// The password of a store config: the first line of password_file (relative
// paths were resolved by the config loader), else the environment variable
// password_env, else empty. Errors name the file.
absl::StatusOr<std::string> ReadRedisPassword(const v1::StoreConfig& store);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_REDIS_REDIS_CLIENT_H_
