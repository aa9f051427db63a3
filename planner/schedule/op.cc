#include "planner/schedule/op.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::planner {

std::string Op::ToString() const {
  const char* letter = kind == OpKind::kForward ? "F" : kind == OpKind::kBackward ? "B" : "W";
  return absl::StrCat(stage, letter, micro_batch);
}

absl::StatusOr<Op> ParseOp(absl::string_view text) {
  const size_t at = text.find_first_of("FBW");
  Op op;
  if (at == absl::string_view::npos || at == 0 || at + 1 == text.size() ||
      !absl::SimpleAtoi(text.substr(0, at), &op.stage) ||
      !absl::SimpleAtoi(text.substr(at + 1), &op.micro_batch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not an op (expected <stage>F<micro_batch>, ...B... or ...W...)"));
  }
  op.kind = text[at] == 'F'   ? OpKind::kForward
            : text[at] == 'B' ? OpKind::kBackward
                              : OpKind::kWeight;
  return op;
}

std::string FormatDeviceOrder(const DeviceOrder& order) {
  std::string text;
  for (size_t d = 0; d < order.size(); ++d) {
    absl::StrAppend(&text, "d", d, ":");
    for (const Op& op : order[d]) absl::StrAppend(&text, " ", op.ToString());
    absl::StrAppend(&text, "\n");
  }
  return text;
}

}  // namespace varipipe::planner
