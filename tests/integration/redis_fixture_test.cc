// The Redis test fixture against a real redis-server: SET/GET through hiredis
// with the fixture's password, and the password is enforced.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hiredis/hiredis.h"
#include "tests/testing/redis_server.h"

namespace varipipe::testing {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
using Context = std::unique_ptr<redisContext, ContextDeleter>;

class RedisFixtureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server).release();
    std::printf("redis-server %s on %s (pid %d)\n", server_->version().c_str(),
                server_->address().c_str(), server_->pid());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  static Context Connect() {
    Context context(redisConnect(server_->host().c_str(), server_->port()));
    EXPECT_NE(context, nullptr);
    EXPECT_EQ(context->err, 0) << context->errstr;
    return context;
  }
  static Reply Command(redisContext* context, const char* format, const std::string& a = "",
                       const std::string& b = "") {
    return Reply(static_cast<redisReply*>(redisCommand(context, format, a.c_str(), b.c_str())));
  }

  static RedisServer* server_;
};

RedisServer* RedisFixtureTest::server_ = nullptr;

TEST_F(RedisFixtureTest, SetThenGetThroughHiredis) {
  ASSERT_NE(server_, nullptr);
  Context context = Connect();
  Reply auth = Command(context.get(), "AUTH %s", server_->password());
  ASSERT_NE(auth, nullptr);
  ASSERT_EQ(auth->type, REDIS_REPLY_STATUS) << auth->str;
  // A binary value with a NUL byte survives the round trip.
  const std::string value("plan\0bytes", 10);
  Reply set(static_cast<redisReply*>(
      redisCommand(context.get(), "SET %s %b", "varipipe:test:key", value.data(), value.size())));
  ASSERT_NE(set, nullptr);
  EXPECT_EQ(std::string(set->str, set->len), "OK");
  Reply get = Command(context.get(), "GET %s", "varipipe:test:key");
  ASSERT_NE(get, nullptr);
  ASSERT_EQ(get->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(get->str, get->len), value);
  Reply missing = Command(context.get(), "GET %s", "varipipe:test:missing");
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ(missing->type, REDIS_REPLY_NIL);
}

TEST_F(RedisFixtureTest, CommandsWithoutPasswordAreRefused) {
  ASSERT_NE(server_, nullptr);
  Context context = Connect();
  Reply get = Command(context.get(), "GET %s", "varipipe:test:key");
  ASSERT_NE(get, nullptr);
  ASSERT_EQ(get->type, REDIS_REPLY_ERROR);
  EXPECT_THAT(get->str, ::testing::HasSubstr("NOAUTH"));
}

TEST_F(RedisFixtureTest, WrongPasswordIsRejected) {
  ASSERT_NE(server_, nullptr);
  Context context = Connect();
  Reply auth = Command(context.get(), "AUTH %s", "not-" + server_->password());
  ASSERT_NE(auth, nullptr);
  EXPECT_EQ(auth->type, REDIS_REPLY_ERROR);
}

TEST(RedisServer, StopsCleanlyAndFreesItsPort) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const pid_t pid = (*server)->pid();
  EXPECT_TRUE((*server)->Stop().ok());
  EXPECT_NE(kill(pid, 0), 0) << "redis-server pid " << pid << " still exists";
  Context context(redisConnect("127.0.0.1", port));
  ASSERT_NE(context, nullptr);
  EXPECT_NE(context->err, 0) << "port " << port << " still accepts connections";
}

// The password reaches redis-server on standard input: its command line,
// which every local user can read, holds no secret, not even at start-up
// (redis-server later rewrites its process title, so a wrapper records the
// arguments it was started with). A password with quotes, spaces and
// backslashes survives the config syntax.
TEST_F(RedisFixtureTest, PasswordIsNeverOnTheCommandLine) {
  ASSERT_NE(server_, nullptr);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("varipipe-redis-argv-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path wrapper = dir / "redis-server";
  std::ofstream(wrapper) << "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > '" << (dir / "argv").string()
                         << "'\nexec redis-server \"$@\"\n";
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  setenv("VARIPIPE_REDIS_SERVER", wrapper.c_str(), 1);
  absl::StatusOr<std::unique_ptr<RedisServer>> started =
      RedisServer::Start({.password = "a \"quoted\" pass\\word #1"});
  unsetenv("VARIPIPE_REDIS_SERVER");
  std::stringstream argv;
  argv << std::ifstream(dir / "argv").rdbuf();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(started.ok()) << started.status();
  const RedisServer& server = **started;
  EXPECT_THAT(argv.str(), ::testing::HasSubstr("redis-server"));
  EXPECT_EQ(argv.str().find(server.password()), std::string::npos) << argv.str();
  EXPECT_EQ(argv.str().find("requirepass"), std::string::npos) << argv.str();
  std::stringstream command_line;
  command_line << std::ifstream("/proc/" + std::to_string(server.pid()) + "/cmdline").rdbuf();
  ASSERT_FALSE(command_line.str().empty());
  EXPECT_EQ(command_line.str().find(server.password()), std::string::npos);
  Context context(redisConnect(server.host().c_str(), server.port()));
  ASSERT_NE(context, nullptr);
  Reply auth = Command(context.get(), "AUTH %s", server.password());
  ASSERT_NE(auth, nullptr);
  EXPECT_EQ(auth->type, REDIS_REPLY_STATUS) << auth->str;
}

}  // namespace
}  // namespace varipipe::testing
