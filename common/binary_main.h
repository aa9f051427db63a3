// Start-up shared by every Varipipe binary: usage text, flag parsing (with
// --help, --helpfull and --version from Abseil), and logging.
//
//   int main(int argc, char** argv) {
//     std::vector<std::string> args = varipipe::InitBinary(
//         argc, argv, "varipipe-plan", "Plans mini-batches.\n\nUsage: ...");
//     ...
//   }
//
// Unknown flags and bad flag values end the program with a message naming
// the flag (Abseil's behaviour); a bad --log_level ends it with exit code 2.
// Flag names may be spelled with dashes (--emit-plans) or underscores
// (--emit_plans).
#ifndef VARIPIPE_COMMON_BINARY_MAIN_H_
#define VARIPIPE_COMMON_BINARY_MAIN_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace varipipe {

// Parses flags and sets up logging. Returns the positional arguments (without
// argv[0]).
std::vector<std::string> InitBinary(int argc, char** argv, absl::string_view program,
                                    absl::string_view usage);

// Exit codes shared by the binaries.
inline constexpr int kExitOk = 0;
// Something failed while running (I/O, planning, a peer). Abseil also exits
// with 1 for unknown flags and unparsable flag values.
inline constexpr int kExitFailure = 1;
// The command line or the configuration (including a missing or unreadable
// config file) is wrong.
inline constexpr int kExitUsage = 2;

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_BINARY_MAIN_H_
