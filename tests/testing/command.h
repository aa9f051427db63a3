// Running the project's binaries from tests: a shell command with stdout and
// stderr captured together, and paths of the built binaries and example
// configs (VARIPIPE_BINARY_DIR / VARIPIPE_SOURCE_DIR come from CMake).
#ifndef VARIPIPE_TESTS_TESTING_COMMAND_H_
#define VARIPIPE_TESTS_TESTING_COMMAND_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace varipipe::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr together
};

inline CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

inline std::string Bin(const std::string& name) {
  return absl::StrCat(VARIPIPE_BINARY_DIR, "/bin/", name);
}

inline std::string Config(const std::string& name) {
  return absl::StrCat(VARIPIPE_SOURCE_DIR, "/deploy/configs/", name);
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_COMMAND_H_
