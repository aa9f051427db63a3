#include "common/status.h"

#include <cerrno>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOkAndHolds;
using ::varipipe::testing::StatusIs;

absl::Status FailIf(bool fail) { return fail ? absl::NotFoundError("missing") : absl::OkStatus(); }

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status ReturnIfError(bool fail, int* reached) {
  VP_RETURN_IF_ERROR(FailIf(fail));
  *reached = 1;
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  VP_ASSIGN_OR_RETURN(int half, Half(x));
  VP_ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

TEST(StatusMacros, ReturnIfErrorStopsAtTheFirstError) {
  int reached = 0;
  EXPECT_THAT(ReturnIfError(true, &reached), StatusIs(absl::StatusCode::kNotFound, "missing"));
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(ReturnIfError(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacros, AssignOrReturnPropagatesErrorsAndValues) {
  EXPECT_THAT(Quarter(12), IsOkAndHolds(3));
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_THAT(Quarter(7), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
}

TEST(Annotate, PrependsContextAndKeepsCodeAndPayload) {
  absl::Status status = absl::UnavailableError("connection refused");
  status.SetPayload("varipipe/rank", absl::Cord("3"));
  const absl::Status annotated = Annotate(status, "redis 127.0.0.1:6379");
  EXPECT_THAT(annotated,
              StatusIs(absl::StatusCode::kUnavailable, "redis 127.0.0.1:6379: connection refused"));
  ASSERT_TRUE(annotated.GetPayload("varipipe/rank").has_value());
  EXPECT_EQ(*annotated.GetPayload("varipipe/rank"), "3");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ignored").ok());
}

TEST(ErrnoToStatus, MapsCommonErrors) {
  EXPECT_THAT(ErrnoToStatus(ENOENT, "open x.idx"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("open x.idx: ")));
  EXPECT_EQ(ErrnoToStatus(EACCES, "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ECONNREFUSED, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "x").code(), absl::StatusCode::kResourceExhausted);
}

TEST(ReadFileToString, NamesTheMissingFile) {
  EXPECT_THAT(ReadFileToString("/nonexistent/varipipe/file.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/varipipe/file.json")));
}

}  // namespace
}  // namespace varipipe
