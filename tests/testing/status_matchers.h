// GoogleMock matchers for absl::Status and absl::StatusOr.
//
// Abseil 20220623 (Debian 12) predates absl/status/status_matchers.h; these
// have the same meaning as absl_testing::StatusIs and IsOkAndHolds. Delete
// this file when Abseil is upgraded. Prefer checking the specific expected
// error:
//
//   EXPECT_THAT(LoadJobConfigFile(path),
//               StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.kind")));
#ifndef VARIPIPE_TESTS_TESTING_STATUS_MATCHERS_H_
#define VARIPIPE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace varipipe::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// Matches a Status or StatusOr whose code equals `code` and whose message
// matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher,
           absl::StrCat("has status code ", absl::StatusCodeToString(code))) {
  const absl::Status& status = GetStatus(arg);
  if (status.code() != code) {
    *result_listener << "whose status is " << status;
    return false;
  }
  return ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

// Matches a Status or StatusOr whose code equals `code`, any message.
MATCHER_P(StatusIs, code, absl::StrCat("has status code ", absl::StatusCodeToString(code))) {
  const absl::Status& status = GetStatus(arg);
  if (status.code() != code) *result_listener << "whose status is " << status;
  return status.code() == code;
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  if (!status.ok()) *result_listener << "whose status is " << status;
  return status.ok();
}

// Matches an OK StatusOr whose value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_STATUS_MATCHERS_H_
