// Status helpers shared by every Varipipe library.
//
// Debian 12 ships Abseil 20220623, which predates absl/status/status_macros.h;
// VP_RETURN_IF_ERROR and VP_ASSIGN_OR_RETURN have the same meaning as
// ABSL_RETURN_IF_ERROR and ABSL_ASSIGN_OR_RETURN. Delete them when Abseil is
// upgraded.
//
// Example:
//   absl::StatusOr<JobConfig> Load(absl::string_view path) {
//     VP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
//     VP_RETURN_IF_ERROR(CheckNotEmpty(text, path));
//     return ParseJobConfigJson(text, path);
//   }
#ifndef VARIPIPE_COMMON_STATUS_H_
#define VARIPIPE_COMMON_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define VP_RETURN_IF_ERROR(expr)                                \
  do {                                                          \
    if (::absl::Status _vp_status = (expr); !_vp_status.ok()) { \
      return _vp_status;                                        \
    }                                                           \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise move-assigns its value to `lhs`, which
// may be a declaration (`VP_ASSIGN_OR_RETURN(auto x, F())`).
#define VP_ASSIGN_OR_RETURN(lhs, rexpr) \
  VP_ASSIGN_OR_RETURN_IMPL_(VP_STATUS_CONCAT_(_vp_statusor_, __LINE__), lhs, rexpr)

#define VP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) {                                 \
    return std::move(statusor).status();                \
  }                                                     \
  lhs = std::move(statusor).value()

#define VP_STATUS_CONCAT_INNER_(a, b) a##b
#define VP_STATUS_CONCAT_(a, b) VP_STATUS_CONCAT_INNER_(a, b)

namespace varipipe {

// Returns `status` with "`context`: " prepended to its message; OK stays OK.
// Payloads are kept.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// The status for a failed system call: `what` names the operation and the
// object ("open /data/x.idx"), errno picks the code (ENOENT -> NOT_FOUND,
// EACCES -> PERMISSION_DENIED, ...).
absl::Status ErrnoToStatus(int error_number, absl::string_view what);

// Reads a whole file. Errors name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_STATUS_H_
