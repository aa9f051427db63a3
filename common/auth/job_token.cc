#include "common/auth/job_token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/secret_file.h"
#include "common/status.h"

namespace varipipe {

absl::StatusOr<std::string> GenerateJobToken() {
  uint8_t bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "getrandom for the job token");
    filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string TokenFileBeside(absl::string_view store_file) {
  return absl::StrCat(store_file, ".token");
}

absl::Status CheckJobToken(absl::string_view token, absl::string_view source) {
  if (token.size() < 16 || token.size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": a job token has 16 to 1024 characters (this one has ", token.size(), ")"));
  }
  for (const char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": a job token is printable ASCII without white space"));
    }
  }
  return absl::OkStatus();
}

std::string JobTokenKey(absl::string_view key_prefix, absl::string_view job_id) {
  return absl::StrCat(key_prefix, ":", job_id, ":token");
}

absl::StatusOr<std::string> ClientJobToken(const std::string& token_file,
                                           const std::string& store_file) {
  if (!token_file.empty()) {
    VP_ASSIGN_OR_RETURN(std::string token, ReadSecretFile(token_file, "--token_file"));
    VP_RETURN_IF_ERROR(CheckJobToken(token, absl::StrCat("--token_file ", token_file)));
    return token;
  }
  if (!store_file.empty()) {
    const std::string beside = TokenFileBeside(store_file);
    VP_ASSIGN_OR_RETURN(std::string token,
                        ReadSecretFile(beside, "the token file beside --store_file"));
    VP_RETURN_IF_ERROR(CheckJobToken(token, beside));
    return token;
  }
  return std::string();
}

}  // namespace varipipe
