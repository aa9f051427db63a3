#include "common/binary_main.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/version.h"

namespace varipipe {
namespace {

// Abseil's --help lists flags but exits with status 1; users and scripts
// expect 0. This prints the usage and the project's own flags (not Abseil's
// internals) and exits 0. --helpfull still shows everything.
[[noreturn]] void PrintHelpAndExit(absl::string_view usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "absl/")) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string text = absl::StrCat(usage, "\n\nFlags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&text, "  --", flag->Name(), "  ", flag->Help(), "\n      default: ",
                    flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(), "\n");
  }
  absl::StrAppend(&text,
                  "  --help  Show this help and exit.\n"
                  "  --helpfull  Show every flag, Abseil's included.\n"
                  "  --version  Show the version and exit.\n");
  std::fputs(text.c_str(), stdout);
  std::exit(kExitOk);
}

}  // namespace

std::vector<std::string> InitBinary(int argc, char** argv, absl::string_view program,
                                    absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  const std::string version = absl::StrCat(program, " ", kVersion, "\n");
  config.version_string = [version] { return version; };
  // --help lists the flags of the project's own sources, not Abseil's.
  config.contains_help_flags = [](absl::string_view path) {
    return !absl::StrContains(path, "absl/");
  };
  absl::SetFlagsUsageConfig(config);

  // Accept --flag-name as well as --flag_name (Abseil knows only the
  // latter): rewrite dashes in the name part of every long flag.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strncmp(argv[i], "--", 2) != 0) continue;
    for (char* c = argv[i] + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-help") == 0 ||
        std::strcmp(argv[i], "-h") == 0) {
      PrintHelpAndExit(usage);
    }
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (absl::Status status = InitLogging(program); !status.ok()) {
    std::fprintf(stderr, "%s: %s\n", std::string(program).c_str(),
                 std::string(status.message()).c_str());
    std::exit(kExitUsage);
  }
  return std::vector<std::string>(positional.begin() + 1, positional.end());
}

}  // namespace varipipe
