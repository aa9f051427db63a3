// Files that hold secrets (a Redis password, a job token): created private
// from the start, never readable by others even for a moment, and complete or
// absent. WriteSecretFile writes a temporary file in the same directory
// (mkstemp: O_CREAT | O_EXCL, mode 0600), syncs it and renames it over
// `path`. Readers of a secret file may refuse one that other users can read.
//
//   VP_RETURN_IF_ERROR(WriteSecretFile("/run/job/store", "127.0.0.1:6379 pw\n"));
#ifndef VARIPIPE_COMMON_SECRET_FILE_H_
#define VARIPIPE_COMMON_SECRET_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varipipe {

// Atomically replaces `path` by a mode-0600 file holding `contents`. Errors
// name the file.
absl::Status WriteSecretFile(const std::string& path, absl::string_view contents);

// The first line of a secret file, without surrounding white space.
// INVALID_ARGUMENT when the file is empty or other users may read it (any
// "other" permission bit); errors name the file and, for `flag`, the flag
// that named it ("--token_file").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_SECRET_FILE_H_
