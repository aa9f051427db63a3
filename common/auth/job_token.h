// A job's secret token: the credential every client of the job's gRPC
// services presents (docs/security.md). The first planner daemon to register
// the job generates it (or takes it from --token_file) and keeps it in the
// instruction store; daemons started with --store_file FILE also write it to
// FILE.token (mode 0600), where local executors and varipipe-ctl find it.
#ifndef VARIPIPE_COMMON_AUTH_JOB_TOKEN_H_
#define VARIPIPE_COMMON_AUTH_JOB_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varipipe {

// 64 hex characters from the kernel's random source (getrandom).
absl::StatusOr<std::string> GenerateJobToken();

// The Redis key of a job's token in its instruction store
// ("<key_prefix>:<job_id>:token"; docs/instruction-store.md), where clients
// that hold the store's password read it.
std::string JobTokenKey(absl::string_view key_prefix, absl::string_view job_id);

// The token file written beside a daemon's --store_file: "FILE.token".
std::string TokenFileBeside(absl::string_view store_file);

// OK for a plausible token (16 to 1024 printable ASCII characters without
// white space); INVALID_ARGUMENT naming `source` otherwise.
absl::Status CheckJobToken(absl::string_view token, absl::string_view source);

// The token a client uses: --token_file when given, else the file beside
// --store_file when given, else "" (no token). Errors name the file and flag.
absl::StatusOr<std::string> ClientJobToken(const std::string& token_file,
                                           const std::string& store_file);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_AUTH_JOB_TOKEN_H_
