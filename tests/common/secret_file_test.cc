// Secret files: created 0600 from the start and replaced atomically; readers
// refuse files other users can read.
#include "common/secret_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/auth/job_token.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("varipipe-secret-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static unsigned Mode(const fs::path& path) {
    struct stat info {};
    EXPECT_EQ(stat(path.c_str(), &info), 0) << path;
    return info.st_mode & 07777;
  }
  fs::path dir_;
};

TEST_F(SecretFileTest, ReplacesAPublicFileWithAPrivateOne) {
  const fs::path path = dir_ / "store";
  std::ofstream(path) << "old contents\n";
  fs::permissions(path, fs::perms::all);
  const mode_t old_umask = umask(0);  // the mode must not depend on the umask
  EXPECT_THAT(WriteSecretFile(path.string(), "127.0.0.1:6379 secret\n"), IsOk());
  umask(old_umask);
  EXPECT_EQ(Mode(path), 0600u);
  EXPECT_THAT(ReadSecretFile(path.string(), "--store_file"), IsOk());
  EXPECT_EQ(*ReadSecretFile(path.string(), ""), "127.0.0.1:6379 secret");
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1) << "no temporary file is left";
}

TEST_F(SecretFileTest, ReadRefusesPublicEmptyAndMissingFiles) {
  const fs::path path = dir_ / "token";
  std::ofstream(path) << "token-0123456789abcdef\n";
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  EXPECT_THAT(ReadSecretFile(path.string(), "--token_file"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--token_file " + path.string() + ": other users may read")));
  std::ofstream(path, std::ios::trunc) << "\n";
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_THAT(ReadSecretFile(path.string(), "--token_file"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(ReadSecretFile((dir_ / "missing").string(), "--token_file"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  EXPECT_THAT(WriteSecretFile((dir_ / "no-such-dir" / "f").string(), "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-dir")));
}

TEST_F(SecretFileTest, JobTokensAreRandomAndClientsFindThemBesideTheStoreFile) {
  absl::StatusOr<std::string> a = GenerateJobToken();
  absl::StatusOr<std::string> b = GenerateJobToken();
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  EXPECT_THAT(CheckJobToken(*a, "generated"), IsOk());
  EXPECT_THAT(CheckJobToken("short", "--token_file t"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--token_file t")));
  const fs::path store = dir_ / "store";
  EXPECT_EQ(TokenFileBeside(store.string()), store.string() + ".token");
  ASSERT_THAT(WriteSecretFile(TokenFileBeside(store.string()), *a + "\n"), IsOk());
  EXPECT_EQ(*ClientJobToken("", store.string()), *a);
  ASSERT_THAT(WriteSecretFile((dir_ / "explicit").string(), *b + "\n"), IsOk());
  EXPECT_EQ(*ClientJobToken((dir_ / "explicit").string(), store.string()), *b);
  EXPECT_EQ(*ClientJobToken("", ""), "");
}

}  // namespace
}  // namespace varipipe
