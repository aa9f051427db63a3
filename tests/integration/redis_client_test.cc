// The Redis client against a real redis-server: authentication, binary
// values, pipelines, error replies, and reconnection after a restart.
#include "common/redis/redis_client.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

TEST(RedisClient, CommandsPipelinesAndErrors) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
  ASSERT_THAT(server, IsOk());
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
      {.host = (*server)->host(), .port = (*server)->port(), .password = (*server)->password()});
  ASSERT_THAT(client, IsOk());
  const std::string value("a\0b", 3);
  ASSERT_THAT((*client)->Command({"SET", "k", value}), IsOk());
  absl::StatusOr<RedisReply> got = (*client)->Command({"GET", "k"});
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->str(), value);
  absl::StatusOr<std::vector<RedisReply>> replies =
      (*client)->Pipeline({{"INCR", "n"}, {"INCR", "n"}, {"LPUSH", "k", "x"}, {"GET", "n"}});
  ASSERT_THAT(replies, IsOk());
  ASSERT_EQ(replies->size(), 4u);
  EXPECT_EQ((*replies)[1].integer(), 2);
  EXPECT_THAT(RedisReplyError((*replies)[2], "LPUSH"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("WRONGTYPE")));
  EXPECT_EQ((*replies)[3].str(), "2");
}

TEST(RedisClient, WrongPasswordIsPermissionDenied) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
  ASSERT_THAT(server, IsOk());
  EXPECT_THAT(RedisClient::Connect(
                  {.host = (*server)->host(), .port = (*server)->port(), .password = "wrong"}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("rejected the password")));
}

TEST(RedisClient, ReconnectsAfterARestart) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  const std::string password = (*server)->password();
  absl::StatusOr<std::unique_ptr<RedisClient>> client =
      RedisClient::Connect({.host = "127.0.0.1", .port = port, .password = password});
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Command({"SET", "k", "1"}), IsOk());
  ASSERT_THAT((*server)->Stop(), IsOk());
  server->reset();
  absl::StatusOr<std::unique_ptr<RedisServer>> again =
      RedisServer::Start({.password = password, .port = port});
  ASSERT_THAT(again, IsOk());
  // No persistence: the key is gone, but the client reconnects by itself.
  absl::StatusOr<RedisReply> got = (*client)->Command({"GET", "k"});
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE(got->is_nil());
}

TEST(RedisClient, UnreachableServerIsUnavailable) {
  absl::StatusOr<int> port = PickFreeLoopbackPort();
  ASSERT_THAT(port, IsOk());
  RedisClient::Options options;
  options.port = *port;
  options.max_attempts = 2;
  EXPECT_THAT(RedisClient::Connect(options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("Redis 127.0.0.1:")));
}

TEST(RedisPassword, FromFileOrEnvironment) {
  v1::StoreConfig store;
  store.set_password_env("VARIPIPE_TEST_REDIS_PASSWORD");
  setenv("VARIPIPE_TEST_REDIS_PASSWORD", "from-env", 1);
  EXPECT_THAT(ReadRedisPassword(store), ::varipipe::testing::IsOkAndHolds(std::string("from-env")));
  store.set_password_file("/nonexistent/varipipe/password");
  EXPECT_THAT(ReadRedisPassword(store),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("store.password_file: open /nonexistent/varipipe/password")));
  const std::string empty = ::testing::TempDir() + "/varipipe-empty-password";
  std::ofstream(empty) << "\n";
  store.set_password_file(empty);
  EXPECT_THAT(ReadRedisPassword(store),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("store.password_file: ", empty, ": "))));
  std::remove(empty.c_str());
}

}  // namespace
}  // namespace varipipe
