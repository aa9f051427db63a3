// A fresh directory for the running test: under the system's temporary
// directory, named by `prefix`, the process id and the test's name, so
// parallel tests and repeated runs never share one.
#ifndef VARIPIPE_TESTS_TESTING_TEST_DIRECTORY_H_
#define VARIPIPE_TESTS_TESTING_TEST_DIRECTORY_H_

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace varipipe::testing {

// Removes what an earlier run with the same name left and creates it anew.
inline std::filesystem::path PerTestDirectory(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat(prefix, "-", getpid(), "-",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_TEST_DIRECTORY_H_
